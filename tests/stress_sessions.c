/*
 * stress_sessions.c - concurrency under load: T threads, each with several
 * sessions on one pool (one model, one reader, one I/O thread), for a given
 * time, doing at random what engines do: decode steps of 1..8 draft tokens
 * with random masks, waited table by table (or polled) and committed with a
 * random j; batched steps over all of the thread's sessions; steps aborted
 * at once (their buffers must not be written afterwards); prefills of
 * random length chunk by chunk, ended or cancelled midway, or their session
 * closed under them; snapshots and restores; a step begun, aborted and
 * another begun at once (the pattern of #20's defect 1); steps of k draft
 * tokens for every session of the thread at once (engram_step_begin_many);
 * waits with short time limits, repeated when they run out.  Every row delivered is compared with the serial answer: the
 * same tokens hashed by engram_hash_tokens from the thread's own copy of the
 * history and decoded from an in-memory copy of the tables (read once with
 * plain reads, decoded with engram_rows_decode_bf16: no reader, no pool, no
 * session involved), and every history with the thread's own.
 *   stress_sessions [--threads T] [--sessions S] [--seconds N] [MODEL]
 * (defaults 64 threads, 3 sessions each, 10 s, a model built in /tmp).
 * Prints the operations done and exits 1 on any difference.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define ROWB (256 * 2)
#define TOKB (48 * ROWB)
#define MAXS 8
#define ALPHABET 3000 /* small: steps of different threads share rows */

static engram_model *model;
static uint8_t *table_raw[2];  /* the tables, read once */
static engram_pool *pool;
static double deadline;
static atomic_int failures;
static atomic_ullong n_steps, n_batches, n_aborts, n_prefills, n_cancels, n_restores, n_rows;
static atomic_ullong n_reborn, n_many, n_timeouts, n_closed_under;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(int id, const char *what)
{
    if (atomic_fetch_add(&failures, 1) < 20)
        fprintf(stderr, "thread %d: %s\n", id, what);
}

/* The serial answer for one row id of table t. */
static void expect_row(int t, uint32_t id, uint16_t *out)
{
    if (engram_rows_decode_bf16(ENGRAM_SIMD_SCALAR, table_raw[t] + (size_t)id * ENGRAM_ROW_BYTES, 1,
                                out, NULL) != 0)
        memset(out, 0xff, ROWB);
}

/* Compares n tokens of rows [n][48][256] (masked ones: still the poison)
 * with the serial answer from history h; advances nothing. */
static int check_rows(const uint32_t *tok, const uint8_t *mask, size_t n, engram_history h,
                      const uint16_t *got, size_t stride_tokens)
{
    uint32_t ids[MAXS * 48];
    uint16_t want[256];
    int bad = 0;
    for (size_t i0 = 0; i0 < n; i0 += MAXS) {
        size_t k = n - i0 < MAXS ? n - i0 : MAXS;
        if (engram_hash_tokens(engram_model_hasher(model), &h, tok + i0, mask ? mask + i0 : NULL, k,
                               ids, NULL) != 0)
            return 1;
        for (size_t i = 0; i < k; i++) {
            const uint16_t *g = got + (i0 + i) * stride_tokens * 48 * 256;
            if (mask && !mask[i0 + i]) {
                for (size_t v = 0; v < 48 * 256; v++)
                    bad |= g[v] != 0xdead;
                continue;
            }
            for (int r = 0; r < 48; r++) {
                expect_row(r / 24, ids[i * 48 + (size_t)r], want);
                bad |= memcmp(want, g + (size_t)r * 256, ROWB) != 0;
            }
        }
    }
    atomic_fetch_add(&n_rows, n * 48);
    return bad;
}

static void poison(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = 0xdead;
}

static int history_is(const engram_session *s, const engram_history *h)
{
    engram_history g;
    engram_session_history(s, &g);
    return memcmp(&g, h, sizeof g) == 0;
}

struct worker {
    int id, n_sess;
    uint64_t rng;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    engram_session *s[MAXS];
    engram_history h[MAXS];
    engram_error err;
    uint16_t *out = malloc((size_t)MAXS * TOKB), *gone = malloc((size_t)MAXS * TOKB);
    uint16_t *bout = malloc((size_t)MAXS * ENGRAM_MAX_DRAFT * TOKB);
    size_t ptok_cap = 4000;
    uint32_t *ptok = malloc(ptok_cap * sizeof *ptok);
    if (!out || !gone || !bout || !ptok) {
        fail(w->id, "out of memory");
        return NULL;
    }
    for (int q = 0; q < w->n_sess; q++) {
        if (engram_session_open(pool, &s[q], &err) < 0) {
            fail(w->id, err.msg);
            return NULL;
        }
        engram_history_reset(&h[q]);
    }
    poison(gone, (size_t)MAXS * 48 * 256);
    while (now() < deadline && atomic_load(&failures) == 0) {
        int q = (int)(tu_rand(&w->rng) % (uint64_t)w->n_sess);
        unsigned op = (unsigned)(tu_rand(&w->rng) % 100);
        if (op < 40) { /* a step of k draft tokens */
            unsigned k = 1 + (unsigned)(tu_rand(&w->rng) % ENGRAM_MAX_DRAFT);
            uint32_t tok[ENGRAM_MAX_DRAFT];
            uint8_t mask[ENGRAM_MAX_DRAFT];
            for (unsigned i = 0; i < k; i++) {
                tok[i] = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
                mask[i] = tu_rand(&w->rng) % 8 != 0;
            }
            poison(out, (size_t)k * 48 * 256);
            if (engram_step_begin(s[q], tok, mask, k, ENGRAM_BF16, out, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            int rc = 0;
            if (op < 15) {
                rc = engram_step_wait(s[q], 0, &err);
                if (rc == 0)
                    rc = engram_step_wait(s[q], 1, &err);
            } else if (op < 30) { /* short limits: -ETIMEDOUT loses nothing */
                for (int t = 0; t < 2 && rc == 0; t++)
                    while ((rc = engram_step_wait_timed(s[q], t, 20000, &err)) == -ETIMEDOUT)
                        atomic_fetch_add(&n_timeouts, 1);
            } else {
                for (int t = 0; t < 2 && rc == 0; t++)
                    while ((rc = engram_step_poll(s[q], t, &err)) == -EAGAIN)
                        sched_yield();
            }
            unsigned j = (unsigned)(tu_rand(&w->rng) % (k + 1));
            if (rc == 0)
                rc = engram_step_commit(s[q], j, &err);
            if (rc < 0) {
                fail(w->id, err.msg);
                break;
            }
            if (check_rows(tok, mask, k, h[q], out, 1))
                fail(w->id, "step rows differ from the serial answer");
            uint32_t ids[ENGRAM_MAX_DRAFT * 48];
            engram_hash_tokens(engram_model_hasher(model), &h[q], tok, mask, j, ids, NULL);
            if (!history_is(s[q], &h[q]))
                fail(w->id, "history after commit differs");
            atomic_fetch_add(&n_steps, 1);
        } else if (op < 48) { /* begin, abort, begin again at once: the second step exact */
            uint32_t ta[2] = {(uint32_t)(tu_rand(&w->rng) % ALPHABET), (uint32_t)(tu_rand(&w->rng) % ALPHABET)};
            uint32_t tb = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
            if (engram_step_begin(s[q], ta, NULL, 2, ENGRAM_BF16, gone, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            engram_step_abort(s[q]);
            poison(gone, 2 * 48 * 256); /* whatever arrived before the abort */
            poison(out, 48 * 256);
            int rc = engram_step_begin(s[q], &tb, NULL, 1, ENGRAM_BF16, out, &err);
            for (int t = 0; t < 2 && rc == 0; t++)
                rc = engram_step_wait(s[q], t, &err);
            if (rc == 0 && check_rows(&tb, NULL, 1, h[q], out, 1))
                fail(w->id, "a step begun right after an abort has rows that differ (or were never written)");
            if (rc == 0)
                rc = engram_step_commit(s[q], 1, &err);
            if (rc < 0) {
                fail(w->id, err.msg);
                break;
            }
            uint32_t ids[48];
            engram_hash_token(engram_model_hasher(model), &h[q], tb, 0, ids);
            if (!history_is(s[q], &h[q]))
                fail(w->id, "history after abort + step differs");
            atomic_fetch_add(&n_reborn, 1);
        } else if (op < 56) { /* k draft tokens for every session at once */
            engram_step_req rq[MAXS];
            uint32_t tok[MAXS][ENGRAM_MAX_DRAFT];
            uint8_t mask[MAXS][ENGRAM_MAX_DRAFT];
            for (int i = 0; i < w->n_sess; i++) {
                unsigned k = 1 + (unsigned)(tu_rand(&w->rng) % ENGRAM_MAX_DRAFT);
                for (unsigned x = 0; x < k; x++) {
                    tok[i][x] = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
                    mask[i][x] = tu_rand(&w->rng) % 8 != 0;
                }
                rq[i] = (engram_step_req){s[i], tok[i], mask[i], k, bout + (size_t)i * ENGRAM_MAX_DRAFT * 48 * 256};
                poison(rq[i].out, (size_t)k * 48 * 256);
            }
            if (engram_step_begin_many(rq, (size_t)w->n_sess, ENGRAM_BF16, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            for (int i = 0; i < w->n_sess; i++) {
                unsigned j = (unsigned)(tu_rand(&w->rng) % (rq[i].k + 1));
                if (engram_step_commit(s[i], j, &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                if (check_rows(tok[i], mask[i], rq[i].k, h[i], rq[i].out, 1))
                    fail(w->id, "begin_many rows differ");
                uint32_t ids[ENGRAM_MAX_DRAFT * 48];
                engram_hash_tokens(engram_model_hasher(model), &h[i], tok[i], mask[i], j, ids, NULL);
                if (!history_is(s[i], &h[i]))
                    fail(w->id, "history after begin_many differs");
            }
            atomic_fetch_add(&n_many, 1);
        } else if (op < 64) { /* a batched step over every session */
            uint32_t tok[MAXS];
            void *outs[MAXS];
            for (int i = 0; i < w->n_sess; i++) {
                tok[i] = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
                outs[i] = bout + (size_t)i * 48 * 256;
            }
            poison(bout, (size_t)w->n_sess * 48 * 256);
            if (engram_step_begin_batch(s, tok, NULL, (size_t)w->n_sess, ENGRAM_BF16, outs, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            for (int i = 0; i < w->n_sess; i++) {
                if (engram_step_wait(s[i], 1, &err) < 0 || engram_step_wait(s[i], 0, &err) < 0 ||
                    engram_step_commit(s[i], 1, &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                if (check_rows(tok + i, NULL, 1, h[i], bout + (size_t)i * 48 * 256, 1))
                    fail(w->id, "batched step rows differ");
                uint32_t ids[48];
                engram_hash_token(engram_model_hasher(model), &h[i], tok[i], 0, ids);
                if (!history_is(s[i], &h[i]))
                    fail(w->id, "history after a batched step differs");
            }
            atomic_fetch_add(&n_batches, 1);
        } else if (op < 72) { /* a step aborted at once: its buffer is never written after */
            uint32_t tok[2] = {(uint32_t)(tu_rand(&w->rng) % ALPHABET), 7};
            if (engram_step_begin(s[q], tok, NULL, 2, ENGRAM_BF16, gone, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            engram_step_abort(s[q]);
            poison(gone, 2 * 48 * 256); /* whatever arrived before the abort */
            if (!history_is(s[q], &h[q]))
                fail(w->id, "history changed by an aborted step");
            atomic_fetch_add(&n_aborts, 1);
        } else if (op < 86) { /* a prefill, ended or cancelled midway, or its session closed */
            size_t n = 1 + (size_t)(tu_rand(&w->rng) % 400);
            for (size_t i = 0; i < n; i++)
                ptok[i] = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
            int cancel = tu_rand(&w->rng) % 4 == 0, close_under = !cancel && tu_rand(&w->rng) % 6 == 0;
            engram_prefill_opts o = {.chunk_tokens = 256, .ring_chunks = 2, .dtype = ENGRAM_BF16};
            engram_prefill *pf;
            if (engram_prefill_begin(s[q], ptok, NULL, n, &o, &pf, &err) < 0) {
                fail(w->id, err.msg);
                break;
            }
            size_t chunks = engram_prefill_chunks(pf), stop = cancel || close_under ? chunks / 2 : chunks;
            engram_history hc = h[q];
            int bad = 0;
            for (size_t c = 0; c < stop && !bad; c++) {
                const void *rows[2];
                size_t first = 0, nt = 0;
                for (int t = 0; t < 2 && !bad; t++)
                    if (engram_prefill_wait(pf, t, c, &rows[t], &first, &nt, &err) < 0) {
                        fail(w->id, err.msg);
                        bad = 1;
                    }
                if (bad)
                    break;
                /* [nt][24][256] per table: compare token by token */
                uint32_t ids[48];
                uint16_t want[256];
                for (size_t i = 0; i < nt && !bad; i++) {
                    engram_hash_token(engram_model_hasher(model), &hc, ptok[first + i], 0, ids);
                    for (int r = 0; r < 48; r++) {
                        expect_row(r / 24, ids[r], want);
                        const uint16_t *g = (const uint16_t *)rows[r / 24] + (i * 24 + (size_t)(r % 24)) * 256;
                        if (memcmp(want, g, ROWB) != 0) {
                            fail(w->id, "prefill rows differ from the serial answer");
                            bad = 1;
                            break;
                        }
                    }
                }
                atomic_fetch_add(&n_rows, nt * 48);
                engram_prefill_release(pf, 0, c);
                engram_prefill_release(pf, 1, c);
            }
            if (close_under && !bad) {
                /* the session goes, the prefill's handle stays: end says so */
                engram_session_close(s[q]);
                int rc = engram_prefill_end(pf, &err);
                if (rc != -ECANCELED)
                    fail(w->id, "a prefill whose session was closed did not end with -ECANCELED");
                if (engram_session_open(pool, &s[q], &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                engram_history_reset(&h[q]);
                atomic_fetch_add(&n_closed_under, 1);
            } else if (cancel || bad) {
                engram_prefill_cancel(pf);
                atomic_fetch_add(&n_cancels, 1);
            } else {
                if (engram_prefill_end(pf, &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                h[q] = hc;
            }
            if (!history_is(s[q], &h[q]))
                fail(w->id, cancel ? "history changed by a cancelled prefill"
                                   : "history after a prefill differs");
            atomic_fetch_add(&n_prefills, 1);
        } else { /* snapshot of one session restored into another, or a rebuild */
            int r = (int)(tu_rand(&w->rng) % (uint64_t)w->n_sess);
            if (tu_rand(&w->rng) % 2) {
                engram_history snap;
                engram_session_history(s[q], &snap);
                if (engram_session_set_history(s[r], &snap, &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                h[r] = h[q];
            } else {
                uint32_t tok[5];
                for (int i = 0; i < 5; i++)
                    tok[i] = (uint32_t)(tu_rand(&w->rng) % ALPHABET);
                if (engram_session_restore(s[r], tok, NULL, 5, &err) < 0) {
                    fail(w->id, err.msg);
                    break;
                }
                engram_history_reset(&h[r]);
                uint32_t ids[5 * 48];
                engram_hash_tokens(engram_model_hasher(model), &h[r], tok, NULL, 5, ids, NULL);
            }
            if (!history_is(s[r], &h[r]))
                fail(w->id, "history after a restore differs");
            atomic_fetch_add(&n_restores, 1);
        }
        for (size_t v = 0; v < 2 * 48 * 256; v++)
            if (gone[v] != 0xdead) {
                fail(w->id, "an aborted step's buffer was written after the abort");
                break;
            }
    }
    for (int q = 0; q < w->n_sess; q++)
        engram_session_close(s[q]);
    free(out);
    free(gone);
    free(bout);
    free(ptok);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 64, per = 3;
    double seconds = 10;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sessions") && i + 1 < argc)
            per = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else
            path = argv[i];
    }
    if (threads < 1 || per < 1 || per > MAXS || seconds <= 0) {
        fprintf(stderr, "usage: stress_sessions [--threads T] [--sessions 1..8] [--seconds N] [MODEL]\n");
        return 2;
    }
    char built[512];
    if (!path) {
        static uint32_t map[ALPHABET];
        engram_layout l;
        if (tu_layout(&l, map, ALPHABET, 2000, 3000) < 0 ||
            tu_build("stress.gguf", &l, ENGRAM_FILL_NORMAL, 64, built, sizeof built) < 0)
            return 1;
        path = built;
    }
    engram_error err;
    if (engram_model_open(path, &model, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* the serial side: the tables in memory, read with plain reads */
    engram_model_info mi;
    engram_model_get_info(model, &mi);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    for (int t = 0; t < 2; t++) {
        table_raw[t] = malloc(mi.table[t].bytes);
        if (fd < 0 || !table_raw[t] ||
            pread(fd, table_raw[t], mi.table[t].bytes, (off_t)mi.table[t].offset) !=
                (ssize_t)mi.table[t].bytes) {
            fprintf(stderr, "cannot read the tables\n");
            return 1;
        }
    }
    close(fd);
    engram_pool_opts po = {.reader = {.depth = 64}};
    if (engram_pool_open(model, &po, &pool, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    pthread_t *th = malloc((size_t)threads * sizeof *th);
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    double t0 = now();
    deadline = t0 + seconds;
    for (int i = 0; i < threads; i++) {
        ws[i] = (struct worker){i, per, 1000 + (uint64_t)i};
        if (pthread_create(&th[i], NULL, work, &ws[i]) != 0) {
            fprintf(stderr, "cannot start thread %d\n", i);
            return 1;
        }
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double el = now() - t0;
    engram_pool_stats st;
    engram_pool_get_stats(pool, &st);
    engram_pool_close(pool);
    engram_model_close(model);
    for (int t = 0; t < 2; t++)
        free(table_raw[t]);
    free(th);
    free(ws);
    if (path == built)
        unlink(built);
    tu_cleanup();
    int f = atomic_load(&failures);
    printf("stress_sessions: %d threads x %d sessions, %.1f s, engine %s: %llu steps (%llu timed "
           "waits ran out and were repeated), %llu batched steps, %llu begin_many, %llu aborts, %llu "
           "abort-then-begin, %llu prefills (%llu cancelled, %llu sessions closed under one), %llu "
           "restores; %llu rows checked against the serial answer; %llu rounds; %d differences\n",
           threads, per, el, st.io.engine, (unsigned long long)n_steps, (unsigned long long)n_timeouts,
           (unsigned long long)n_batches, (unsigned long long)n_many, (unsigned long long)n_aborts,
           (unsigned long long)n_reborn, (unsigned long long)n_prefills, (unsigned long long)n_cancels,
           (unsigned long long)n_closed_under, (unsigned long long)n_restores, (unsigned long long)n_rows,
           (unsigned long long)st.rounds, f);
    return f ? 1 : 0;
}
