#!/bin/sh
# test_pip.sh - `pip install ./python` as a user without network would run
# it: builds the wheel with Debian's setuptools (--no-build-isolation),
# checks that it is one abi3 wheel (cp38-abi3: every Python >= 3.8), that
# libengram is linked in statically (the module needs liburing and libc
# only, and exports nothing but PyInit__engram), installs it into a private
# directory and imports it from there, away from the source tree.
# Usage: tests/test_pip.sh
set -u
. "$(dirname "$0")/lib.sh"
PY=${PY:-/usr/bin/python3}
tmpdir pip
ROOT=$(pwd)
VERSION=$(sed -n 's/^#define ENGRAM_VERSION "\(.*\)"/\1/p' include/engram.h)

# setuptools reuses a module it built before if the sources are older: start clean
rm -rf build/pip/setuptools
if "$PY" -m pip wheel --no-build-isolation --no-deps -q -w "$T/whl" ./python >"$T/log" 2>&1; then ok; else
    bad "pip wheel ./python"; tail -20 "$T/log" >&2; fi
set -- "$T"/whl/*.whl
if [ $# -eq 1 ] && [ -f "$1" ]; then ok; else bad "one wheel: $*"; fi
case "$(basename "$1")" in
    engram-"$VERSION"-cp38-abi3-linux_*.whl) ok ;;
    *) bad "wheel name $(basename "$1"): engram-$VERSION-cp38-abi3-linux_*.whl wanted" ;;
esac
if "$PY" -m pip install --no-build-isolation --no-deps -q --target "$T/site" "$1" >"$T/log" 2>&1; then ok; else
    bad "pip install the wheel"; tail -20 "$T/log" >&2; fi
SO="$T/site/engram/_engram.abi3.so"
if [ -f "$SO" ]; then ok; else bad "$SO missing"; fi
# static: no libengram at run time; liburing, libc, libm only
deps=$(ldd "$SO" 2>/dev/null | awk '/=>/ {print $1}' | sort | tr '\n' ' ')
case "$deps" in *libengram*) bad "links libengram dynamically: $deps" ;; *) ok ;; esac
case "$deps" in *liburing*) ok ;; *) bad "liburing not among the module's libraries: $deps" ;; esac
for d in $deps; do
    case "$d" in liburing.so.*|libc.so.*|libm.so.*|libpthread.so.*|libgcc_s.so.*) ;;
        *) bad "unexpected run-time dependency $d" ;; esac
done
exported=$(nm -D --defined-only "$SO" | awk '$2 == "T" {print $3}' | tr '\n' ' ')
if [ "$exported" = "PyInit__engram " ]; then ok; else bad "exported functions: $exported"; fi
# imported from the install, not from the tree, and working
cd "$T" || exit 1
out=$(PYTHONPATH="$T/site" "$PY" -c "
import engram, os
assert engram.__file__.startswith('$T/site/'), engram.__file__
print(engram.version(), engram.__version__, os.path.basename(engram._engram.__file__))
" 2>&1)
if [ "$out" = "$VERSION $VERSION _engram.abi3.so" ]; then ok; else bad "import from the install: $out"; fi
cd "$ROOT" || exit 1
finish test_pip
