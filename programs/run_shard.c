/*
 * run_shard.c - `engram run --shard`: the run as one of N MPI ranks.  MPI
 * comes from a plugin (engram-mpi.so, programs/mpi/run_mpi.c, built where
 * mpicc is found) loaded with dlopen only for --shard, so the command links
 * no MPI library and starts where there is none.  Looked for next to the
 * executable, then in ../lib/engram (an installed PREFIX/bin/engram), or at
 * $ENGRAM_MPI_PLUGIN.
 *
 * TP (tensor-parallel ranks: the same sessions and tokens on every rank):
 * each rank's pool reads its row block only and delivers the others as
 * zeros; a step's rows of table t are combined (the bitwise OR over the
 * ranks, libengram-mpi) as soon as this rank's reads of t are in, seen
 * between layers, and waited for at t's layer; a prefill chunk's rows at
 * the chunk's layer.  The combined rows are the one-process rows bit for
 * bit, applied the same way (engram_apply_strided), so every rank ends with
 * the one-process residuals.  DP (--dp): rank r runs sessions r, r + N, ...
 * on an unsharded pool; nothing is combined but the checksum.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_plugin.h"
#include "run.h"

/* A combine that does not complete within this (--shard-timeout SEC
 * overrides it) is a rank that died or stalled: the run fails (and ends
 * the job) rather than hang. */
#define SHARD_TIMEOUT_NS (120ull * 1000000000ull)
#define SHARD_WAIT_NS(sh) ((sh)->timeout_ns ? (sh)->timeout_ns : SHARD_TIMEOUT_NS)

static const struct run_mpi_plugin *load_plugin(char *why, size_t n)
{
    char dir[PATH_MAX], cand[3][PATH_MAX + 64];
    int nc = 0;
    why[0] = 0;
    const char *env = getenv("ENGRAM_MPI_PLUGIN");
    if (env)
        snprintf(cand[nc++], sizeof cand[0], "%s", env);
    ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash = k > 0 ? (dir[k] = '\0', strrchr(dir, '/')) : NULL;
    if (slash && !env) {
        *slash = '\0';
        snprintf(cand[nc++], sizeof cand[0], "%s/engram-mpi.so", dir);
        snprintf(cand[nc++], sizeof cand[0], "%s/../lib/engram/engram-mpi.so", dir);
    }
    for (int i = 0; i < nc; i++) {
        if (access(cand[i], F_OK) != 0)
            continue;
        /* RTLD_GLOBAL: Open MPI's own components, which it dlopens, want
         * libmpi's symbols visible */
        void *so = dlopen(cand[i], RTLD_NOW | RTLD_GLOBAL);
        if (!so) {
            if (!why[0])
                snprintf(why, n, "%.500s", dlerror());
            continue;
        }
        run_mpi_plugin_fn fn = (run_mpi_plugin_fn)(uintptr_t)dlsym(so, RUN_MPI_PLUGIN_SYMBOL);
        const struct run_mpi_plugin *pl = fn ? fn() : NULL;
        if (pl && pl->version == RUN_MPI_PLUGIN_VERSION)
            return pl;
        if (!why[0])
            snprintf(why, n, "%.400s is not an engram MPI plugin of this version", cand[i]);
    }
    if (!why[0])
        snprintf(why, n, env ? "no file %.400s ($ENGRAM_MPI_PLUGIN)"
                             : "no engram-mpi.so next to the engram executable (it is built where "
                               "mpicc is found)", env);
    return NULL;
}

int shard_start(struct shard *sh, int dp)
{
    char why[600];
    sh->mp = load_plugin(why, sizeof why);
    if (!sh->mp) {
        fprintf(stderr, "%s: run: --shard needs MPI: %s\n", prog, why);
        return EXIT_DATA;
    }
    engram_error err = {0};
    int rc = sh->mp->init(&sh->rank, &sh->world, &err);
    if (rc) {
        fprintf(stderr, "%s: run: --shard: MPI did not start: %s\n", prog, err.msg);
        sh->mp = NULL; /* nothing to finalize */
        return EXIT_DATA;
    }
    sh->dp = dp;
    sh->tp = sh->world > 1 && !dp;
    return 0;
}

int shard_agree(struct shard *sh, uint64_t v)
{
    engram_error err = {0};
    int same = 0, rc = sh->mp->same(v, &same, &err);
    if (rc)
        return fail_lib(rc, &err, "run: --shard");
    if (!same) {
        fprintf(stderr, "%s: run: rank %d: the ranks were not given the same model, tokens and "
                        "options (every rank runs the same command line)\n", prog, sh->rank);
        return EXIT_USAGE;
    }
    return 0;
}

int shard_alloc(struct shard *sh, unsigned B, size_t rowb)
{
    size_t step = (size_t)B * ENGRAM_COLUMNS * rowb, chunk = (size_t)ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS * rowb;
    for (int t = 0; t < 2; t++) {
        sh->send[t] = malloc(step);
        sh->recv[t] = malloc(step);
        sh->pbuf[t] = malloc(chunk);
        if (!sh->send[t] || !sh->recv[t] || !sh->pbuf[t])
            return -ENOMEM;
    }
    return 0;
}

int shard_step_begin(struct run *R, int t, engram_error *err)
{
    struct shard *sh = &R->sh;
    if (sh->began[t])
        return 0;
    /* the ranks' collectives must come in one order: table 0's first */
    int rc = t == 1 ? shard_step_begin(R, 0, err) : 0;
    size_t row = ENGRAM_COLUMNS * R->rowb; /* one token's 24 rows of a table */
    for (unsigned b = 0; b < R->B && rc == 0; b++)
        memcpy(sh->send[t] + b * row, R->outs + ((size_t)b * R->rpt + (size_t)t * ENGRAM_COLUMNS) * R->rowb,
               row);
    if (rc)
        return rc;
    sh->t_begin[t] = run_ns_now();
    rc = sh->mp->combine_begin(sh->send[t], sh->recv[t], R->B * row, &sh->op[t], err);
    if (rc == 0) {
        sh->began[t] = 1;
        sh->dec.calls++;
        sh->dec.bytes += R->B * row;
    }
    return rc;
}

int shard_step_poll(struct run *R, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = 0;
    /* begin each table's combine, in order, once this rank's reads of it are in */
    for (unsigned t = 0; t < R->tables && rc == 0; t++) {
        if (sh->began[t])
            continue;
        for (unsigned b = 0; b < R->B && rc == 0; b++)
            rc = engram_step_poll(R->ss[b].s, (int)t, err);
        if (rc == -EAGAIN)
            return 0;
        if (rc == 0)
            rc = shard_step_begin(R, (int)t, err);
    }
    /* MPI progresses a non-blocking collective only inside MPI calls */
    for (unsigned t = 0; t < R->tables && rc == 0; t++)
        if (sh->began[t] && sh->op[t]) {
            rc = sh->mp->combine_poll(sh->op[t], err);
            rc = rc == -EAGAIN ? 0 : rc;
        }
    return rc;
}

int shard_step_wait(struct run *R, int t, const uint8_t **rows, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = shard_step_begin(R, t, err);
    if (rc)
        return rc;
    uint64_t w0 = run_ns_now();
    rc = sh->mp->combine_wait(sh->op[t], SHARD_WAIT_NS(sh), err);
    uint64_t w1 = run_ns_now();
    sh->mp->combine_free(sh->op[t]);
    sh->op[t] = NULL;
    sh->dec.total_ns += w1 - sh->t_begin[t];
    sh->dec.exposed_ns += w1 - w0;
    *rows = sh->recv[t];
    return rc;
}

int shard_prefill_combine(struct run *R, int t, const void *rows, size_t k, const void **out,
                          engram_error *err)
{
    struct shard *sh = &R->sh;
    size_t bytes = k * ENGRAM_COLUMNS * R->rowb;
    void *op = NULL;
    uint64_t t0 = run_ns_now();
    int rc = sh->mp->combine_begin(rows, sh->pbuf[t], bytes, &op, err);
    if (rc == 0)
        rc = sh->mp->combine_wait(op, SHARD_WAIT_NS(sh), err);
    sh->mp->combine_free(op);
    uint64_t dt = run_ns_now() - t0;
    sh->pre.calls++;
    sh->pre.bytes += bytes;
    sh->pre.total_ns += dt;
    sh->pre.exposed_ns += dt; /* begun at the chunk's layer: nothing to hide it */
    *out = sh->pbuf[t];
    return rc;
}

static uint64_t fnv_session(uint64_t h, const struct run *R, const struct sess *q)
{
    const unsigned char *p = (const unsigned char *)q->x;
    for (size_t i = 0; i < q->len * R->per * 4; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int shard_checksum(const struct run *R, uint64_t *fnv, engram_error *err)
{
    const struct shard *sh = &R->sh;
    uint64_t h = 0xcbf29ce484222325ull;
    if (!sh->dp || sh->world < 2) {
        for (unsigned b = 0; b < R->B; b++)
            h = fnv_session(h, R, &R->ss[b]);
        *fnv = h;
        return 0;
    }
    /* FNV-1a is sequential: session b's owner takes the state from b - 1's
     * owner, hashes its residuals and hands it on; the last goes to rank 0 */
    int W = sh->world, rc = 0;
    unsigned S = sh->sessions;
    for (unsigned b = 0; b < S && rc == 0; b++) {
        int owner = (int)(b % (unsigned)W);
        if (owner != sh->rank)
            continue;
        if (b > 0)
            rc = sh->mp->recv_u64(&h, (int)((b - 1) % (unsigned)W), err);
        if (rc == 0)
            h = fnv_session(h, R, &R->ss[b / (unsigned)W]);
        int next = b + 1 < S ? (int)((b + 1) % (unsigned)W) : 0;
        if (rc == 0 && next != sh->rank)
            rc = sh->mp->send_u64(h, next, err);
    }
    if (rc == 0 && sh->rank == 0 && (int)((S - 1) % (unsigned)W) != 0)
        rc = sh->mp->recv_u64(&h, (int)((S - 1) % (unsigned)W), err);
    *fnv = h;
    return rc;
}

int shard_gather(const struct run *R, const uint64_t *mine, uint64_t *all, engram_error *err)
{
    return R->sh.mp->gather_u64(mine, RK_FIELDS, all, err);
}

void shard_end(struct shard *sh, int failed)
{
    if (sh->mp)
        sh->mp->finalize(failed);
    for (int t = 0; t < 2; t++) {
        free(sh->send[t]);
        free(sh->recv[t]);
        free(sh->pbuf[t]);
    }
}
