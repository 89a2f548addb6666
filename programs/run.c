/*
 * run.c - engram run: the Engram part of a model inside a simulated engine.
 *
 * B sessions share one pool.  Each takes its own slice of the token stream:
 * the first part is its prompt (prefilled chunk by chunk through the
 * prefetch ring), the last N tokens are decode steps, all B sessions
 * stepping together (one batched round of reads per step).  The engine has
 * L layers; Engram is applied at layers 1 and 14 (the real projection,
 * gate and update, on a deterministic residual), every other layer costs
 * --layer-us of busy work on the engine's thread while the pool's I/O
 * thread reads.  Reads are begun when a step's token is known (before
 * layer 0) and waited for only at the Engram layers, so the layers before
 * hide them; the report says how much was hidden.
 *
 * This file is the command: its options, the set-up of the model, layers,
 * pool and sessions, and the tear-down; run_engine.c is the simulated
 * engine and run_report.c the report.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

static const char *run_help =
    "usage: engram run [MODEL] [--tokens FILE] [--decode N] [--sessions B] [--layers L]\n"
    "                  [--layer-us X] [--threads N] [--no-overlap] [--no-prefetch] [--json]\n"
    "                  [--device cpu|cuda|cuda-fma]\n"
    "                  [--shard [--dp] [--prefill-method gather|combine] [--shard-timeout SEC]]\n"
    "Runs the Engram part of a model inside a simulated engine of L layers (Engram\n"
    "at layers 1 and 14; every other layer costs X us of busy work on the engine's\n"
    "thread): B sessions, each on its own slice of the token stream, prefill their\n"
    "prompt (the slice but its last N tokens) chunk by chunk through the prefetch\n"
    "ring, then take N decode steps together (one batched round of reads per step),\n"
    "applying layers 1 and 14 to a deterministic residual (engram apply's seed:1+b\n"
    "for session b).  Reads start when a token is known and are waited for at the\n"
    "Engram layers only (--no-overlap: waited for before layer 0; --no-prefetch:\n"
    "each prompt chunk read serially before its layers).  --device cuda: the Engram\n"
    "layers run on the GPU (rows delivered raw into page-locked buffers, copied up\n"
    "asynchronously per call; more than 64 tokens a call on the tensor cores, sums\n"
    "promoted to F32); cuda-fma: every sum by F32 FMAs on the CUDA cores.\n"
    "Reports prefill and decode tokens/s, step latency p50/p99, rows requested vs\n"
    "distinct rows read, read time, the I/O engine, page-cache growth of the tables'\n"
    "part of the model file and an FNV-1a 64 checksum of the final residuals (of\n"
    "every token, session by session).  Read time, summed over steps (prompts):\n"
    "  span     a decode step's begin to its last row of either table (both from\n"
    "           engram_step_get_info); a prompt's engram_prefill_begin call to the\n"
    "           engine seeing every chunk read (a wait's return or a look at\n"
    "           engram_prefill_ready between layers; how late it may be is shown);\n"
    "           --no-prefetch: the serial reads' own time\n"
    "  exposed  the engine thread's time inside engram_step_wait (prefill:\n"
    "           engram_prefill_wait) within the span\n"
    "  hidden   span - exposed: reads while the engine ran layers or applies (or\n"
    "           was not running); the part still inside the begin call is shown\n"
    "  after    time inside the waits after the span (wake-up, rows already in)\n"
    "Per table (decode): each table's own span and exposed time; they overlap.\n"
    "--json names them read_span_ns, exposed_wait_ns, hidden_ns,\n"
    "hidden_in_begin_ns, wait_outside_span_ns, with a \"definitions\" object.\n"
    "A PLE model (qwen4exp, the family's second member) runs the same way with its\n"
    "one layer where the file puts it (16 rows per token, one table), each session's\n"
    "convolution state carried by the pool (engram_prefill_apply;\n"
    "engram_step_apply_batch: every session's token in one pass): on the CPU, with\n"
    "prefetch.\n"
    ;
static const char *run_help2 =
    "--shard: the run as one of N MPI ranks (mpirun -np N engram run ... --shard;\n"
    "needs engram-mpi.so, built where mpicc is found, next to the binary or in\n"
    "../lib/engram/, or at $ENGRAM_MPI_PLUGIN; without it: exit 1).  Tensor-\n"
    "parallel by default: every rank runs the same sessions and tokens, its pool\n"
    "reads only its block of each table's rows (sharded: rows\n"
    "[r R/N, (r+1) R/N)), and each step's (prefill chunk's) rows of a table are\n"
    "combined across the ranks before the layer applies them: every rank computes\n"
    "the one-process residuals.  A step's rows: one non-blocking MPI_Iallreduce\n"
    "(bitwise OR; a few tens of KB: latency, not bytes, is its cost); a prefill\n"
    "chunk's: MPI_Iallgatherv of the rows each rank owns (half the bytes of an\n"
    "allreduce; --prefill-method combine: the allreduce instead).  Each is begun as\n"
    "soon as the rank's reads of it are in and progressed between layers.\n"
    "--dp: data-parallel, rank r runs sessions r, r+N, ... of the B on an unsharded\n"
    "pool, nothing combined; the checksum is chained across the ranks in session\n"
    "order, the one-process checksum.  Shard files (engram shard): MODEL may say %r\n"
    "for the rank and %n for the world (DIR/NAME.shard-%r-of-%n.gguf); each rank\n"
    "must get its own file of one whole set.  TP reads its block; --dp gets each\n"
    "token's rows from their owners (the DP exchange: ids out, rows back, one\n"
    "MPI exchange per step or 2,048-token prompt chunk, begun before layer 0).\n"
    "Rank 0 prints the report (its own figures) with every rank's rows read per\n"
    "token, the combine's (exchange's) bytes per token and time, and the part of\n"
    "it hidden behind layers.  V4.1 on the CPU only; TP\n"
    "needs prefetch; --dp needs --sessions >= N.  One rank (no mpirun): a plain\n"
    "run, said so.  A combine not complete within SEC seconds (--shard-timeout,\n"
    "default 120: a rank died or stalled) fails the run, naming the timeout, and\n"
    "ends the job (MPI_Abort).\n"
    "Defaults: the demo model next to the engram binary (demo.gguf, written there\n"
    "by engram build the first time) and the bundled GPL-3 token stream; N 64,\n"
    "B 4, L 43, X 100; --threads (the workers of each Engram layer's applier, the\n"
    "engine's thread included): the CPUs this process may run on (its affinity\n"
    "mask, as nproc counts it; under mpirun, what each rank is bound to).  FILE\n"
    "holds at most 2^24 tokens (a longer one is refused as it is read: exit 1);\n"
    "each token's residual is kept, S x W x 4 bytes (1 KiB on the demo model,\n"
    "80 KiB at W = 5120).  Exit codes as for every command.\n";

/* ------------------------------------------------------------ helpers */

/* Resident pages of the model file's bytes [lo, hi) (the model's open
 * checked that the tables lie inside the file), or -errno. */
static int64_t model_resident_pages(const char *path, uint64_t lo, uint64_t hi)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int64_t n = resident_pages(fd, lo, hi);
    close(fd);
    return n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t quantile(uint64_t *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static void progress(struct run *R, const char *what, size_t done, size_t total)
{
    if (!R->tty)
        return;
    int w = 30, k = total ? (int)((double)done / (double)total * w) : w;
    fprintf(stderr, "\r%-8s [", what);
    for (int i = 0; i < w; i++)
        fputc(i < k ? '#' : '.', stderr);
    fprintf(stderr, "] %zu/%zu", done, total);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* The demo model next to the binary, written once; says why not. */
static int default_model(char *path, size_t n)
{
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0 || (size_t)k >= sizeof exe - 1) {
        fprintf(stderr, "%s: run: cannot find the binary's directory for the demo model "
                "(/proc/self/exe: %s); give --model\n", prog, strerror(k < 0 ? errno : ENAMETOOLONG));
        return -1;
    }
    exe[k] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(path, n, "%s/demo.gguf", exe);
    if (access(path, R_OK) == 0)
        return 0;
    fprintf(stderr, "%s: writing the demo model %s (once)\n", prog, path);
    char a0[] = "build", a2[] = "--base", a3[] = "16000", a4[] = "--width", a5[] = "64",
         a6[] = "--fill", a7[] = "normal", a8[] = "--seed", a9[] = "1";
    char *argv[] = {a0, path, a2, a3, a4, a5, a6, a7, a8, a9, NULL};
    int saved = dup(1);
    if (saved >= 0)
        dup2(2, 1); /* build's report to stderr */
    int rc = cmd_build(10, argv);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, 1);
        close(saved);
    }
    if (rc != 0)
        fprintf(stderr, "%s: run: cannot write the demo model next to the binary\n", prog);
    return rc == 0 ? 0 : -1;
}


/* ------------------------------------------------------------ the command */

struct run_opts;
static int check_member(const struct run *R, const struct run_opts *o, const engram_model_info *mi);

/* The command line of a run. */
struct run_opts {
    const char *path, *tok_path, *device;
    uint64_t N, B, L, X, threads;  /* --decode, --sessions, --layers, --layer-us, --threads */
    int json, overlap, prefetch;
    int shard, dp;                 /* --shard, --dp */
    int pmethod;                   /* --prefill-method: 0 not given, 1 gather, 2 combine */
    uint64_t shard_timeout;        /* --shard-timeout SEC (0: not given, 120 s) */
};

/* 0, or the exit code of a usage error (printed). */
static int parse_run_opts(int argc, char **argv, struct run_opts *o)
{
    *o = (struct run_opts){.device = "cpu", .N = 64, .B = 4, .L = 43, .X = 100,
                           .threads = engram_default_threads(),
                           .overlap = 1, .prefetch = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *dst = !strcmp(a, "--decode") ? &o->N : !strcmp(a, "--sessions") ? &o->B
                      : !strcmp(a, "--layers") ? &o->L : !strcmp(a, "--layer-us") ? &o->X
                      : !strcmp(a, "--threads") ? &o->threads
                      : !strcmp(a, "--shard-timeout") ? &o->shard_timeout : NULL;
        if (dst) {
            uint64_t max = dst == &o->B ? 1024 : dst == &o->L ? 1000
                         : dst == &o->threads ? ENGRAM_APPLY_MAX_THREADS
                         : dst == &o->X ? 10000000 : dst == &o->shard_timeout ? 86400 : 100000000;
            if (i + 1 >= argc || parse_u64(argv[i + 1], max, dst) < 0)
                return fail_usage("run: %s takes a number <= %" PRIu64, a, max);
            if (dst == &o->shard_timeout && *dst == 0)
                return fail_usage("run: --shard-timeout takes seconds >= 1");
            i++;
        } else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            o->tok_path = argv[++i];
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            o->device = argv[++i];
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--no-overlap")) {
            o->overlap = 0;
        } else if (!strcmp(a, "--no-prefetch")) {
            o->prefetch = 0;
        } else if (!strcmp(a, "--shard")) {
            o->shard = 1;
        } else if (!strcmp(a, "--dp")) {
            o->dp = 1;
        } else if (!strcmp(a, "--prefill-method") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "gather") != 0 && strcmp(v, "combine") != 0)
                return fail_usage("run: --prefill-method is gather or combine, not '%s'", v);
            o->pmethod = !strcmp(v, "combine") ? 2 : 1;
        } else if (a[0] == '-') {
            return fail_usage("run: unknown option '%s'", a);
        } else if (!o->path) {
            o->path = a;
        } else {
            return fail_usage("run: more than one MODEL");
        }
    }
    if (o->B == 0 || o->threads == 0 || o->L == 0)
        return fail_usage("run: --sessions, --threads and --layers are >= 1");
    if (!dev_name_ok(o->device))
        return fail_usage("run: unknown device '%s' (cpu, cuda or cuda-fma)", o->device);
    if (o->dp && !o->shard)
        return fail_usage("run: --dp is a mode of --shard");
    if (o->pmethod && (!o->shard || o->dp))
        return fail_usage("run: --prefill-method is an option of --shard without --dp");
    if (o->shard_timeout && !o->shard)
        return fail_usage("run: --shard-timeout is an option of --shard");
    if (o->shard && strcmp(o->device, "cpu") != 0)
        return fail_usage("run: --shard runs on the CPU (the ranks' rows are combined in host memory; "
                          "the GPU combine is NCCL's, not built into engram run)");
    if (o->shard && !o->dp && !o->prefetch)
        return fail_usage("run: --shard without --dp needs prefetch (the serial reads of --no-prefetch "
                          "are not sharded)");
    return 0;
}

/* What a PLE model's run takes: the CPU (the session's convolution state
 * is applied on the host: engram_step_apply), prefetch (the state travels
 * with the prefill), a layer count past its layer.  0 or an exit code
 * after saying why not. */
static int check_member(const struct run *R, const struct run_opts *o, const engram_model_info *mi)
{
    if (R->ple && o->shard) {
        fprintf(stderr, "%s: run: '%s' is a %s model: --shard is V4.1's (a PLE layer's rows carry the "
                "sessions' convolution state through engram_step_apply, which takes the whole rows of "
                "one process)\n", prog, o->path, mi->family.name);
        return EXIT_DATA;
    }
    if (!R->ple)
        return o->L < 15 ? fail_usage("run: --layers >= 15 (Engram at 1 and 14)") : 0;
    if (strcmp(o->device, "cpu") != 0) {
        fprintf(stderr, "%s: run: '%s' is a %s model: its run applies on the CPU (the sessions' "
                "convolution state is kept on the host; the CUDA output stage is for engines: "
                "cuda/ple_cuda.h)\n", prog, o->path, mi->family.name);
        return EXIT_DATA;
    }
    if (!o->prefetch) {
        fprintf(stderr, "%s: run: '%s' is a %s model: --no-prefetch is V4.1's (the PLE state "
                "travels with the prefill: engram_prefill_apply)\n", prog, o->path, mi->family.name);
        return EXIT_DATA;
    }
    if (o->L <= R->at[0])
        return fail_usage("run: --layers must be more than %u (the PLE layer of this model)", R->at[0]);
    return 0;
}

/* The token stream (--tokens, or a copy of the bundled one), long enough
 * for B slices of N decode tokens and a prompt token each: 0 (the caller
 * frees *tokens), or an exit code after saying why not. */
static int load_stream(const struct run_opts *o, uint32_t **tokens, size_t *n)
{
    if (o->tok_path) {
        int st = read_numbers(o->tok_path, UINT32_MAX, tokens, n, "token");
        if (st)
            return st;
    } else {
        *n = engram_bundled_tokens_n;
        *tokens = malloc(*n * sizeof **tokens);
        if (!*tokens)
            return fail_oom("run: the bundled tokens", *n * sizeof **tokens);
        memcpy(*tokens, engram_bundled_tokens, *n * sizeof **tokens);
    }
    if (*n / o->B < o->N + 1) {
        free(*tokens);
        *tokens = NULL;
        fprintf(stderr, "%s: run: %zu tokens give %u sessions %zu each: fewer than --decode %" PRIu64
                        " + 1\n", prog, *n, (unsigned)o->B, *n / o->B, o->N);
        return EXIT_DATA;
    }
    return 0;
}

/* Layers 1 and 14 and the device that applies each; the rows' form that
 * device wants.  0 or a negative errno. */
static int open_layers(struct run *R, const struct run_opts *o, engram_error *err)
{
    int rc = 0;
    for (unsigned t = 0; t < R->tables && rc == 0; t++) {
        rc = engram_layer_open(R->m, (int)t, &R->L[t], err);
        if (rc == 0)
            rc = dev_open(o->device, R->L[t], (unsigned)o->threads, ENGRAM_BATCH_TOKENS, &R->D[t], err);
    }
    R->rdt = R->D[0] ? dev_rows_dtype(R->D[0]) : ENGRAM_BF16;
    R->rowb = R->rdt == ENGRAM_RAW ? ENGRAM_ROW_BYTES : ENGRAM_ROW_VALUES * 2;
    if (R->ple) { /* BF16 rows of 160 values (RAW is the same bytes) */
        R->rowb = 320;
        R->ple_a = dev_cpu_applier(R->D[0]);
    }
    return rc;
}

/* The pool, the step buffers and the prefills' ring; *li: the layers'
 * shape.  0 or a negative errno. */
static int open_pool(struct run *R, engram_layer_info *li, engram_error *err)
{
    engram_pool_opts po;
    memset(&po, 0, sizeof po);
    /* on a GPU: the reader's buffers page-locked, where reads land */
    dev_host_hooks(R->D[0], &po.reader.host);
    if (R->sh.tp || R->sh.xdp) { /* this rank's row block only */
        po.shard_rank = (unsigned)R->sh.rank;
        po.shard_world = (unsigned)R->sh.world;
    }
    int rc = engram_pool_open(R->m, &po, &R->pool, err);
    if (rc)
        return rc;
    engram_layer_get_info(R->L[0], li);
    unsigned B = R->B;
    R->per = (size_t)li->streams * li->width;
    R->ss = calloc(B, sizeof *R->ss);
    R->step_lat = malloc((R->N ? R->N : 1) * sizeof *R->step_lat);
    R->waits = malloc(2 * B * sizeof *R->waits);
    R->outs = malloc(B * ENGRAM_ROWS_PER_TOKEN * 512); /* room for BF16 or raw rows of either member */
    R->xs = malloc(B * (R->per ? R->per : 1) * 4);
    if (!R->ss || !R->step_lat || !R->waits || !R->outs || !R->xs)
        return -ENOMEM;
    if (R->prefetch) { /* one ring for every prompt */
        engram_prefill_opts o = run_prefill_opts(R);
        R->ring_len = engram_prefill_ring_bytes(&o);
        R->ring = aligned_alloc(4096, (R->ring_len + 4095) / 4096 * 4096);
        if (!R->ring)
            return -ENOMEM;
    }
    if (R->sh.tp && shard_alloc(&R->sh, B, R->rowb) < 0)
        return -ENOMEM;
    if (R->D[0]) { /* page-locked for the GPU's copies (one registration serves both layers) */
        dev_pin(R->D[0], R->outs, B * ENGRAM_ROWS_PER_TOKEN * 512);
        dev_pin(R->D[0], R->xs, B * R->per * 4);
        if (R->ring)
            dev_pin(R->D[0], R->ring, R->ring_len);
    }
    return 0;
}

/* A session per slice of the n tokens, its residual engram apply's
 * seed:1+b (b: its index in the whole run; --dp: this rank's are rank,
 * rank + world, ...).  0 or a negative errno. */
static int open_sessions(struct run *R, const uint32_t *tokens, size_t n, engram_error *err)
{
    size_t slice = n / R->sh.sessions;
    int rc = 0;
    for (unsigned i = 0; i < R->B && rc == 0; i++) {
        struct sess *q = &R->ss[i];
        unsigned b = R->sh.dp ? (unsigned)R->sh.rank + i * (unsigned)R->sh.world : i;
        q->index = b;
        q->tok = tokens + (size_t)b * slice;
        q->len = slice;
        q->prompt = slice - R->N;
        q->x = malloc(slice * R->per * 4);
        if (!q->x)
            return -ENOMEM;
        cli_seeded_resid(1 + b, 0, slice * R->per, q->x);
        dev_pin(R->D[0], q->x, slice * R->per * 4);
        rc = engram_session_open(R->pool, &q->s, err);
    }
    return rc;
}

/* Prefill, session by session, then the decode steps, each phase timed;
 * *prompt_tokens: the tokens prefilled.  0 or a negative errno. */
static int simulate(struct run *R, size_t *prompt_tokens, engram_error *err)
{
    int rc = 0;
    uint64_t t0 = run_ns_now();
    if (R->sh.xdp) /* --dp on shard files: rows through the exchange */
        rc = shard_dp_prefill(R, prompt_tokens, err);
    for (unsigned b = 0; b < R->B && rc == 0 && !R->sh.xdp; b++) {
        rc = run_prefill(R, &R->ss[b], err);
        *prompt_tokens += R->ss[b].prompt;
        progress(R, "prefill", b + 1, R->B);
    }
    R->prefill_ns = run_ns_now() - t0;
    t0 = run_ns_now();
    for (size_t s = 0; s < R->N && rc == 0; s++) {
        rc = run_decode_step(R, s, err);
        if (s % 8 == 7 || s + 1 == R->N)
            progress(R, "decode", s + 1, R->N);
    }
    R->decode_ns = run_ns_now() - t0;
    return rc;
}

/* The report of a run that completed: its figures, the pool's, the
 * page-cache growth of the tables (pages0 before, pages1 after, or -errno)
 * and the checksum of every session's final residuals; --shard: every
 * rank's figures, gathered (a collective), printed by rank 0.  0 or a
 * negative errno. */
static int report(const struct run *R, const struct run_opts *opt, const engram_layer_info *li,
                  size_t prompt_tokens, int64_t pages0, int64_t pages1, engram_error *err)
{
    uint64_t fnv = 0;
    int rc = shard_checksum(R, &fnv, err);
    struct report o = {.path = opt->path, .device = opt->device, .layer_us = opt->X,
                       .threads = opt->threads, .li = *li, .prompt_tokens = prompt_tokens, .fnv = fnv};
    engram_pool_get_stats(R->pool, &o.ps);
    uint64_t *all = NULL;
    if (rc == 0 && R->sh.mp) {
        uint64_t mine[RK_FIELDS] = {
            [RK_DEC_READ] = o.ps.step_rows_read, [RK_DEC_REQ] = o.ps.step_rows_requested,
            [RK_DEC_TOKENS] = R->n_steps * R->B, [RK_PRE_READ] = o.ps.prefill_rows_read,
            [RK_PRE_TOKENS] = prompt_tokens, [RK_SESSIONS] = R->B, [RK_FNV] = fnv,
            [RK_COMB_BYTES] = R->sh.dec.bytes + R->sh.pre.bytes, [RK_COMB_TOTAL] = R->sh.dec.total_ns,
            [RK_COMB_EXPOSED] = R->sh.dec.exposed_ns, [RK_PRE_RECV] = R->sh.pre_recv};
        shard_dp_figures(R, mine);
        all = calloc((size_t)R->sh.world * RK_FIELDS, sizeof *all);
        rc = all ? shard_gather(R, mine, all, err) : -ENOMEM;
        o.ranks = all;
        o.checksums_agree = 1;
        for (int r = 1; rc == 0 && R->sh.tp && r < R->sh.world; r++)
            o.checksums_agree &= all[r * RK_FIELDS + RK_FNV] == fnv;
    }
    if (rc || R->sh.rank != 0) {
        free(all);
        return rc;
    }
    o.p50 = quantile(R->step_lat, R->n_steps, 0.5);
    o.p99 = quantile(R->step_lat, R->n_steps, 0.99);
    o.growth = pages0 >= 0 && pages1 >= 0 ? pages1 - pages0 : 0;
    o.count_err = (int)(pages0 < 0 ? pages0 : pages1 < 0 ? pages1 : 0);
    if (opt->json)
        run_print_json(R, &o);
    else
        run_print_text(R, &o);
    free(all);
    return 0;
}

/* What every rank must have alike: the options that shape the collectives
 * and the tokens (FNV-1a 64). */
static uint64_t run_identity(const struct run_opts *o, const uint32_t *tokens, size_t n)
{
    uint64_t v[] = {o->N, o->B, o->L, (uint64_t)o->overlap, (uint64_t)o->prefetch, (uint64_t)o->dp, n};
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof v; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    p = (const unsigned char *)tokens;
    for (size_t i = 0; i < n * sizeof *tokens; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Everything open_layers, open_pool and open_sessions opened, in any state. */
static void close_run(struct run *R)
{
    for (unsigned b = 0; b < R->B && R->ss; b++) {
        engram_session_close(R->ss[b].s);
        free(R->ss[b].x);
    }
    engram_pool_close(R->pool);
    for (int t = 0; t < 2; t++) {
        dev_close(R->D[t]);
        engram_layer_close(R->L[t]);
    }
    (void)R->ple_a; /* D[0]'s, closed with it */
    shard_dp_close(&R->sh);
    engram_model_close(R->m);
    free(R->ss);
    free(R->step_lat);
    free(R->waits);
    free(R->outs);
    free(R->xs);
    free(R->ring);
}

/* The run once MPI (if --shard) is up: its figures left in *Rp for the
 * tear-down.  0 or an exit code. */
static int run_body(const struct run_opts *op, struct run *Rp)
{
    struct run_opts o = *op;
    int st;
    char defpath[4200];
    if (!o.path) {
        /* the demo model written once: by rank 0 while the others wait */
        int me = Rp->sh.mp ? Rp->sh.rank : 0, wrote = -1;
        if (me == 0)
            wrote = default_model(defpath, sizeof defpath);
        if (Rp->sh.mp && (st = shard_agree(&Rp->sh, 0)) != 0)
            return st;
        if (me != 0)
            wrote = default_model(defpath, sizeof defpath);
        if (wrote < 0)
            return EXIT_SYSTEM;
        o.path = defpath;
    }
    uint32_t *tokens = NULL;
    size_t n = 0;
    st = load_stream(&o, &tokens, &n);
    if (st)
        return st;
    if (Rp->sh.mp) {
        if (o.dp && Rp->sh.world > 1 && o.B < (uint64_t)Rp->sh.world) {
            free(tokens);
            return fail_usage("run: --dp over %d ranks needs --sessions >= %d (rank r runs sessions "
                              "r, r + %d, ...)", Rp->sh.world, Rp->sh.world, Rp->sh.world);
        }
        if ((st = shard_agree(&Rp->sh, run_identity(&o, tokens, n))) != 0) {
            free(tokens);
            return st;
        }
    }

    struct run R = *Rp;
    R.sh.sessions = (unsigned)o.B;
    R.B = R.sh.dp ? (unsigned)((o.B - (uint64_t)R.sh.rank + (uint64_t)R.sh.world - 1) / (uint64_t)R.sh.world)
                  : (unsigned)o.B;
    R.layers = (unsigned)o.L;
    R.N = (unsigned)o.N;
    R.layer_us = o.X;
    R.overlap = o.overlap;
    R.prefetch = o.prefetch;
    R.tty = isatty(2);
    char rpath[4200];
    if (R.sh.mp && shard_model_path(&R.sh, o.path, rpath, sizeof rpath) == 0)
        o.path = rpath; /* a shard file per rank: %r, %n */
    st = open_model_any(o.path, &R.m);
    /* every rank: a whole file each, or each its shard of one set */
    int sst = R.sh.mp ? shard_model_check(&R.sh, st ? NULL : R.m) : 0;
    if (st || sst) {
        engram_model_close(R.m);
        free(tokens);
        *Rp = R;
        return st ? st : sst;
    }
    engram_model_info mi;
    engram_model_get_info(R.m, &mi);
    R.ple = mi.family.member == ENGRAM_MEMBER_PLE;
    R.tables = mi.family.tables;
    R.rpt = mi.family.tables * mi.family.rows_per_token;
    R.at[0] = R.ple ? mi.family.layers[0] : 1;
    R.at[1] = R.ple ? UINT32_MAX : 14;
    st = check_member(&R, &o, &mi);
    if (st) {
        engram_model_close(R.m);
        free(tokens);
        *Rp = R;
        return st; /* every rank refuses alike: MPI ends normally */
    }
    R.sh.agreed = R.sh.mp != NULL;
    engram_error err = {0};
    int rc = open_layers(&R, &o, &err);
    const engram_table_info *last = &mi.table[R.tables - 1];
    uint64_t tab_lo = mi.table[0].offset, tab_hi = last->offset + last->bytes;
    if (tab_lo > last->offset) /* the tables' span, whatever their order */
        tab_lo = last->offset, tab_hi = mi.table[0].offset + mi.table[0].bytes;
    /* the tables' resident pages, after the weights were loaded */
    int64_t pages0 = model_resident_pages(o.path, tab_lo, tab_hi);
    engram_layer_info li = {0};
    if (rc == 0)
        rc = open_pool(&R, &li, &err);
    if (rc == 0)
        rc = open_sessions(&R, tokens, n, &err);
    size_t prompt_tokens = 0;
    if (rc == 0)
        rc = simulate(&R, &prompt_tokens, &err);
    int64_t pages1 = model_resident_pages(o.path, tab_lo, tab_hi);

    if (rc < 0)
        st = rc == -ENOENT ? (fprintf(stderr, "%s: run: %s\n", prog, err.msg), EXIT_DATA)
                           : fail_lib(rc, &err, "run");
    else if ((rc = report(&R, &o, &li, prompt_tokens, pages0, pages1, &err)) < 0)
        st = fail_lib(rc, &err, "run: --shard");
    close_run(&R);
    free(tokens);
    *Rp = R;
    return st;
}

int cmd_run(int argc, char **argv)
{
    if (has_help(argc, argv)) {
        fputs(run_help, stdout);
        fputs(run_help2, stdout);
        return 0;
    }
    struct run_opts o;
    int st = parse_run_opts(argc, argv, &o);
    if (st)
        return st;
    struct run R;
    memset(&R, 0, sizeof R);
    R.sh.pgather = o.pmethod != 2;
    if (o.shard && (st = shard_start(&R.sh, o.dp)) != 0)
        return st;
    R.sh.timeout_ns = o.shard_timeout * 1000000000ull;
    st = run_body(&o, &R);
    /* a rank that failed once the ranks agreed may leave its peers in a
     * collective it will never join: the job is ended (MPI_Abort) */
    shard_end(&R.sh, st != 0 && R.sh.agreed);
    return st;
}
