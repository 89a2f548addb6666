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
    const uint32_t *tok;   /* its slice                                  */
    size_t len, prompt;    /* slice length, prompt tokens                */
    float *x;              /* [len][S][W] its residual stream            */
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
};

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

/* The report: one JSON object, or the text with its legend. */
void run_print_json(const struct run *R, const struct report *o);
void run_print_text(const struct run *R, const struct report *o);

#endif
