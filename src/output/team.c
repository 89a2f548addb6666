/* team.c - a fork-join team of threads created once (see team.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "team.h"
#include "common/util.h"

/* Workers run kernels with small stack frames; 256 KiB is ample and keeps
 * a team of many threads cheap. */
#define WORKER_STACK (256u << 10)

struct team {
    unsigned workers;            /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long generation;    /* bumped per run */
    unsigned active;             /* workers taking part in this run */
    unsigned pending;            /* of those, still running */
    engram_worker_fn fn;
    void *arg;
    int stop;
};

struct start {
    struct team *p;
    unsigned index;
};

static void *worker(void *varg)
{
    struct start *s = varg;
    struct team *p = s->p;
    unsigned index = s->index;
    free(s);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        if (index >= p->active)
            continue;
        engram_worker_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void team_free(struct team *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 1; i < p->workers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int team_new(unsigned workers, struct team **out)
{
    if (workers == 0)
        return -EINVAL;
    struct team *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->threads = calloc(workers, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->workers = 1;
    int rc = 0;
    for (unsigned i = 1; i < workers && rc == 0; i++) {
        struct start *s = malloc(sizeof *s);
        if (!s) {
            rc = -ENOMEM;
            break;
        }
        *s = (struct start){p, i};
        int e = util_thread_start(&p->threads[i], WORKER_STACK, worker, s);
        if (e < 0) {
            free(s);
            rc = e;
            break;
        }
        p->workers = i + 1;
    }
    if (rc < 0) {
        team_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void team_run(void *vp, unsigned workers, engram_worker_fn fn, void *arg)
{
    struct team *p = vp;
    if (workers > p->workers)
        workers = p->workers;
    if (workers <= 1) {
        fn(arg, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->active = workers;
    p->pending = workers - 1;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
