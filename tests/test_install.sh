#!/bin/sh
# test_install.sh BUILD - the library split as an engine sees it: `make
# install` into a temporary prefix, then programs built only from the
# installed headers through pkg-config (engram for the runtime, engram-tools
# for the model tools), dynamically and statically, run against a model the
# tools write.  The runtime library must not need jansson or utf8proc; the
# shared libraries export only engram_* symbols.  Outside the default prefix
# (and with DESTDIR) install runs no ldconfig and prints one line saying how
# to tell the runtime linker; following it (an rpath from pkg-config) works.
# Nothing is installed into /usr/local.
set -eu
B=${1:-build}
cd "$(dirname "$0")/.."
. tests/lib.sh
tmpdir install
fail() { echo "FAIL: $*" >&2; exit 1; }

# A stand-in ldconfig on PATH: install must not run it here.
mkdir -p "$T/bin"
printf '#!/bin/sh\necho "$*" >> "%s/ldconfig.calls"\n' "$T" > "$T/bin/ldconfig"
chmod +x "$T/bin/ldconfig"
PATH="$T/bin:$PATH" make --no-print-directory -s BUILD="$B" install PREFIX="$T/prefix" > "$T/install.out"
P="$T/prefix"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
# The hint: exactly one line, naming this prefix's lib and the rpath recipe.
hint='-Wl,-rpath,$(pkg-config --variable=libdir engram)'
[ "$(grep -c 'LD_LIBRARY_PATH' "$T/install.out")" = 1 ] || fail "install prints no (or several) hint lines: $(cat "$T/install.out")"
grep 'LD_LIBRARY_PATH' "$T/install.out" | grep -F "LD_LIBRARY_PATH=$P/lib" | grep -qF -- "$hint" ||
    fail "install's hint does not name $P/lib and the rpath: $(cat "$T/install.out")"
# The default prefix staged through DESTDIR: the same hint (for /usr/local/lib),
# files only under DESTDIR.
PATH="$T/bin:$PATH" make --no-print-directory -s BUILD="$B" install PREFIX=/usr/local DESTDIR="$T/stage" \
    > "$T/install_destdir.out"
[ -f "$T/stage/usr/local/lib/libengram.so.0" ] || fail "DESTDIR install"
[ "$(grep -c 'LD_LIBRARY_PATH' "$T/install_destdir.out")" = 1 ] &&
    grep -F "LD_LIBRARY_PATH=/usr/local/lib" "$T/install_destdir.out" | grep -qF -- "$hint" ||
    fail "DESTDIR install prints no hint: $(cat "$T/install_destdir.out")"
[ ! -e "$T/ldconfig.calls" ] || fail "install ran ldconfig outside the default prefix: $(cat "$T/ldconfig.calls")"

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
cat > "$T/version.c" <<'C'
#include <engram.h>
#include <stdio.h>
/* The library actually loaded, and the headers compiled against. */
int main(void)
{
    printf("%s %s\n", engram_version(), ENGRAM_VERSION);
    return 0;
}
C
cat > "$T/old_names.c" <<'C'
#include <engram.h>
/* The 0.1.0 getter names still build (with a deprecation warning). */
void f(engram_reader *r, engram_pool *p);
void f(engram_reader *r, engram_pool *p)
{
    engram_io_stats st;
    engram_pool_stats ps;
    engram_reader_stats(r, &st);
    engram_pool_stats_get(p, &ps);
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
# As the hint says: an rpath from pkg-config, then no LD_LIBRARY_PATH.
# shellcheck disable=SC2046
$CC -std=c11 -Wall -Werror -o "$T/version" "$T/version.c" $(pkg-config --cflags --libs engram) \
    -Wl,-rpath,"$(pkg-config --variable=libdir engram)"
v=$(env -u LD_LIBRARY_PATH "$T/version") || fail "a program linked with the hint's rpath does not run"
[ "$v" = "$(pkg-config --modversion engram) $(pkg-config --modversion engram)" ] ||
    fail "engram_version() / ENGRAM_VERSION '$v' vs pkg-config $(pkg-config --modversion engram)"
# shellcheck disable=SC2046
$CC -std=c11 -Wall -c -o "$T/old_names.o" "$T/old_names.c" $(pkg-config --cflags engram) 2> "$T/old_names.err" ||
    fail "the deprecated getter names no longer build"
[ "$(grep -c 'is deprecated' "$T/old_names.err")" = 2 ] || fail "old names without a deprecation warning: $(cat "$T/old_names.err")"
LD_LIBRARY_PATH="$P/lib" "$T/tools" "$T/m.gguf" || fail "tools program"
a=$(LD_LIBRARY_PATH="$P/lib" "$T/engine" "$T/m.gguf") || fail "engine program"
b=$("$T/engine_static" "$T/m.gguf") || fail "static engine program"
[ "$a" = "$b" ] || fail "dynamic and static runs differ: $a / $b"
# libengram-nccl (installed where nvcc was found): a program built from the
# installed header and engram-nccl.pc alone runs and says what it finds
# (NCCL loaded at run time; here a "no GPU" or "no NCCL" answer is right)
if [ -f "$P/lib/pkgconfig/engram-nccl.pc" ]; then
    cat >"$T/nccl.c" <<'CEOF'
#include <stdio.h>
#include <engram_nccl.h>
int main(void)
{
    engram_error err = {0};
    int version = 0;
    int ok = engram_nccl_available(&version, &err);
    printf("%d %s\n", ok, ok ? "NCCL loaded" : err.msg);
    return ok == 0 || ok == 1 ? 0 : 1;
}
CEOF
    # shellcheck disable=SC2046
    $CC -std=c11 -Wall -Werror -o "$T/nccl" "$T/nccl.c" $(pkg-config --cflags --libs engram-nccl) ||
        fail "a program on engram-nccl.pc does not build"
    LD_LIBRARY_PATH="$P/lib" "$T/nccl" >"$T/nccl.out" || fail "the engram-nccl program: $(cat "$T/nccl.out")"
    echo "install: engram-nccl program: $(cat "$T/nccl.out")"
fi
# The same rows through the CLI of the build under test.
c=$(echo 7 | "$B/engram" hash "$T/m.gguf" --tokens - | cut -d' ' -f1)
[ "$c" = "${a% *}" ] || fail "row id differs from engram hash: $c vs $a"
echo "install: libengram needs $(grep -o '\[.*\]' "$T/needed" | tr '\n' ' '); engine program ok ($a)"
