#!/bin/sh
# deps.sh - makes sure what building and testing engram need is here.
# As root it installs missing Debian packages itself; otherwise it prints the
# exact apt-get line and fails.  Then it installs the pinned npm reference
# clients (tools/node/package-lock.json) used by the tests.
set -u
cd "$(dirname "$0")/.." || exit 1

need=""
want() { # want COMMAND PACKAGE...
    command -v "$1" >/dev/null 2>&1 || need="$need $2"
}
want cc gcc
want make make
want node nodejs
want npm npm
want clang clang
[ -x /usr/bin/python3 ] || need="$need python3"
# libFuzzer and the sanitizer runtimes for clang (make fuzz)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need="$need libclang-rt-14-dev"
[ -f /usr/include/stdio.h ] || need="$need libc6-dev"

if [ -n "$need" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "deps: installing$need" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq $need >/dev/null || {
            echo "deps: apt-get install$need failed" >&2; exit 1; }
    else
        echo "deps: missing packages; run:  sudo apt-get install -y$need" >&2
        exit 1
    fi
fi

if [ ! -f tools/node/node_modules/@huggingface/gguf/package.json ]; then
    echo "deps: installing the npm reference clients (tools/node)" >&2
    (cd tools/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
        echo "deps: npm ci in tools/node failed" >&2; exit 1; }
fi
exit 0
