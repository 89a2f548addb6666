/*
 * run.h - what the three parts of `engram run` share: the run's state, set
 * up and torn down by the command (run.c), driven by the simulated engine
 * (run_engine.c: prefill and decode, and the timing of their reads) and
 * printed by the report (run_report.c).
 */
#ifndef ENGRAM_RUN_H
#define ENGRAM_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"

/* Read time, summed over decode steps or prompts: the span of the reads,
 * the part of it the engine spent inside the waits (exposed), the rest of
 * the time inside the waits (after the span: wake-up, waits for rows
 * already in), and, for prefill, how late the span's end may have been seen. */
struct reads {
    uint64_t span_ns, exposed_ns, outside_ns, late_ns;
    uint64_t in_begin_ns;  /* of the span's non-waiting part: still inside the begin call */
};

/* One call to engram_step_wait on the engine's thread. */
struct wait {
    uint64_t w0, w1;
    int table;
};

struct sess {
    engram_session *s;
    unsigned index;        /* in the whole run (DP: this rank's are r, r + world, ...) */
    const uint32_t *tok;   /* its slice                                  */
    size_t len, prompt;    /* slice length, prompt tokens                */
    float *x;              /* [len][S][W] its residual stream            */
};

/* A combine's time, summed: from its begin to the return of the wait that
 * needed it (total), and the part inside that wait (exposed); hidden =
 * total - exposed: the engine ran layers or applies meanwhile. */
struct comb {
    uint64_t calls, bytes, total_ns, exposed_ns;
};

/* --shard: the ranks (run_shard.c; the MPI plugin, engram-mpi.so). */
struct shard {
    const struct run_mpi_plugin *mp; /* NULL: one process, no --shard     */
    int rank, world;
    int dp;                /* --dp: sessions split, pools unsharded, no combine */
    int tp;                /* world > 1 and not --dp: pools sharded, rows combined */
    int agreed;            /* the ranks agreed on the run: a failure now ends the job */
    uint64_t timeout_ns;   /* a combine's bound (--shard-timeout; 0: 120 s) */
    unsigned sessions;     /* of the whole run (DP: over every rank)      */
    uint8_t *send[2], *recv[2]; /* TP: a step's table-t rows [B][24][row] */
    uint8_t *pbuf[2];      /* TP: a prefill chunk's combined rows         */
    void *op[2];           /* TP: the step's combines in flight           */
    int began[2];
    uint64_t t_begin[2];
    struct comb dec, pre;
};

struct run {
    engram_model *m;
    /* the member: V4.1 (2 tables, Engram at layers 1 and 14) or PLE (1
     * table, its one layer; a convolution state per session, applied
     * through engram_step_apply / engram_prefill_apply) */
    int ple;
    unsigned tables;       /* 2, 1                                        */
    unsigned at[2];        /* the engine's layers that apply table t      */
    unsigned rpt;          /* rows per token of a step: 48, 16            */
    engram_applier *ple_a; /* PLE: the CPU applier (D[0]'s)               */
    engram_pool *pool;
    engram_layer *L[2];
    struct dev *D[2];
    int rdt;               /* rows as the device wants them: BF16 or raw  */
    size_t rowb;           /* bytes of one row in that form               */
    struct sess *ss;
    unsigned B, layers, N;
    uint64_t layer_us;
    int overlap, prefetch, tty;
    size_t per;            /* S x W                                       */
    /* measurements (what they cover: run_report.c's definitions) */
    uint64_t prefill_ns, decode_ns;
    struct reads pre, dec;
    uint64_t dec_read_t[2], dec_exposed_t[2]; /* per table                */
    struct wait *waits;    /* [2B] the waits of the step in progress       */
    size_t n_waits;
    uint64_t begun_ns;     /* when the step's begin call returned          */
    uint64_t *step_lat;
    size_t n_steps;
    unsigned inconsistent; /* figures that broke their own definitions     */
    uint8_t *outs;         /* [B][rpt] rows: step deliveries              */
    float *xs;             /* [B][S][W] residual rows of one step          */
    uint8_t *ring;         /* the prefills' rings, allocated (and pinned) once */
    size_t ring_len;
    struct shard sh;
};

/* What the report prints beside the run's own figures. */
struct report {
    const char *path, *device;
    uint64_t layer_us, threads;
    engram_layer_info li;
    size_t prompt_tokens;
    engram_pool_stats ps;
    uint64_t p50, p99;
    int64_t growth;
    int count_err;
    uint64_t fnv;
    /* --shard: every rank's figures (rank 0's report), world x RANK_FIELDS */
    const uint64_t *ranks;
    int checksums_agree;   /* TP: every rank's residuals the same         */
};

/* The figures each rank sends to rank 0 (struct report.ranks). */
enum { RK_DEC_READ, RK_DEC_REQ, RK_DEC_TOKENS, RK_PRE_READ, RK_PRE_TOKENS, RK_SESSIONS, RK_FNV,
       RK_COMB_BYTES, RK_COMB_TOTAL, RK_COMB_EXPOSED, RK_FIELDS };

/* CLOCK_MONOTONIC in ns: the library's clock (engram_step_get_info). */
uint64_t run_ns_now(void);

/* The prefill options of every prompt of a run (its ring: R->ring). */
engram_prefill_opts run_prefill_opts(const struct run *R);

/* Prefill of one session's prompt through the prefetch ring (or, without
 * prefetch, chunk by chunk with serial reads on the engine's thread),
 * adding its read figures to R->pre.  0 or a negative errno (err filled). */
int run_prefill(struct run *R, struct sess *q, engram_error *err);

/* Decode step `step` of every session together, adding its latency to
 * R->step_lat and its read figures to R->dec.  0 or a negative errno. */
int run_decode_step(struct run *R, size_t step, engram_error *err);

/* --shard (run_shard.c).  The plugin loaded and MPI started: 0, or an
 * exit code after saying why not (every rank says it). */
int shard_start(struct shard *sh, int dp);
/* Every rank ran the same options and tokens (v: their hash): 0 or an exit code. */
int shard_agree(struct shard *sh, uint64_t v);
/* TP: the step buffers for B sessions of rows of rowb bytes: 0 or -ENOMEM. */
int shard_alloc(struct shard *sh, unsigned B, size_t rowb);
/* TP: table t's rows of the step ([B][48] in outs) combined across the
 * ranks and waited for: 0 or a negative errno (err filled). */
int shard_step_begin(struct run *R, int t, engram_error *err);
int shard_step_poll(struct run *R, engram_error *err);
int shard_step_wait(struct run *R, int t, const uint8_t **rows, engram_error *err);
/* TP: a prefill chunk's rows of table t ([k][24][row]) combined; *out the
 * combined rows.  0 or a negative errno. */
int shard_prefill_combine(struct run *R, int t, const void *rows, size_t k, const void **out,
                          engram_error *err);
/* The run's checksum: FNV-1a 64 of every session's residuals in session
 * order, chained across the ranks under --dp (rank 0 gets it); TP and one
 * process: this rank's own.  The ranks' figures gathered to rank 0 (all:
 * world x RK_FIELDS, rank 0 only).  0 or a negative errno. */
int shard_checksum(const struct run *R, uint64_t *fnv, engram_error *err);
int shard_gather(const struct run *R, const uint64_t *mine, uint64_t *all, engram_error *err);
/* Ends MPI (failed: every rank ended, MPI_Abort); frees the buffers. */
void shard_end(struct shard *sh, int failed);

/* The report: one JSON object, or the text with its legend. */
void run_print_json(const struct run *R, const struct report *o);
void run_print_text(const struct run *R, const struct report *o);

#endif
