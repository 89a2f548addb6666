/*
 * race_abort_begin.c - issue #20's defect 1 as it was found: T threads,
 * each with its own session on one pool, doing begin(A) -> abort ->
 * begin(B) -> wait for both tables -> compare B's 48 rows with plain reads
 * (engram_model_read_bf16) -> commit, for a given time.  The output buffer
 * is filled with 0xFF before each begin(B), so a row the step never wrote
 * shows.  Uses only the calls of 0.1.0, so that it builds against the
 * library before the fix too (it found 1-14 bad steps in 30-40 s there).
 *   race_abort_begin [--threads 3] [--seconds 30] [MODEL]
 * Prints the steps done and the bad ones; exit 1 if any.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "testutil.h"

static engram_model *model;
static engram_pool *pool;
static double deadline;
static atomic_ullong n_steps, n_bad, n_unwritten;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *work(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    engram_session *s;
    engram_error err;
    if (engram_session_open(pool, &s, &err) < 0)
        return NULL;
    static _Thread_local uint16_t a[48 * 256], b[48 * 256], want[48 * 256];
    uint32_t vocab = engram_model_layout(model)->vocab;
    while (now() < deadline) {
        uint32_t ta = (uint32_t)(tu_rand(&rng) % vocab), tb = (uint32_t)(tu_rand(&rng) % vocab);
        engram_history h;
        engram_session_history(s, &h);
        if (engram_step_begin(s, &ta, NULL, 1, ENGRAM_BF16, a, &err) < 0)
            break;
        engram_step_abort(s);
        memset(b, 0xff, sizeof b);
        if (engram_step_begin(s, &tb, NULL, 1, ENGRAM_BF16, b, &err) < 0)
            break;
        int rc = engram_step_wait(s, 0, &err);
        if (rc == 0)
            rc = engram_step_wait(s, 1, &err);
        uint32_t ids[48];
        engram_hash_token(engram_model_hasher(model), &h, tb, 0, ids);
        for (int t = 0; t < 2 && rc == 0; t++)
            if (engram_model_read_bf16(model, t, ids + t * 24, 24, want + t * 24 * 256, &err) < 0)
                rc = -1;
        if (rc == 0 && memcmp(b, want, sizeof b) != 0) {
            unsigned unwritten = 0;
            for (int r = 0; r < 48; r++) {
                int all = 1;
                for (int v = 0; v < 256 && all; v++)
                    all = b[r * 256 + v] == 0xffff;
                unwritten += all;
            }
            atomic_fetch_add(&n_bad, 1);
            atomic_fetch_add(&n_unwritten, unwritten);
        }
        engram_step_commit(s, 1, &err);
        atomic_fetch_add(&n_steps, 1);
    }
    engram_session_close(s);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 3;
    double seconds = 30;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else
            path = argv[i];
    }
    if (threads < 1 || threads > 64 || seconds <= 0) {
        fprintf(stderr, "usage: race_abort_begin [--threads 1..64] [--seconds N] [MODEL]\n");
        return 2;
    }
    char built[512];
    if (!path) {
        static uint32_t map[3000];
        engram_layout l;
        if (tu_layout(&l, map, 3000, 2000, 3000) < 0 ||
            tu_build("race.gguf", &l, ENGRAM_FILL_RANDOM, 0, built, sizeof built) < 0)
            return 1;
        path = built;
    }
    engram_error err;
    if (engram_model_open(path, &model, &err) < 0 || engram_pool_open(model, NULL, &pool, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    pthread_t th[64];
    deadline = now() + seconds;
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, work, (void *)(uintptr_t)(1000 + i));
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    engram_pool_close(pool);
    engram_model_close(model);
    tu_cleanup();
    printf("race_abort_begin: %d threads, %.0f s: %llu steps, %llu returned 0 with rows that differ "
           "(%llu rows never written)\n", threads, seconds, (unsigned long long)n_steps,
           (unsigned long long)n_bad, (unsigned long long)n_unwritten);
    return n_bad ? 1 : 0;
}
