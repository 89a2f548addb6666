#!/bin/sh
# test_abi3.sh - one build for every Python >= 3.8: the module built by
# `make python` against Debian's Python 3.11 headers (limited API 3.8) is
# imported by every other CPython 3.8+ found on the machine (pyenv's, or
# those named in $PYTHONS), which run tests/abi3_probe.py (no NumPy: the
# buffer protocol of array.array and memoryview) and must print what
# /usr/bin/python3 prints.  Where no other interpreter is installed (a
# fresh CI machine) only Debian's runs, and the test says so.
# Usage: tests/test_abi3.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
tmpdir abi3
"$BUILD/engram" build "$T/m.gguf" --base 2000 --width 64 --fill normal --seed 5 >/dev/null || bad "build"
probe() { PYTHONPATH="$BUILD/python" "$1" tests/abi3_probe.py "$T/m.gguf" 2>&1; }
want=$(probe /usr/bin/python3)
case "$want" in *" "*" "*) ok ;; *) bad "/usr/bin/python3: $want" ;; esac
others=0
for py in ${PYTHONS:-} "$HOME"/.pyenv/versions/*/bin/python3; do
    [ -x "$py" ] || continue
    v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
    case "$v" in 2.*|3.[0-7]) continue ;; esac
    got=$(probe "$py")
    if [ "$got" = "$want" ]; then ok; else bad "Python $v ($py): '$got', /usr/bin/python3: '$want'"; fi
    others=$((others + 1))
    echo "Python $v: $got"
done
echo "interpreters besides /usr/bin/python3: $others"
finish test_abi3
