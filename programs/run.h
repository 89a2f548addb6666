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

/* A combine's time, summed over its calls: total = from its begin to its
 * completion as the engine saw it (the first poll between layers that
 * found it complete, or the return of the wait that needed it); exposed =
 * the time inside that wait (0 for one complete before it: its wait only
 * collects the result); hidden = total - exposed: the engine ran
 * layers or applies meanwhile.  A completion seen by a poll happened after
 * the poll before it, so total may exceed the combine's own time by at
 * most late_ns (summed); early counts the combines complete before their
 * wait. */
struct comb {
    uint64_t calls, bytes, total_ns, exposed_ns, late_ns, early;
};

/* One combine in flight, as the engine times it. */
struct comb_op {
    void *op;              /* the plugin's op; NULL: none                  */
    uint64_t begin_ns;     /* its begin                                    */
    uint64_t polled_ns;    /* the latest poll that found it incomplete     */
    uint64_t done_ns;      /* the poll that found it complete (0: not yet) */
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
    struct comb_op op[2];  /* TP: the step's combines in flight           */
    int began[2];
    /* TP prefill: the chunks' combines run in one order on every rank,
     * (chunk 0, table 0), (0, 1), (1, 0), ...: pnext is the next to begin.
     * Each begins as soon as this rank's rows of it are read and pbuf[t]
     * is free (its last chunk applied), and is progressed between layers,
     * so it overlaps the layers before its own. */
    engram_prefill *pf;    /* the prompt being prefilled (NULL: none)     */
    size_t pchunks, pnext;
    struct comb_op pop[2]; /* table t's chunk combine in flight           */
    size_t pchunk[2];      /* its chunk                                   */
    int pfull[2];          /* pbuf[t] holds (or is receiving) chunk pchunk[t] */
    /* --prefill-method gather (the default): a chunk's rows move as
     * MPI_Iallgatherv of each rank's owned rows, which needs every
     * position's owner: the chunk's ids hashed here (phist: the history
     * before the chunk pids_chunk + 1), the owners of table t's [k][24]
     * positions in pown.  combine: MPI_Iallreduce of the whole buffer. */
    int pgather;
    uint64_t prows[2];     /* the tables' rows (the owners' split), read at
                              the prompt's start                          */
    engram_history phist;
    const uint32_t *ptok;  /* the prompt's tokens                         */
    uint32_t *pids;        /* [chunk tokens][48]                          */
    uint32_t *pown;        /* [chunk tokens][24]                          */
    size_t pids_chunk;     /* the chunk pids holds (SIZE_MAX: none)       */
    uint64_t pre_recv;     /* gather: bytes of rows this rank received    */
    struct comb dec, pre;
    /* --dp on shard files (run_shard.c, shard_dp_*): every rank holds its
     * block only and gets its tokens' rows through the DP exchange */
    int xdp;
    engram_reader *xrd;    /* this rank's reader, serving the exchanges    */
    engram_history *hist;  /* [B] the sessions' histories                  */
    uint32_t *xids;        /* [2048][48] a chunk's (step's) row ids         */
    uint8_t *xout;         /* [2048][48][row] its rows                      */
    uint64_t xmoved[2][4]; /* decode, prefill: engram_mpi_exchange_info's
                              rows asked, from others, served, sent        */
    uint64_t xread[2];     /* decode, prefill: rows this rank's reader read */
    struct comb xdec, xpre; /* the exchanges' time; bytes: rows from other
                              ranks x (row + 4 B request)                 */
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
       RK_COMB_BYTES, RK_COMB_TOTAL, RK_COMB_EXPOSED, RK_PRE_RECV,
       /* --dp on shard files: the exchange's rows, decode and prefill:
        * asked of other ranks (and received), sent to other ranks */
       RK_X_DEC_REMOTE, RK_X_DEC_SENT, RK_X_PRE_REMOTE, RK_X_PRE_SENT, RK_FIELDS };

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
/* TP: a failed step's combines given up (the job ends after this). */
void shard_step_drop(struct run *R);
/* TP prefill of one prompt: shard_prefill_start before its first chunk;
 * shard_prefill_pump between layers begins the next combines whose rows
 * are read (in the ranks' common order) and progresses those in flight;
 * shard_prefill_combine at chunk c's layer for table t: its combine (begun
 * now if it was not) waited for, *out its rows [k][24][row]; then
 * shard_prefill_done(t) once they are applied (pbuf[t] free again), and
 * shard_prefill_stop at the prompt's end (frees what a failure left).
 * 0 or a negative errno (err filled). */
void shard_prefill_start(struct run *R, engram_prefill *pf, size_t chunks, const uint32_t *tokens,
                         const engram_history *h);
int shard_prefill_pump(struct run *R, engram_error *err);
int shard_prefill_combine(struct run *R, int t, size_t c, const void **out, engram_error *err);
void shard_prefill_done(struct run *R, int t);
void shard_prefill_stop(struct run *R);
/* The run's checksum: FNV-1a 64 of every session's residuals in session
 * order, chained across the ranks under --dp (rank 0 gets it); TP and one
 * process: this rank's own.  The ranks' figures gathered to rank 0 (all:
 * world x RK_FIELDS, rank 0 only).  0 or a negative errno. */
int shard_checksum(const struct run *R, uint64_t *fnv, engram_error *err);
int shard_gather(const struct run *R, const uint64_t *mine, uint64_t *all, engram_error *err);
/* The model (NULL: this rank could not open it) against the ranks': a
 * collective every rank calls after opening the model.  Every rank a
 * shard file or none; shard files: each this rank's of this world, the
 * set whole (engram_shard_set_check); --dp on shard files sets sh->xdp.
 * 0, or an exit code after saying why (every rank refuses alike). */
int shard_model_check(struct shard *sh, const engram_model *m);
/* --dp on shard files: the prefill of every session of this rank, each
 * prompt chunk's rows (2,048 tokens) through the exchange, in rounds every
 * rank takes part in (a rank with no chunk left serves the others with
 * n = 0); *prompt_tokens: this rank's.  A decode step of this rank's
 * sessions, its rows through one exchange.  0 or a negative errno. */
int shard_dp_prefill(struct run *R, size_t *prompt_tokens, engram_error *err);
int shard_dp_step(struct run *R, size_t step, engram_error *err);
/* --dp on shard files: this rank's figures into the report's (reads and
 * the exchange's bytes, beside the pool's, which read nothing). */
void shard_dp_figures(const struct run *R, uint64_t *mine);
/* The reader and buffers of the exchange (before the model is closed). */
void shard_dp_close(struct shard *sh);
/* MODEL with %r replaced by this rank and %n by the world (a shard file
 * per rank: DIR/NAME.shard-%r-of-%n.gguf): 0, or -ENAMETOOLONG. */
int shard_model_path(const struct shard *sh, const char *in, char *out, size_t n);
/* Ends MPI (failed: every rank ended, MPI_Abort); frees the buffers. */
void shard_end(struct shard *sh, int failed);

/* The report: one JSON object, or the text with its legend. */
void run_print_json(const struct run *R, const struct report *o);
void run_print_text(const struct run *R, const struct report *o);

#endif
