#!/bin/sh
# test_install.sh BUILD - the library split as an engine sees it: `make
# install` into a temporary prefix, then programs built only from the
# installed headers through pkg-config (engram for the runtime, engram-tools
# for the model tools), dynamically and statically, run against a model the
# tools write.  The runtime library must not need jansson or utf8proc; the
# shared libraries export only engram_* symbols.
set -eu
B=${1:-build}
cd "$(dirname "$0")/.."
T=$(mktemp -d "${TMPDIR:-/tmp}/engram-install-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

make --no-print-directory -s BUILD="$B" install PREFIX="$T/prefix" >/dev/null
P="$T/prefix"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"

# What each shared library needs and exports.
readelf -d "$P/lib/libengram.so.0" | grep NEEDED > "$T/needed"
grep -q 'liburing' "$T/needed" || fail "libengram.so does not need liburing?"
if grep -E 'jansson|utf8proc' "$T/needed"; then fail "libengram.so needs jansson/utf8proc"; fi
readelf -d "$P/lib/libengram-tools.so.0" | grep NEEDED > "$T/needed_tools"
grep -q 'libengram.so.0' "$T/needed_tools" || fail "libengram-tools.so does not use libengram.so"
grep -q 'jansson' "$T/needed_tools" || fail "libengram-tools.so does not need jansson"
for so in libengram.so.0 libengram-tools.so.0; do
    other=$(nm -D --defined-only "$P/lib/$so" | awk '{print $3}' | grep -v '^engram_' || true)
    [ -z "$other" ] || fail "$so exports non-engram symbols: $other"
done
# The runtime's ldd, as the issue asks.
if ldd "$P/lib/libengram.so.0" | grep -E 'jansson|utf8proc'; then fail "ldd libengram.so"; fi

[ "$(pkg-config --modversion engram)" = "$(sed -n 's/^#define ENGRAM_VERSION "\(.*\)"/\1/p' include/engram.h)" ] ||
    fail "pkg-config version"
pkg-config --libs engram | grep -q -- '-lengram' || fail "pkg-config --libs engram"
pkg-config --static --libs engram | grep -q -- '-luring' || fail "pkg-config --static --libs engram"
if pkg-config --libs --static engram | grep -E 'jansson|utf8proc'; then fail "engram.pc pulls tools deps"; fi

cat > "$T/tools.c" <<'C'
#include <engram_tools.h>
#include <stdio.h>
#include <string.h>
/* Writes a small model with the tools library. */
int main(int argc, char **argv)
{
    static uint32_t map[1000];
    engram_build_opts o;
    memset(&o, 0, sizeof o);
    o.layout.vocab = 1000;
    o.layout.compressed_vocab = 900;
    for (uint32_t i = 0; i < 1000; i++) map[i] = i % 900;
    o.layout.token_map = map;
    o.layout.pad_id = 2;
    uint32_t primes[48];
    if (engram_layout_primes(20000, 2, 4, 8, primes, 48) < 0) return 1;
    for (int t = 0; t < 2; t++) {
        if (engram_layout_multipliers(900, t ? 14 : 1, 4, o.layout.multipliers[t]) < 0) return 1;
        for (int c = 0; c < 24; c++) { o.layout.primes[t][c] = primes[t * 24 + c]; o.layout.rows[t] += primes[t * 24 + c]; }
    }
    o.fill = ENGRAM_FILL_RANDOM;
    engram_error err;
    if (engram_build_model(argv[1], &o, &err) < 0) { fprintf(stderr, "%s\n", err.msg); return 1; }
    (void)argc;
    return 0;
}
C
cat > "$T/engine.c" <<'C'
#include <engram.h>
#include <stdio.h>
/* What an engine does: open, hash a token, read its rows uncached. */
int main(int argc, char **argv)
{
    engram_model *m; engram_reader *r; engram_error err;
    if (argc < 2 || engram_model_open(argv[1], &m, &err) < 0) return 1;
    if (engram_reader_open(m, NULL, &r, &err) < 0) { fprintf(stderr, "%s\n", err.msg); return 1; }
    engram_history h; engram_history_reset(&h);
    uint32_t rows[48]; static uint16_t out[48 * 256];
    if (engram_hash_token(engram_model_hasher(m), &h, 7, 0, rows) < 0) return 1;
    if (engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err) < 0 ||
        engram_reader_step_wait(r, &err) < 0) { fprintf(stderr, "%s\n", err.msg); return 1; }
    printf("%u %u\n", rows[0], out[0]);
    engram_reader_close(r);
    engram_model_close(m);
    return 0;
}
C
CC=${CC:-cc}
# shellcheck disable=SC2046
$CC -std=c11 -Wall -Werror -o "$T/tools" "$T/tools.c" $(pkg-config --cflags --libs engram-tools)
# shellcheck disable=SC2046
$CC -std=c11 -Wall -Werror -o "$T/engine" "$T/engine.c" $(pkg-config --cflags --libs engram)
# shellcheck disable=SC2046
$CC -std=c11 -Wall -Werror -o "$T/engine_static" "$T/engine.c" $(pkg-config --cflags engram) \
    "$P/lib/libengram.a" $(pkg-config --static --libs-only-l engram | sed 's/-lengram//')
if ldd "$T/engine" | grep -E 'jansson|utf8proc'; then fail "engine program pulls tools deps"; fi
LD_LIBRARY_PATH="$P/lib" "$T/tools" "$T/m.gguf" || fail "tools program"
a=$(LD_LIBRARY_PATH="$P/lib" "$T/engine" "$T/m.gguf") || fail "engine program"
b=$("$T/engine_static" "$T/m.gguf") || fail "static engine program"
[ "$a" = "$b" ] || fail "dynamic and static runs differ: $a / $b"
# The same rows through the CLI of the build under test.
c=$(echo 7 | "$B/engram" hash "$T/m.gguf" --tokens - | cut -d' ' -f1)
[ "$c" = "${a% *}" ] || fail "row id differs from engram hash: $c vs $a"
echo "install: libengram needs $(grep -o '\[.*\]' "$T/needed" | tr '\n' ' '); engine program ok ($a)"
