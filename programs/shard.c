/* shard.c - `engram shard`: row-block shard files of a V4.1 model (issue
 * #24, docs/shards.md), and the check that a set of them belongs together. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const char *shard_help =
    "usage: engram shard MODEL --ranks N --out DIR [--force]\n"
    "       engram shard --check FILE...\n"
    "Writes N row-block shard files of a V4.1 model, DIR/NAME.shard-R-of-N.gguf\n"
    "(NAME: MODEL's file name less .gguf), R = 0 .. N-1.  Shard R holds every key\n"
    "and weight of the model and, of each table of T rows, rows [floor(R T / N),\n"
    "floor((R + 1) T / N)) only: the block a pool opened with shard_rank R and\n"
    "shard_world N reads.  Its keys deepseek41.engram.shard.* say so (rank, world,\n"
    "first_row, total_rows and model_id, the model's identity; docs/shards.md).\n"
    "The set is written whole or not at all: every shard first as NAME.new (itself\n"
    "all or nothing), renamed into place once all N are written; if one fails, the\n"
    "new files are removed and an earlier set is left as it was.  DIR is created if\n"
    "missing; an existing shard file is replaced only with --force.  Rows are\n"
    "copied with plain reads, 4.3 MB at a time.\n"
    "--check opens every FILE and exits 0 if they are one whole set: shards of the\n"
    "same model and world, every rank once, blocks that tile each table; else\n"
    "exits 1 naming the file and why (another model, another world, a rank twice,\n"
    "a rank missing, blocks that overlap or leave a gap).\n";

static void shard_progress(void *ctx, uint64_t done, uint64_t total)
{
    double *t0 = ctx;
    progress_bar(0, done, total, *t0);
}

static int shard_check(int n, char **files)
{
    engram_shard_info *sh = calloc((size_t)n, sizeof *sh);
    if (!sh)
        return fail_oom("shard --check", (size_t)n * sizeof *sh);
    int st = 0;
    for (int i = 0; i < n && !st; i++) {
        engram_model *m;
        if ((st = open_model_any(files[i], &m)) != 0)
            break;
        engram_model_info in;
        engram_model_get_info(m, &in);
        sh[i] = in.shard;
        engram_model_close(m);
    }
    if (!st) {
        engram_error err = {0};
        int rc = engram_shard_set_check(sh, (size_t)n, (const char *const *)files, &err);
        if (rc < 0)
            st = fail_lib(rc, &err, "shard --check");
        else
            printf("ok: %d shards of model %s, world %u: every rank once, tables of %" PRIu64 " and %" PRIu64
                   " rows tiled\n", n, sh[0].model_id, sh[0].world, sh[0].total_rows[0], sh[0].total_rows[1]);
    }
    free(sh);
    return st;
}

/* DIR/NAME.shard-R-of-N.gguf; NULL when it does not fit. */
static char *shard_path(const char *dir, const char *model, unsigned r, unsigned n)
{
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    size_t len = strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".gguf"))
        len -= 5;
    size_t cap = strlen(dir) + len + 64;
    char *p = malloc(cap);
    if (p)
        snprintf(p, cap, "%s/%.*s.shard-%u-of-%u.gguf", dir, (int)len, base, r, n);
    return p;
}

int cmd_shard(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(shard_help, stdout);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--check")) {
        if (argc < 3)
            return fail_usage("shard: --check needs one or more FILEs");
        return shard_check(argc - 2, argv + 2);
    }
    const char *model = NULL, *dir = NULL;
    uint64_t ranks = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--ranks")) {
            if (i + 1 >= argc || parse_u64(argv[i + 1], 65536, &ranks) < 0 || ranks == 0)
                return fail_usage("shard: --ranks takes 1..65536");
            i++;
        } else if (!strcmp(a, "--out")) {
            if (i + 1 >= argc)
                return fail_usage("shard: --out needs a DIR");
            dir = argv[++i];
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "--check")) {
            return fail_usage("shard: --check comes first: engram shard --check FILE...");
        } else if (a[0] == '-' && a[1]) {
            return fail_usage("shard: unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return fail_usage("shard: more than one MODEL");
        }
    }
    if (!model || !ranks || !dir)
        return fail_usage("shard: MODEL, --ranks N and --out DIR are required");
    unsigned n = (unsigned)ranks;
    struct stat st;
    if (stat(dir, &st) < 0) {
        if (errno != ENOENT || mkdir(dir, 0777) < 0) {
            fprintf(stderr, "%s: shard: --out '%s': %s\n", prog, dir, strerror(errno));
            return EXIT_SYSTEM;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        return fail_usage("shard: --out '%s' is not a directory", dir);
    }
    char **paths = calloc(n, sizeof *paths);
    if (!paths)
        return fail_oom("shard: the output names", n * sizeof *paths);
    int rc = 0;
    /* every name checked before anything is read or written */
    for (unsigned r = 0; r < n && !rc; r++) {
        if (!(paths[r] = shard_path(dir, model, r, n))) {
            rc = fail_oom("shard: an output name", 0);
            break;
        }
        if (!force && lstat(paths[r], &st) == 0) {
            fprintf(stderr, "%s: shard: '%s' exists (--force replaces it)\n", prog, paths[r]);
            rc = EXIT_USAGE;
        } else if (engram_output_same(paths[r], model)) {
            rc = fail_usage("shard: '%s' is MODEL itself", paths[r]);
        } else {
            rc = fout_check(paths[r], ENGRAM_OUTPUT_SEEKABLE);
        }
    }
    char id[ENGRAM_SHARD_ID_HEX + 1];
    engram_error err = {0};
    if (!rc) {
        int lrc = engram_model_identity(model, id, &err);
        if (lrc < 0)
            rc = fail_lib(lrc, &err, model);
    }
    double t0 = now_s();
    engram_shard_write_opts o = {isatty(2) ? shard_progress : NULL, &t0};
    /* Two phases, so that a set is whole or as it was: every shard is
     * written (itself all or nothing) under NAME.new beside its final name,
     * and only when all N are there are they renamed into place; a failure
     * removes the .new files and leaves any previous set untouched. */
    char(*tmp)[PATH_MAX + 8] = calloc(n, sizeof *tmp);
    if (!tmp && !rc)
        rc = fail_oom("shard: the temporary names", (uint64_t)n * sizeof *tmp);
    for (unsigned r = 0; r < n && !rc; r++)
        if ((size_t)snprintf(tmp[r], sizeof tmp[r], "%s.new", paths[r]) >= sizeof tmp[r])
            rc = fail_usage("shard: '%s': name too long", paths[r]);
    unsigned written = 0;
    for (unsigned r = 0; r < n && !rc; r++) {
        int lrc = engram_shard_write(model, id, r, n, tmp[r], &o, &err);
        if (o.progress)
            fputc('\n', stderr);
        if (lrc < 0) {
            rc = fail_lib(lrc, &err, paths[r]);
            break;
        }
        written++;
        engram_model *m;
        if (engram_model_open(tmp[r], &m, &err) == 0) {
            engram_model_info in;
            engram_model_get_info(m, &in);
            printf("wrote %s: rank %u of %u, table 0 rows [%" PRIu64 ", %" PRIu64 "), table 1 rows [%" PRIu64
                   ", %" PRIu64 "), %" PRIu64 " bytes\n",
                   tmp[r], r, n, in.shard.first_row[0], in.shard.first_row[0] + in.shard.rows[0],
                   in.shard.first_row[1], in.shard.first_row[1] + in.shard.rows[1], in.file_bytes);
            engram_model_close(m);
        } else {
            rc = fail_lib(err.code, &err, paths[r]);
        }
    }
    if (rc && written) { /* the new set is not published; a previous one is untouched */
        for (unsigned r = 0; r < written; r++)
            unlink(tmp[r]);
        fprintf(stderr, "%s: shard: removed the %u shard file%s written before the failure (any earlier set "
                "is as it was)\n", prog, written, written == 1 ? "" : "s");
    }
    for (unsigned r = 0; r < n && !rc; r++) {
        if (rename(tmp[r], paths[r]) < 0) {
            int e = errno;
            fprintf(stderr, "%s: shard: renaming '%s' to '%s': %s (shards 0..%u are in place, the rest are "
                    "still *.new)\n", prog, tmp[r], paths[r], strerror(e), r ? r - 1 : 0);
            rc = EXIT_SYSTEM;
        }
    }
    if (!rc)
        engram_sync_dir_of(paths[0]);
    free(tmp);
    if (!rc)
        printf("model %s: %u shards in %s (%.2f s)\n", id, n, dir, now_s() - t0);
    for (unsigned r = 0; r < n; r++)
        free(paths[r]);
    free(paths);
    return rc;
}
