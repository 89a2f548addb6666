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
 * between layers, and waited for at t's layer; a prefill chunk's rows are
 * gathered (each rank's owned rows to the others; or OR-combined with
 * --prefill-method combine) as soon as they are read, in one order on
 * every rank, progressed between layers and waited for at the chunk's
 * layer.  The combined rows are the one-process rows bit for
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
    if (sh->pgather) {
        sh->pids = malloc((size_t)ENGRAM_BATCH_TOKENS * ENGRAM_ROWS_PER_TOKEN * sizeof *sh->pids);
        sh->pown = malloc((size_t)ENGRAM_BATCH_TOKENS * ENGRAM_COLUMNS * sizeof *sh->pown);
        if (!sh->pids || !sh->pown)
            return -ENOMEM;
    }
    return 0;
}

/* What a combine moves: send's bytes OR-ed into recv (a step's table, a
 * prefill chunk with --prefill-method combine), or by default a prefill
 * chunk's k tokens of table t, read at send, gathered (c: the chunk). */
struct comb_args {
    const void *send;
    void *recv;
    size_t bytes;
    int t;
    size_t c, k;
};
/* Begins it: 0 with *op in flight, or the error (nothing in flight). */
typedef int (*comb_start_fn)(struct run *R, const struct comb_args *a, void **op, engram_error *err);

static int start_combine(struct run *R, const struct comb_args *a, void **op, engram_error *err)
{
    return R->sh.mp->combine_begin(a->send, a->recv, a->bytes, op, err);
}

/* A combine begun now by start, timed in o and counted in c: 0, or the
 * error (nothing in flight). */
static int comb_begin(struct run *R, struct comb_op *o, struct comb *c, comb_start_fn start,
                      const struct comb_args *a, engram_error *err)
{
    *o = (struct comb_op){.begin_ns = run_ns_now()};
    o->polled_ns = o->begin_ns;
    int rc = start(R, a, &o->op, err);
    if (rc == 0) {
        c->calls++;
        c->bytes += a->bytes;
    }
    return rc;
}

/* One poll of a combine in flight: 0 (complete or not yet) or its error. */
static int comb_poll(struct shard *sh, struct comb_op *o, engram_error *err)
{
    if (!o->op || o->done_ns)
        return 0;
    int rc = sh->mp->combine_poll(o->op, err);
    uint64_t now = run_ns_now();
    if (rc == -EAGAIN) {
        o->polled_ns = now;
        return 0;
    }
    if (rc == 0)
        o->done_ns = now;
    return rc;
}

/* Waits for a combine (at most --shard-timeout), frees it and adds its
 * times to c: 0 or the error. */
static int comb_wait(struct shard *sh, struct comb_op *o, struct comb *c, engram_error *err)
{
    uint64_t w0 = run_ns_now();
    int rc = sh->mp->combine_wait(o->op, SHARD_WAIT_NS(sh), err);
    uint64_t w1 = run_ns_now();
    sh->mp->combine_free(o->op);
    o->op = NULL;
    if (o->done_ns) { /* complete before the wait, seen by a poll: nothing waited for */
        c->early++;
        c->late_ns += o->done_ns - o->polled_ns;
    } else {
        o->done_ns = w1;
        c->exposed_ns += w1 - w0;
    }
    c->total_ns += o->done_ns - o->begin_ns;
    return rc;
}

/* Gives up a combine (a failed step or prompt): the job ends after this. */
static void comb_drop(struct shard *sh, struct comb_op *o)
{
    if (o->op)
        sh->mp->combine_free(o->op);
    o->op = NULL;
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
    struct comb_args a = {.send = sh->send[t], .recv = sh->recv[t], .bytes = R->B * row};
    if (rc == 0)
        rc = comb_begin(R, &sh->op[t], &sh->dec, start_combine, &a, err);
    if (rc == 0)
        sh->began[t] = 1;
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
        if (rc == -EAGAIN) { /* not in yet: later tables wait for it, begun ones are polled */
            rc = 0;
            break;
        }
        if (rc == 0)
            rc = shard_step_begin(R, (int)t, err);
    }
    /* MPI progresses a non-blocking collective only inside MPI calls */
    for (unsigned t = 0; t < R->tables && rc == 0; t++)
        if (sh->began[t])
            rc = comb_poll(sh, &sh->op[t], err);
    return rc;
}

int shard_step_wait(struct run *R, int t, const uint8_t **rows, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = shard_step_begin(R, t, err);
    if (rc == 0)
        rc = comb_wait(sh, &sh->op[t], &sh->dec, err);
    *rows = sh->recv[t];
    return rc;
}

void shard_step_drop(struct run *R)
{
    for (int t = 0; t < 2; t++)
        comb_drop(&R->sh, &R->sh.op[t]);
}

void shard_prefill_start(struct run *R, engram_prefill *pf, size_t chunks, const uint32_t *tokens,
                         const engram_history *h)
{
    struct shard *sh = &R->sh;
    sh->pf = pf;
    sh->pchunks = chunks;
    sh->pnext = 0;
    sh->pfull[0] = sh->pfull[1] = 0;
    sh->ptok = tokens;
    sh->phist = *h;
    sh->pids_chunk = SIZE_MAX;
    if (sh->pgather) {
        engram_model_info mi;
        engram_model_get_info(R->m, &mi);
        for (int t = 0; t < ENGRAM_TABLES; t++)
            sh->prows[t] = mi.table[t].rows;
    }
}

/* The gather of chunk c's rows of table t ([k][24] in the ring at send):
 * the chunk's ids hashed (once, for table 0's; the chunks come in order),
 * the positions' owners, this rank's rows copied into pbuf[t] (the rest is
 * received there), the gather begun. */
static int start_gather(struct run *R, const struct comb_args *a, void **op, engram_error *err)
{
    struct shard *sh = &R->sh;
    const int t = a->t;
    const size_t c = a->c, k = a->k;
    int rc = 0;
    if (sh->pids_chunk != c) {
        if (c != (sh->pids_chunk == SIZE_MAX ? 0 : sh->pids_chunk + 1)) {
            if (err) {
                err->code = -EPROTO;
                snprintf(err->msg, sizeof err->msg, "prefill chunk %zu hashed out of order", c);
            }
            return -EPROTO;
        }
        rc = engram_hash_tokens(engram_model_hasher(R->m), &sh->phist, sh->ptok + c * ENGRAM_BATCH_TOKENS,
                                NULL, k, sh->pids, err);
        if (rc)
            return rc;
        sh->pids_chunk = c;
    }
    const uint64_t rows_t = sh->prows[t];
    const size_t rowb = R->rowb, n = k * ENGRAM_COLUMNS;
    uint64_t received = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = sh->pids[(i / ENGRAM_COLUMNS) * ENGRAM_ROWS_PER_TOKEN + (size_t)t * ENGRAM_COLUMNS +
                               i % ENGRAM_COLUMNS];
        uint32_t o = sh->mp->owner(rows_t, id, (unsigned)sh->world);
        sh->pown[i] = o;
        if (o == (uint32_t)sh->rank)
            memcpy(sh->pbuf[t] + i * rowb, (const uint8_t *)a->send + i * rowb, rowb);
        else
            received += rowb;
    }
    rc = sh->mp->gather_begin(sh->pbuf[t], rowb, sh->pown, n, op, err);
    if (rc == 0)
        sh->pre_recv += received;
    return rc;
}

/* Begins the next combine of the ranks' order, (pnext / 2, pnext % 2), if
 * pbuf[t] is free and, unless `block`, its rows are read already (block:
 * waits for them; the layer needs them now).  *begun 1 if it began. */
static int prefill_begin_next(struct run *R, int block, int *begun, engram_error *err)
{
    struct shard *sh = &R->sh;
    *begun = 0;
    if (!sh->pf || sh->pnext >= 2 * sh->pchunks)
        return 0;
    size_t c = sh->pnext / 2;
    int t = (int)(sh->pnext % 2);
    if (sh->pfull[t] || (!block && engram_prefill_ready(sh->pf, t) <= c))
        return 0;
    const void *rows = NULL;
    size_t k = 0;
    int rc = engram_prefill_wait(sh->pf, t, c, &rows, NULL, &k, err);
    struct comb_args a = {.send = rows, .recv = sh->pbuf[t], .bytes = k * ENGRAM_COLUMNS * R->rowb,
                          .t = t, .c = c, .k = k};
    if (rc == 0)
        rc = comb_begin(R, &sh->pop[t], &sh->pre, sh->pgather ? start_gather : start_combine, &a, err);
    if (rc == 0) {
        sh->pchunk[t] = c;
        sh->pfull[t] = 1;
        sh->pnext++;
        *begun = 1;
    }
    return rc;
}

int shard_prefill_pump(struct run *R, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = 0, begun = 1;
    while (rc == 0 && begun)
        rc = prefill_begin_next(R, 0, &begun, err);
    for (int t = 0; t < 2 && rc == 0; t++)
        rc = comb_poll(sh, &sh->pop[t], err);
    return rc;
}

int shard_prefill_combine(struct run *R, int t, size_t c, const void **out, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = 0, begun = 1;
    /* the order's combines up to (c, t) begun: the layers apply (c, 0)
     * before (c, 1) and chunk c before c + 1, so at most this one is left */
    while (rc == 0 && begun && !(sh->pfull[t] && sh->pchunk[t] == c))
        rc = prefill_begin_next(R, 1, &begun, err);
    if (rc == 0 && !(sh->pfull[t] && sh->pchunk[t] == c)) {
        if (err) {
            err->code = -EPROTO;
            snprintf(err->msg, sizeof err->msg, "prefill combine of chunk %zu, table %d out of order", c, t);
        }
        return -EPROTO;
    }
    if (rc == 0 && sh->pop[t].op)
        rc = comb_wait(sh, &sh->pop[t], &sh->pre, err);
    *out = sh->pbuf[t];
    return rc;
}

void shard_prefill_done(struct run *R, int t)
{
    R->sh.pfull[t] = 0;
}

void shard_prefill_stop(struct run *R)
{
    struct shard *sh = &R->sh;
    for (int t = 0; t < 2; t++)
        comb_drop(sh, &sh->pop[t]);
    sh->pf = NULL;
    sh->pfull[0] = sh->pfull[1] = 0;
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
    free(sh->pids);
    free(sh->pown);
}

/* ------------------------------------------------ --dp on shard files */

int shard_model_path(const struct shard *sh, const char *in, char *out, size_t n)
{
    size_t j = 0;
    for (const char *p = in; *p; p++) {
        char num[16] = {p[0], 0};
        if (p[0] == '%' && (p[1] == 'r' || p[1] == 'n')) {
            snprintf(num, sizeof num, "%d", p[1] == 'r' ? sh->rank : sh->world);
            p++;
        }
        size_t k = strlen(num);
        if (j + k >= n)
            return -ENAMETOOLONG;
        memcpy(out + j, num, k);
        j += k;
    }
    out[j] = '\0';
    return 0;
}

int shard_model_check(struct shard *sh, const engram_model *m)
{
    engram_model_info mi;
    memset(&mi, 0, sizeof mi);
    int ok = m != NULL, shardf = 0;
    if (m) {
        engram_model_get_info(m, &mi);
        shardf = mi.shard.world > 0;
    }
    if (shardf && (mi.shard.world != (uint32_t)sh->world || mi.shard.rank != (uint32_t)sh->rank)) {
        fprintf(stderr, "%s: run: rank %d of %d was given shard %u of %u (each rank its own: MODEL may say "
                        "%%r for the rank and %%n for the world, e.g. DIR/NAME.shard-%%r-of-%%n.gguf)\n",
                prog, sh->rank, sh->world, mi.shard.rank, mi.shard.world);
        ok = 0;
    }
    /* a collective every rank reaches, even one whose model did not open */
    engram_error err = {0};
    int same = 0, rc = sh->mp->same((uint64_t)ok | (uint64_t)shardf << 1, &same, &err);
    if (rc)
        return fail_lib(rc, &err, "run: --shard");
    if (!ok)
        return EXIT_DATA;
    if (!same) {
        fprintf(stderr, "%s: run: rank %d: the other ranks' models %s\n", prog, sh->rank,
                shardf ? "are not all shard files, or some did not open"
                       : "are shard files, or some did not open (every rank a whole file, or its shard)");
        return EXIT_DATA;
    }
    if (!shardf)
        return 0;
    engram_shard_info *all = calloc((size_t)sh->world, sizeof *all);
    rc = all ? sh->mp->allgather(&mi.shard, sizeof mi.shard, all, &err) : -ENOMEM;
    if (rc == 0 && (rc = engram_shard_set_check(all, (size_t)sh->world, NULL, &err)) != 0) {
        /* every rank checked the same set: they refuse alike */
        fprintf(stderr, "%s: run: rank %d: the ranks' shard files are not one set: %s\n", prog, sh->rank, err.msg);
        free(all);
        return EXIT_DATA;
    }
    free(all);
    if (rc)
        return fail_lib(rc, &err, "run: --shard");
    sh->xdp = sh->dp && sh->world > 1;
    return 0;
}

static int dp_setup(struct run *R, engram_error *err)
{
    struct shard *sh = &R->sh;
    if (sh->xout)
        return 0;
    size_t maxk = R->B > ENGRAM_BATCH_TOKENS ? R->B : ENGRAM_BATCH_TOKENS;
    int rc = engram_reader_open(R->m, NULL, &sh->xrd, err);
    if (rc)
        return rc;
    sh->hist = calloc(R->B, sizeof *sh->hist);
    sh->xids = malloc(maxk * ENGRAM_ROWS_PER_TOKEN * sizeof *sh->xids);
    sh->xout = malloc(maxk * ENGRAM_ROWS_PER_TOKEN * R->rowb);
    if (!sh->hist || !sh->xids || !sh->xout) {
        shard_dp_close(sh); /* all or nothing: the reader too, so a later call starts afresh */
        return -ENOMEM;
    }
    for (unsigned b = 0; b < R->B; b++)
        engram_session_history(R->ss[b].s, &sh->hist[b]);
    return 0;
}

/* Layers of busy work (as the engine's, run_engine.c) */
static volatile double dp_sink;
static void dp_busy(uint64_t us)
{
    uint64_t end = run_ns_now() + us * 1000;
    double x = 1.0;
    while (run_ns_now() < end)
        for (int i = 0; i < 200; i++)
            x = x * 1.0000001 + 1e-9;
    dp_sink = x;
}

/* One exchange of the n tokens' ids in sh->xids (n may be 0: this rank
 * only serves) and the engine's layers around it: begun before layer 0,
 * progressed between layers, waited for at layer 1; tables 0 and 1
 * applied to x[n] at their layers from the [n][48] rows (the one-process
 * run's rows, another stride).  ph: 0 decode, 1 prefill. */
static int dp_run(struct run *R, size_t n, float *x, uint64_t layer_us, int ph, engram_error *err)
{
    struct shard *sh = &R->sh;
    struct comb *cb = ph ? &sh->xpre : &sh->xdec;
    void *op = NULL;
    uint64_t t0 = run_ns_now(), t_done = 0, exposed = 0;
    int rc = sh->mp->exchange_begin(R->m, sh->xrd, sh->xids, NULL, n, (engram_dtype)R->rdt, sh->xout, &op, err);
    size_t row = R->rowb;
    for (unsigned l = 0; l < (n ? R->layers : 1) && rc == 0; l++) {
        int t = R->at[0] == l ? 0 : R->at[1] == l ? 1 : -1;
        if (!t_done && (t >= 0 || !n)) {
            uint64_t w0 = run_ns_now();
            rc = sh->mp->combine_wait(op, SHARD_WAIT_NS(sh), err);
            t_done = run_ns_now();
            exposed += t_done - w0;
        }
        if (t >= 0 && rc == 0) {
            rc = dev_apply(R->D[t], sh->xout + (size_t)t * ENGRAM_COLUMNS * row, ENGRAM_ROWS_PER_TOKEN * row, x,
                           NULL, n, NULL, err);
        } else if (t < 0 && n) {
            if (!t_done) { /* MPI moves the phases on only inside its calls */
                rc = sh->mp->combine_poll(op, err);
                t_done = rc == 0 ? run_ns_now() : 0;
                rc = rc == -EAGAIN ? 0 : rc;
            }
            dp_busy(layer_us);
        }
    }
    if (op && t_done) {
        uint64_t mv[4];
        sh->mp->exchange_moved(op, mv);
        for (int i = 0; i < 4; i++)
            sh->xmoved[ph][i] += mv[i];
        cb->calls++;
        cb->bytes += mv[1] * (row + 4);
        cb->total_ns += t_done - t0;
        cb->exposed_ns += exposed;
    }
    sh->mp->combine_free(op); /* a failed one: given up (the run ends the job) */
    return rc;
}

int shard_dp_prefill(struct run *R, size_t *prompt_tokens, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = dp_setup(R, err);
    unsigned W = (unsigned)sh->world, rounds = (sh->sessions + W - 1) / W; /* rank 0's sessions */
    size_t prompt = R->B ? R->ss[0].prompt : 0, chunk = ENGRAM_BATCH_TOKENS; /* every slice alike */
    size_t C = (prompt + chunk - 1) / chunk;
    for (unsigned i = 0; i < rounds && rc == 0; i++) {
        for (size_t c = 0; c < C && rc == 0; c++) {
            size_t k = 0;
            float *x = NULL;
            if (i < R->B) {
                struct sess *q = &R->ss[i];
                size_t first = c * chunk;
                k = prompt - first < chunk ? prompt - first : chunk;
                rc = engram_hash_tokens(engram_model_hasher(R->m), &sh->hist[i], q->tok + first, NULL, k,
                                        sh->xids, err);
                x = q->x + first * R->per;
            }
            if (rc == 0)
                rc = dp_run(R, k, x, R->layer_us * ((k + 63) / 64), 1, err);
        }
        if (i < R->B)
            *prompt_tokens += prompt;
    }
    if (sh->xrd) {
        engram_io_stats st;
        engram_reader_get_stats(sh->xrd, &st);
        sh->xread[1] = st.rows_read;
        engram_reader_reset_stats(sh->xrd);
    }
    return rc;
}

int shard_dp_step(struct run *R, size_t step, engram_error *err)
{
    struct shard *sh = &R->sh;
    int rc = dp_setup(R, err);
    uint64_t t0 = run_ns_now();
    for (unsigned b = 0; b < R->B && rc == 0; b++) {
        struct sess *q = &R->ss[b];
        rc = engram_hash_tokens(engram_model_hasher(R->m), &sh->hist[b], &q->tok[q->prompt + step], NULL, 1,
                                sh->xids + (size_t)b * ENGRAM_ROWS_PER_TOKEN, err);
        memcpy(R->xs + (size_t)b * R->per, q->x + (q->prompt + step) * R->per, R->per * 4);
    }
    if (rc == 0)
        rc = dp_run(R, R->B, R->xs, R->layer_us, 0, err);
    for (unsigned b = 0; b < R->B && rc == 0; b++) {
        struct sess *q = &R->ss[b];
        memcpy(q->x + (q->prompt + step) * R->per, R->xs + (size_t)b * R->per, R->per * 4);
    }
    R->step_lat[R->n_steps++] = run_ns_now() - t0;
    return rc;
}

void shard_dp_figures(const struct run *R, uint64_t *mine)
{
    const struct shard *sh = &R->sh;
    if (!sh->xdp)
        return;
    engram_io_stats st = {0};
    if (sh->xrd)
        engram_reader_get_stats(sh->xrd, &st);
    mine[RK_DEC_READ] = st.rows_read;          /* the world's rows this rank read */
    mine[RK_DEC_REQ] = sh->xmoved[0][2];        /* rows asked of it (served)      */
    mine[RK_PRE_READ] = sh->xread[1];
    mine[RK_X_DEC_REMOTE] = sh->xmoved[0][1];
    mine[RK_X_DEC_SENT] = sh->xmoved[0][3];
    mine[RK_X_PRE_REMOTE] = sh->xmoved[1][1];
    mine[RK_X_PRE_SENT] = sh->xmoved[1][3];
}

void shard_dp_close(struct shard *sh)
{
    engram_reader_close(sh->xrd);
    sh->xrd = NULL;
    free(sh->hist);
    free(sh->xids);
    free(sh->xout);
    sh->hist = NULL;
    sh->xids = NULL;
    sh->xout = NULL;
}
