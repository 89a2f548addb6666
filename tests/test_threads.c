/*
 * test_threads.c - one model shared by many threads: hashing with separate
 * histories, row reads and decodes must give the single-threaded answers.
 * Each thread also runs its own uncached reader (io_uring, thread pool and
 * buffered engines side by side) on the shared model.  Run under
 * ThreadSanitizer by the suite, where it also proves the shared state
 * (model, hasher, SIMD choice) is read-only after open.
 */
#include <pthread.h>

#include "testutil.h"

#define THREADS 4
#define N 400

static engram_model *model;
static uint32_t tokens[N];
static uint32_t want_rows[N * 48];
static uint16_t want_vals[N * 24 * 256];

struct job {
    int id, failed;
};

static void *worker(void *arg)
{
    struct job *j = arg;
    uint32_t *rows = malloc(N * 48 * sizeof *rows);
    uint16_t *vals = malloc(N * 24 * 256 * sizeof *vals);
    if (!rows || !vals) {
        j->failed = 1;
        free(rows);
        free(vals);
        return NULL;
    }
    for (int rep = 0; rep < 3; rep++) {
        engram_history h;
        engram_history_reset(&h);
        /* Each thread hashes in its own chunking. */
        size_t chunk = (size_t)(j->id * 7 + rep + 1);
        for (size_t at = 0; at < N; at += chunk) {
            size_t k = N - at < chunk ? N - at : chunk;
            if (engram_hash_tokens(engram_model_hasher(model), &h, tokens + at, NULL, k,
                                   rows + at * 48, NULL) < 0)
                j->failed = 1;
        }
        if (memcmp(rows, want_rows, sizeof want_rows) != 0)
            j->failed = 1;
        uint32_t t1[N * 24];
        for (int i = 0; i < N; i++)
            memcpy(t1 + i * 24, rows + i * 48 + 24, 24 * sizeof *t1);
        engram_error err;
        if (engram_model_read_bf16(model, 1, t1, N * 24, vals, &err) < 0 ||
            memcmp(vals, want_vals, sizeof want_vals) != 0)
            j->failed = 1;
        if (engram_simd_selected() == ENGRAM_SIMD_AUTO)
            j->failed = 1;
    }
    /* A reader of this thread's own (engines in turn across threads) beside
     * the others': batch and decode steps equal the single-threaded rows. */
    static const engram_io_engine eng[3] = {ENGRAM_IO_URING, ENGRAM_IO_THREADS, ENGRAM_IO_BUFFERED};
    engram_reader_opts o = {.engine = eng[j->id % 3], .depth = 16};
    engram_reader *r;
    engram_error err;
    if (engram_reader_open(model, &o, &r, &err) < 0) {
        j->failed = 1;
    } else {
        for (int rep = 0; rep < 2; rep++) {
            memset(vals, 0, N * 24 * 256 * sizeof *vals);
            if (engram_reader_batch(r, 1, want_rows, N, ENGRAM_BF16, vals, &err) < 0 ||
                memcmp(vals, want_vals, sizeof want_vals) != 0)
                j->failed = 1;
        }
        for (int i = 0; i < 20; i++) {
            static _Thread_local uint16_t step[48 * 256];
            if (engram_reader_step_submit(r, want_rows + (size_t)i * 48, ENGRAM_BF16, step, &err) < 0 ||
                engram_reader_step_wait(r, &err) < 0 ||
                memcmp(step + 24 * 256, want_vals + (size_t)i * 24 * 256, 24 * 256 * 2) != 0)
                j->failed = 1;
        }
        /* and one abandoned mid-flight */
        static _Thread_local uint16_t step[48 * 256];
        if (engram_reader_step_submit(r, want_rows, ENGRAM_BF16, step, &err) < 0)
            j->failed = 1;
        engram_reader_close(r);
    }
    free(rows);
    free(vals);
    return NULL;
}

int main(void)
{
    static uint32_t map[5000];
    engram_layout l;
    CHECK_EQ(tu_layout(&l, map, 5000, 3000, 20000), 0);
    char path[512];
    CHECK_EQ(tu_build("threads.gguf", &l, ENGRAM_FILL_RANDOM, 0, path, sizeof path), 0);
    engram_error err;
    CHECK_EQ(engram_model_open(path, &model, &err), 0);
    uint64_t seed = 77;
    for (int i = 0; i < N; i++)
        tokens[i] = (uint32_t)(tu_rand(&seed) % 60);
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tokens, NULL, N, want_rows, NULL), 0);
    static uint32_t t1[N * 24];
    for (int i = 0; i < N; i++)
        memcpy(t1 + i * 24, want_rows + i * 48 + 24, 24 * sizeof *t1);
    CHECK_EQ(engram_model_read_bf16(model, 1, t1, N * 24, want_vals, &err), 0);

    pthread_t th[THREADS];
    struct job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (struct job){i, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, worker, &jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(jobs[i].failed, 0);
    }
    engram_model_close(model);
    tu_cleanup();
    return tu_finish("test_threads");
}
