/*
 * bench_mpi - issue #24's benchmark: N ranks in TP mode (every rank the same
 * tokens), each rank reading every row itself (replicated, as ds4 does) or
 * only its row block of each table (sharded) and combining the ranks'
 * shares over MPI with libengram-mpi.  Run under mpirun (bench/mpi_bench.sh
 * gives the runs and the environment a container needs):
 *
 *   mpirun -np N build/bench/mpi/bench_mpi [MODEL] --mode replicated|sharded
 *       [--sessions 4] [--steps 256] [--layer-us 50] [--layers-t0 13]
 *       [--layers-tail 30] [--prefill 8192] [--chunk 2048]
 *       [--step-method combine|gather] [--prefill-method combine|gather]
 *       [--seed N] [--depth 64]
 *
 * MODEL defaults to build/demo.gguf.  Every rank opens the model and one
 * pool (sharded: shard_rank = rank, shard_world = N).
 *
 * Decode: S sessions step together (engram_step_begin_batch, one token
 * each, every session its own pseudo-random stream from --seed: the same
 * on every rank).  A step: begin -> wait table 0 (all sessions) -> combine
 * table 0's rows (layer 1 needs them: begin, then wait at once) -> layers
 * 1..13 of --layer-us busy work each, between layers a poll of table 1's
 * reads and, once they are in, the begin of table 1's combine and polls of
 * it (the overlap the design allows) -> before layer 14 the waits that are
 * left -> the other --layers-tail layers -> commit.  The combine of a
 * table: --step-method combine copies the S sessions' 24 rows into one
 * buffer [S][24][512] and ORs it over the ranks (MPI_Iallreduce BOR);
 * gather moves the owned rows of the S sessions' out buffers (one
 * [S][48][512] allocation) with the other table's positions ENGRAM_MPI_NOBODY
 * (MPI_Iallgatherv).  Replicated: no collective.
 *
 * Prefill: one more session, --prefill tokens in chunks of --chunk (ring 2,
 * BF16), table 1 at once; per chunk and table: wait, then combine into a
 * buffer of the bench's (combine: out of place from the ring; gather: the
 * owned rows copied in, then the others gathered), the two tables' ops
 * overlapped with each other's waits by polling; tokens/s = prompt tokens
 * / (begin -> the last chunk combined).  No layer work in prefill: the
 * figure is the reads and the combine.
 *
 * Reported per rank, then by rank 0 for the world: rows read from the disk
 * (pool stats step_rows_read / prefill_rows_read) per token; step latency
 * (begin -> both tables' rows combined and ready) p50/p99, table 0's
 * alone; the step's total (begin -> commit); time spent in the combine's
 * wait and polls per step, and its share of the step's total; the
 * collective's span (begin -> complete); prefill tokens/s; bytes moved per
 * token (see bytes_model below: from the buffer sizes and N).
 *
 * Correctness: every step, one row per session and table (a rotating
 * position) of the combined buffer is compared with engram_model_read_bf16
 * of the ids the bench hashes itself from its own copy of each history; per
 * prefill chunk and table 8 tokens' 24 rows.  In both modes (replicated:
 * the pool's out).  A mismatch prints WRONG ROWS and fails the run (exit
 * 1), as does any library or MPI error.  The checks run outside the timed
 * parts, and their reads (through the page cache) are not in the pool's
 * counters.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "engram.h"
#include "engram_mpi.h"

#define ROW 512u                  /* BF16 row bytes                          */
#define HALF 24u                  /* rows of one table per token             */
#define PF_CHECK 8u               /* prefill tokens checked per chunk, table */
#define TIMEOUT_NS (60ull * 1000000000ull)

static int rank, world, failures;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Layer work of an engine whose layers run elsewhere: wall time. */
static void busy_ns(uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        ;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile q (0..100) of v (sorted in place), microseconds. */
static double pct(uint64_t *v, size_t n, unsigned q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (n * q + 99) / 100;
    return (double)v[i ? i - 1 : 0] / 1e3;
}

static void die(const char *what, int rc, const engram_error *err)
{
    fprintf(stderr, "rank %d: %s: %d %s\n", rank, what, rc, err ? err->msg : "");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

#define TRY(call, what)                    \
    do {                                   \
        engram_error e_;                   \
        int rc_ = (call);                  \
        if (rc_ < 0)                       \
            die(what, rc_, &e_);           \
    } while (0)

/* ------------------------------------------------------------ options */

struct opts {
    const char *model;
    int sharded, step_gather, prefill_gather;
    unsigned sessions, steps, layers_t0, layers_tail, chunk, depth;
    size_t prefill;
    uint64_t layer_ns, seed;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: mpirun -np N bench_mpi [MODEL] --mode replicated|sharded [--sessions 4]\n"
            "       [--steps 256] [--layer-us 50] [--layers-t0 13] [--layers-tail 30]\n"
            "       [--prefill 8192] [--chunk 2048] [--step-method combine|gather]\n"
            "       [--prefill-method combine|gather] [--seed N] [--depth 64]\n");
}

static int parse_u(const char *name, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > max || s[0] == '-') {
        if (rank == 0)
            fprintf(stderr, "bench_mpi: %s: '%s' is not a number in 0..%" PRIu64 "\n", name, s, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.model = "build/demo.gguf", .sharded = -1, .sessions = 4, .steps = 256,
                       .layers_t0 = 13, .layers_tail = 30, .chunk = 2048, .depth = 64,
                       .prefill = 8192, .layer_ns = 50000, .seed = 1, .prefill_gather = 1};
    int have_model = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x = 0;
        int rc = 0;
        if (a[0] != '-' && !have_model) {
            o->model = a;
            have_model = 1;
            continue;
        }
        if (!v) {
            if (rank == 0)
                usage();
            return -1;
        }
        i++;
        if (!strcmp(a, "--mode")) {
            o->sharded = !strcmp(v, "sharded") ? 1 : !strcmp(v, "replicated") ? 0 : -2;
        } else if (!strcmp(a, "--step-method") || !strcmp(a, "--prefill-method")) {
            int g = !strcmp(v, "gather") ? 1 : !strcmp(v, "combine") ? 0 : -1;
            if (g < 0)
                rc = -1;
            else if (a[2] == 's')
                o->step_gather = g;
            else
                o->prefill_gather = g;
        } else if (!strcmp(a, "--sessions")) {
            rc = parse_u(a, v, 64, &x);
            o->sessions = (unsigned)x;
        } else if (!strcmp(a, "--steps")) {
            rc = parse_u(a, v, 1000000, &x);
            o->steps = (unsigned)x;
        } else if (!strcmp(a, "--layer-us")) {
            rc = parse_u(a, v, 1000000, &x);
            o->layer_ns = x * 1000;
        } else if (!strcmp(a, "--layers-t0")) {
            rc = parse_u(a, v, 1000, &x);
            o->layers_t0 = (unsigned)x;
        } else if (!strcmp(a, "--layers-tail")) {
            rc = parse_u(a, v, 1000, &x);
            o->layers_tail = (unsigned)x;
        } else if (!strcmp(a, "--prefill")) {
            rc = parse_u(a, v, 1u << 20, &x);
            o->prefill = (size_t)x;
        } else if (!strcmp(a, "--chunk")) {
            rc = parse_u(a, v, 8192, &x);
            o->chunk = (unsigned)x;
        } else if (!strcmp(a, "--seed")) {
            rc = parse_u(a, v, UINT64_MAX, &o->seed);
        } else if (!strcmp(a, "--depth")) {
            rc = parse_u(a, v, 4096, &x);
            o->depth = (unsigned)x;
        } else {
            rc = -1;
        }
        if (rc < 0) {
            if (rank == 0)
                usage();
            return -1;
        }
    }
    if (o->sharded < 0 || o->sessions == 0 || o->chunk == 0) {
        if (rank == 0)
            usage();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ shared state */

static engram_model *model;
static uint64_t table_rows[ENGRAM_TABLES];

/* Compares n rows of table t (ids) at rows[] (stride ROW) with the oracle. */
static void check_rows(int t, const uint32_t *ids, size_t n, size_t id_stride, const uint8_t *rows,
                       size_t row_stride, const char *what, size_t where)
{
    uint16_t want[256];
    for (size_t i = 0; i < n; i++) {
        TRY(engram_model_read_bf16(model, t, ids + i * id_stride, 1, want, &e_), "engram_model_read_bf16");
        if (memcmp(want, rows + i * row_stride, ROW) != 0) {
            if (failures++ < 5)
                printf("rank %d: WRONG ROWS in %s %zu, table %d, row id %u\n", rank, what, where, t,
                       ids[i * id_stride]);
        }
    }
}

/* The owner array of the step buffer [S][48] for table t's combine. */
static void step_owners(const uint32_t *ids, unsigned S, int t, uint32_t *owner)
{
    for (unsigned s = 0; s < S; s++)
        for (unsigned p = 0; p < 48; p++) {
            uint32_t id = ids[s * 48 + p];
            owner[s * 48 + p] = (int)(p / HALF) == t ? engram_mpi_owner(table_rows[t], id, (unsigned)world)
                                                     : ENGRAM_MPI_NOBODY;
        }
}

/* ------------------------------------------------------------ decode */

struct dec_result {
    uint64_t *lat, *lat0, *total, *cwait, *cspan; /* per step, ns */
    double bytes_recv;                            /* the gather's exact bytes received, summed */
    size_t steps;
};

struct op_state {
    engram_mpi_op *op;
    uint64_t t_begin, t_done;
    int done;
};

static void op_start(engram_mpi *m, const struct opts *o, struct op_state *st, int t, uint8_t *outs,
                     uint8_t *stage, const uint32_t *ids, uint32_t *owner, double *recv)
{
    unsigned S = o->sessions;
    st->t_begin = now_ns();
    st->done = 0;
    if (o->step_gather) {
        step_owners(ids, S, t, owner);
        for (unsigned i = 0; i < S * 48; i++)
            if (owner[i] != ENGRAM_MPI_NOBODY && owner[i] != (uint32_t)rank)
                *recv += ROW;
        TRY(engram_mpi_gather_begin(m, outs, ROW, owner, (size_t)S * 48, &st->op, &e_), "gather_begin");
    } else {
        for (unsigned s = 0; s < S; s++)
            memcpy(stage + (size_t)s * HALF * ROW, outs + ((size_t)s * 48 + (size_t)t * HALF) * ROW,
                   (size_t)HALF * ROW);
        TRY(engram_mpi_combine_begin(m, stage, (size_t)S * HALF * ROW, &st->op, &e_), "combine_begin");
    }
}

/* Polls (wait = 0) or waits for the op; adds the time spent to *spent. */
static void op_progress(struct op_state *st, int wait, uint64_t *spent)
{
    if (st->done || !st->op)
        return;
    uint64_t t0 = now_ns();
    engram_error err;
    int rc = wait ? engram_mpi_combine_wait(st->op, TIMEOUT_NS, &err) : engram_mpi_combine_poll(st->op, &err);
    uint64_t t1 = now_ns();
    *spent += t1 - t0;
    if (rc == -EAGAIN)
        return;
    if (rc < 0)
        die(wait ? "combine_wait" : "combine_poll", rc, &err);
    st->done = 1;
    st->t_done = t1;
    engram_mpi_combine_free(st->op);
    st->op = NULL;
}

static void decode(engram_pool *pool, engram_mpi *m, const struct opts *o, struct dec_result *r)
{
    unsigned S = o->sessions;
    const engram_hasher *hs = engram_model_hasher(model);
    uint32_t vocab = engram_model_layout(model)->vocab;
    engram_session **ss = calloc(S, sizeof *ss);
    void **outp = calloc(S, sizeof *outp);
    uint8_t *outs = calloc((size_t)S * 48, ROW);
    uint8_t *stage[2] = {calloc((size_t)S * HALF, ROW), calloc((size_t)S * HALF, ROW)};
    uint32_t *tok = calloc(S, 4), *ids = calloc((size_t)S * 48, 4);
    uint32_t *owner[2] = {calloc((size_t)S * 48, 4), calloc((size_t)S * 48, 4)};
    uint64_t *rng = calloc(S, sizeof *rng);
    engram_history *hist = calloc(S, sizeof *hist);
    if (!ss || !outp || !outs || !stage[0] || !stage[1] || !tok || !ids || !owner[0] || !owner[1] || !rng ||
        !hist)
        die("out of memory", -ENOMEM, NULL);
    for (unsigned s = 0; s < S; s++) {
        TRY(engram_session_open(pool, &ss[s], &e_), "engram_session_open");
        outp[s] = outs + (size_t)s * 48 * ROW;
        rng[s] = o->seed * 1000003u + s;
        engram_history_reset(&hist[s]);
    }
    size_t n = o->steps;
    r->lat = calloc(n, 8), r->lat0 = calloc(n, 8), r->total = calloc(n, 8);
    r->cwait = calloc(n, 8), r->cspan = calloc(n, 8);
    r->steps = n;
    r->bytes_recv = 0;
    int coll = o->sharded;
    for (size_t k = 0; k < n; k++) {
        for (unsigned s = 0; s < S; s++) {
            tok[s] = (uint32_t)(rnd(&rng[s]) % vocab);
            engram_hash_token(hs, &hist[s], tok[s], 0, ids + (size_t)s * 48);
        }
        /* TP ranks begin together: the step's time is then the world's */
        MPI_Barrier(MPI_COMM_WORLD);
        uint64_t spent = 0, t_begin = now_ns();
        struct op_state op[2] = {{0}, {0}};
        TRY(engram_step_begin_batch(ss, tok, NULL, S, ENGRAM_BF16, outp, &e_), "engram_step_begin_batch");
        for (unsigned s = 0; s < S; s++)
            TRY(engram_step_wait(ss[s], 0, &e_), "engram_step_wait 0");
        if (coll) {
            op_start(m, o, &op[0], 0, outs, stage[0], ids, owner[0], &r->bytes_recv);
            op_progress(&op[0], 1, &spent); /* layer 1 needs table 0 now */
        }
        uint64_t t0_ready = now_ns();
        int t1_in = 0;
        for (unsigned l = 0; l < o->layers_t0; l++) {
            busy_ns(o->layer_ns);
            if (!t1_in) {
                t1_in = 1;
                for (unsigned s = 0; s < S && t1_in; s++) {
                    engram_error err;
                    int rc = engram_step_poll(ss[s], 1, &err);
                    if (rc == -EAGAIN)
                        t1_in = 0;
                    else if (rc < 0)
                        die("engram_step_poll 1", rc, &err);
                }
                if (t1_in && coll)
                    op_start(m, o, &op[1], 1, outs, stage[1], ids, owner[1], &r->bytes_recv);
            } else if (coll) {
                op_progress(&op[1], 0, &spent);
            }
        }
        if (!t1_in) {
            for (unsigned s = 0; s < S; s++)
                TRY(engram_step_wait(ss[s], 1, &e_), "engram_step_wait 1");
            if (coll)
                op_start(m, o, &op[1], 1, outs, stage[1], ids, owner[1], &r->bytes_recv);
        }
        if (coll)
            op_progress(&op[1], 1, &spent); /* layer 14 needs table 1 now */
        uint64_t t1_ready = now_ns();
        for (unsigned l = 0; l < o->layers_tail; l++)
            busy_ns(o->layer_ns);
        for (unsigned s = 0; s < S; s++)
            TRY(engram_step_commit(ss[s], 1, &e_), "engram_step_commit");
        uint64_t t_end = now_ns();
        r->lat[k] = t1_ready - t_begin;
        r->lat0[k] = t0_ready - t_begin;
        r->total[k] = t_end - t_begin;
        r->cwait[k] = spent;
        r->cspan[k] = coll ? (op[0].t_done - op[0].t_begin) + (op[1].t_done - op[1].t_begin) : 0;
        /* one row per session and table: where the engine would read them */
        for (unsigned s = 0; s < S; s++)
            for (int t = 0; t < 2; t++) {
                size_t j = (k + s) % HALF, pos = (size_t)s * 48 + (size_t)t * HALF + j;
                const uint8_t *row = coll && !o->step_gather ? stage[t] + ((size_t)s * HALF + j) * ROW
                                                               : outs + pos * ROW;
                check_rows(t, ids + pos, 1, 1, row, ROW, "step", k);
            }
    }
    for (unsigned s = 0; s < S; s++)
        engram_session_close(ss[s]);
    free(ss), free(outp), free(outs), free(stage[0]), free(stage[1]), free(tok), free(ids);
    free(owner[0]), free(owner[1]), free(rng), free(hist);
}

/* ------------------------------------------------------------ prefill */

struct pf_result {
    uint64_t ns;            /* begin -> the last chunk combined, checks excluded */
    uint64_t cwait;         /* in the combine's waits and polls                  */
    double bytes_recv;      /* the gather's exact bytes received                 */
};

struct pf_ctx {
    const struct opts *o;
    engram_prefill *pf;
    const uint32_t *ids;    /* [P][48] */
    uint64_t check_ns;      /* time in checks, taken off the prefill's     */
    struct pf_result *r;
    /* per table: the op in flight, its chunk, its result buffer */
    engram_mpi_op *op[2];
    size_t c[2], first[2], nt[2];
    uint8_t *res[2][2];
    int live[2];
};

/* PF_CHECK tokens' 24 rows of chunk c of table t (rows [nt][24][512]). */
static void pf_check(struct pf_ctx *x, int t, size_t c, size_t first, size_t nt, const uint8_t *rows)
{
    uint64_t a = now_ns();
    for (unsigned q = 0; q < PF_CHECK && q < nt; q++) {
        size_t tk = ((size_t)q * 2654435761u + c * 97 + (size_t)t) % nt;
        check_rows(t, x->ids + (first + tk) * 48 + (size_t)t * HALF, HALF, 1, rows + tk * HALF * ROW, ROW,
                   "prefill chunk", c);
    }
    x->check_ns += now_ns() - a;
}

/* Waits for table t's op in flight, checks its rows, releases its chunk. */
static void pf_finish(struct pf_ctx *x, int t)
{
    if (!x->live[t])
        return;
    engram_error err;
    uint64_t a = now_ns();
    int rc = engram_mpi_combine_wait(x->op[t], TIMEOUT_NS, &err);
    x->r->cwait += now_ns() - a;
    if (rc < 0)
        die("combine_wait (prefill)", rc, &err);
    engram_mpi_combine_free(x->op[t]);
    x->op[t] = NULL;
    pf_check(x, t, x->c[t], x->first[t], x->nt[t], x->res[t][x->c[t] & 1]);
    engram_prefill_release(x->pf, t, x->c[t]);
    x->live[t] = 0;
}

static void prefill(engram_pool *pool, engram_mpi *m, const struct opts *o, struct pf_result *r)
{
    size_t P = o->prefill;
    memset(r, 0, sizeof *r);
    if (P == 0)
        return;
    uint32_t vocab = engram_model_layout(model)->vocab;
    uint32_t *tok = malloc(P * 4), *ids = malloc(P * 48 * 4), *own = malloc(P * 48 * 4);
    uint32_t *cown = malloc((size_t)o->chunk * HALF * 4);
    if (!tok || !ids || !own || !cown)
        die("out of memory", -ENOMEM, NULL);
    uint64_t seed = o->seed * 7919u + 17;
    for (size_t i = 0; i < P; i++)
        tok[i] = (uint32_t)(rnd(&seed) % vocab);
    engram_history h;
    engram_history_reset(&h);
    TRY(engram_hash_tokens(engram_model_hasher(model), &h, tok, NULL, P, ids, &e_), "engram_hash_tokens");
    TRY(engram_mpi_owners(table_rows, ids, NULL, P, (unsigned)world, own, &e_), "engram_mpi_owners");
    engram_session *s = NULL;
    TRY(engram_session_open(pool, &s, &e_), "engram_session_open");
    engram_prefill_opts po;
    memset(&po, 0, sizeof po);
    po.chunk_tokens = o->chunk;
    po.dtype = ENGRAM_BF16;
    struct pf_ctx x;
    memset(&x, 0, sizeof x);
    x.o = o, x.ids = ids, x.r = r;
    size_t cap = (size_t)o->chunk * HALF;
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 2; b++)
            if (!(x.res[t][b] = malloc(cap * ROW)))
                die("out of memory", -ENOMEM, NULL);
    int coll = o->sharded;
    MPI_Barrier(MPI_COMM_WORLD);
    uint64_t t_begin = now_ns();
    TRY(engram_prefill_begin(s, tok, NULL, P, &po, &x.pf, &e_), "engram_prefill_begin");
    size_t nc = engram_prefill_chunks(x.pf);
    for (size_t c = 0; c < nc; c++)
        for (int t = 0; t < 2; t++) {
            const void *rows = NULL;
            size_t first = 0, nt = 0;
            /* wait for the chunk, progressing the ops in flight meanwhile */
            for (;;) {
                engram_error err;
                int rc = engram_prefill_wait_timed(x.pf, t, c, coll ? 50000 : ENGRAM_FOREVER, &rows, &first, &nt,
                                                   &err);
                if (rc == 0)
                    break;
                if (rc != -ETIMEDOUT)
                    die("engram_prefill_wait", rc, &err);
                for (int u = 0; u < 2; u++)
                    if (x.live[u]) {
                        uint64_t a = now_ns();
                        int prc = engram_mpi_combine_poll(x.op[u], &err);
                        r->cwait += now_ns() - a;
                        if (prc < 0 && prc != -EAGAIN)
                            die("combine_poll (prefill)", prc, &err);
                    }
            }
            if (!coll) {
                pf_check(&x, t, c, first, nt, rows);
                engram_prefill_release(x.pf, t, c);
                continue;
            }
            /* this table's previous op ends before its chunk's slot and buffer are reused */
            pf_finish(&x, t);
            size_t n = nt * HALF;
            uint8_t *buf = x.res[t][c & 1];
            engram_mpi_op *op = NULL;
            if (o->prefill_gather) {
                for (size_t i = 0; i < n; i++) {
                    cown[i] = own[(first + i / HALF) * 48 + (size_t)t * HALF + i % HALF];
                    if (cown[i] == (uint32_t)rank)
                        memcpy(buf + i * ROW, (const uint8_t *)rows + i * ROW, ROW);
                    else if (cown[i] != ENGRAM_MPI_NOBODY)
                        r->bytes_recv += ROW;
                }
                TRY(engram_mpi_gather_begin(m, buf, ROW, cown, n, &op, &e_), "gather_begin");
            } else {
                TRY(engram_mpi_combine_begin_into(m, rows, buf, n * ROW, &op, &e_), "combine_begin_into");
            }
            x.op[t] = op, x.c[t] = c, x.first[t] = first, x.nt[t] = nt, x.live[t] = 1;
        }
    pf_finish(&x, 0);
    pf_finish(&x, 1);
    r->ns = now_ns() - t_begin - x.check_ns;
    TRY(engram_prefill_end(x.pf, &e_), "engram_prefill_end");
    engram_session_close(s);
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 2; b++)
            free(x.res[t][b]);
    free(tok), free(ids), free(own), free(cown);
}

/* ------------------------------------------------------------ report */

/*
 * Bytes a rank receives per token by the collective (the header's model of
 * engram_mpi.h): the combine ORs a buffer of B bytes, B = 48 x 512 per
 * decode token and per prefill token (24 rows of each table), and receives
 * 2 (N - 1) / N x B with the ring or Rabenseifner algorithms (recursive
 * doubling, which Open MPI may pick for small buffers, receives log2(N) x
 * B); the gather receives exactly the rows other ranks own, counted as the
 * bench starts each op.  Moved on the wire (all ranks together): N times
 * that.
 */
static double combine_bytes(double B)
{
    return world > 1 ? 2.0 * (world - 1) / world * B : 0;
}

struct world_stats {
    double min, max, sum;
};

static struct world_stats reduce(double v)
{
    struct world_stats w;
    MPI_Allreduce(&v, &w.min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &w.max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &w.sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return w;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    struct opts o;
    if (parse_opts(argc, argv, &o) < 0) {
        MPI_Finalize();
        return 2;
    }
    TRY(engram_model_open(o.model, &model, &e_), "engram_model_open");
    engram_model_info mi;
    engram_model_get_info(model, &mi);
    table_rows[0] = mi.table[0].rows;
    table_rows[1] = mi.table[1].rows;
    engram_pool_opts po;
    memset(&po, 0, sizeof po);
    po.reader.depth = o.depth;
    if (o.sharded) {
        po.shard_rank = (unsigned)rank;
        po.shard_world = (unsigned)world;
    }
    engram_pool *pool = NULL;
    TRY(engram_pool_open(model, &po, &pool, &e_), "engram_pool_open");
    engram_mpi *m = NULL;
    TRY(engram_mpi_open(MPI_COMM_WORLD, NULL, &m, &e_), "engram_mpi_open");
    engram_pool_stats st;
    engram_pool_get_stats(pool, &st);
    if (rank == 0) {
        struct utsname u;
        uname(&u);
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        printf("bench_mpi: %d ranks on %ld cores%s, %s %s; model %s (tables %" PRIu64 " + %" PRIu64
               " rows, %.0f MB); reader %s depth %u\n",
               world, cores, world > cores ? " (OVERSUBSCRIBED)" : "", u.sysname, u.release, o.model,
               table_rows[0], table_rows[1], (double)(mi.table[0].bytes + mi.table[1].bytes) / 1e6,
               st.io.engine ? st.io.engine : "?", o.depth);
        printf("mode %s, step %s, prefill %s; %u sessions x %u steps, layers %u + %u of %.0f us; prefill %zu "
               "tokens, chunks of %u; seed %" PRIu64 "\n",
               o.sharded ? "sharded" : "replicated", o.sharded ? (o.step_gather ? "gather" : "combine") : "-",
               o.sharded ? (o.prefill_gather ? "gather" : "combine") : "-", o.sessions, o.steps, o.layers_t0,
               o.layers_tail, (double)o.layer_ns / 1e3, o.prefill, o.chunk, o.seed);
        fflush(stdout);
    }

    struct dec_result d;
    decode(pool, m, &o, &d);
    engram_pool_stats s1;
    engram_pool_get_stats(pool, &s1);
    struct pf_result pr;
    prefill(pool, m, &o, &pr);
    engram_pool_stats s2;
    engram_pool_get_stats(pool, &s2);

    double dec_tokens = (double)d.steps * o.sessions;
    double step_rows = (double)s1.step_rows_read, pf_rows = (double)s2.prefill_rows_read;
    double sum_cwait = 0, sum_total = 0, sum_span = 0, sum_lat = 0;
    for (size_t i = 0; i < d.steps; i++) {
        sum_cwait += (double)d.cwait[i];
        sum_total += (double)d.total[i];
        sum_span += (double)d.cspan[i];
        sum_lat += (double)d.lat[i];
    }
    double p50 = pct(d.lat, d.steps, 50), p99 = pct(d.lat, d.steps, 99);
    double p50_0 = pct(d.lat0, d.steps, 50), p99_0 = pct(d.lat0, d.steps, 99);
    double tot50 = pct(d.total, d.steps, 50);
    double cw50 = pct(d.cwait, d.steps, 50), cw99 = pct(d.cwait, d.steps, 99);
    double span50 = pct(d.cspan, d.steps, 50);
    double pf_tps = pr.ns ? (double)o.prefill / ((double)pr.ns / 1e9) : 0;
    double dec_bytes = !o.sharded ? 0
                       : o.step_gather ? d.bytes_recv / dec_tokens
                                       : combine_bytes(48.0 * ROW);
    double pf_bytes = !o.sharded || !o.prefill ? 0
                      : o.prefill_gather ? pr.bytes_recv / (double)o.prefill
                                         : combine_bytes(48.0 * ROW);
    int bad = failures;
    int bad_all = 0;
    MPI_Allreduce(&bad, &bad_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);

    /* per rank, in rank order */
    for (int r = 0; r < world; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (r == rank) {
            printf("rank %d: rows read/token decode %.2f prefill %.2f | step p50 %.1f p99 %.1f us (table 0 "
                   "p50 %.1f p99 %.1f) total p50 %.1f | coll wait/step p50 %.1f p99 %.1f mean %.1f us, "
                   "span p50 %.1f, share %.2f%% | prefill %.0f tok/s, coll wait %.1f ms | bytes/token "
                   "decode %.0f prefill %.0f | checks failed %d\n",
                   rank, step_rows / dec_tokens, o.prefill ? pf_rows / (double)o.prefill : 0.0, p50, p99, p50_0,
                   p99_0, tot50, cw50, cw99, sum_cwait / (double)d.steps / 1e3, span50,
                   100.0 * sum_cwait / sum_total, pf_tps, (double)pr.cwait / 1e6, dec_bytes, pf_bytes, failures);
            fflush(stdout);
        }
    }
    struct world_stats w_step_rows = reduce(step_rows / dec_tokens);
    struct world_stats w_pf_rows = reduce(o.prefill ? pf_rows / (double)o.prefill : 0);
    struct world_stats w_p50 = reduce(p50), w_p99 = reduce(p99), w_tot = reduce(tot50);
    struct world_stats w_share = reduce(100.0 * sum_cwait / sum_total);
    struct world_stats w_cw = reduce(sum_cwait / (double)d.steps / 1e3);
    struct world_stats w_span = reduce(sum_span / (double)d.steps / 1e3);
    struct world_stats w_tps = reduce(pf_tps);
    struct world_stats w_pfw = reduce((double)pr.cwait / 1e6);
    struct world_stats w_db = reduce(dec_bytes), w_pb = reduce(pf_bytes);
    (void)sum_lat;
    if (rank == 0) {
        /* one line for the script: world sums of reads, the slowest rank's times */
        printf("RESULT np=%d mode=%s step=%s prefill=%s rows_per_token_decode=%.2f (per rank %.2f..%.2f) "
               "rows_per_token_prefill=%.2f (per rank %.2f..%.2f) step_p50_us=%.1f step_p99_us=%.1f "
               "step_total_p50_us=%.1f coll_wait_us=%.1f coll_span_us=%.1f coll_share_pct=%.2f "
               "prefill_tok_s=%.0f prefill_coll_wait_ms=%.1f bytes_per_token_decode=%.0f "
               "bytes_per_token_prefill=%.0f checks_failed=%d\n",
               world, o.sharded ? "sharded" : "replicated", o.sharded ? (o.step_gather ? "gather" : "combine") : "-",
               o.sharded ? (o.prefill_gather ? "gather" : "combine") : "-", w_step_rows.sum, w_step_rows.min,
               w_step_rows.max, w_pf_rows.sum, w_pf_rows.min, w_pf_rows.max, w_p50.max, w_p99.max, w_tot.max,
               w_cw.max, w_span.max, w_share.max, w_tps.min, w_pfw.max, w_db.max, w_pb.max, bad_all);
        fflush(stdout);
    }
    free(d.lat), free(d.lat0), free(d.total), free(d.cwait), free(d.cspan);
    engram_mpi_close(m);
    engram_pool_close(pool);
    engram_model_close(model);
    MPI_Finalize();
    return bad_all ? 1 : 0;
}
