/*
 * test_interleave.c - the pool's state machine (sessions, steps, prefills,
 * the I/O thread, pool close) under systematically enumerated orderings.
 *
 * The library is built once more with its pause points live
 * (src/serve/sched_points.h, -DENGRAM_SCHED): at every release of a pool, session
 * or prefill lock, at every condition wait and wake, and at the I/O
 * thread's start and end, control comes here.  This scheduler runs one
 * thread at a time (a baton passed with semaphores) and decides at each
 * point who runs next; blocked threads run only once woken, and a thread
 * in a timed wait may also be resumed by a timeout, at any point.  The
 * reader's engine is replaced (link-time --wrap of its constructors) by a
 * deterministic one serving the real model file's bytes from memory: each
 * reap completes up to 8 reads of one submission batch, oldest first, the
 * batch being a choice of the explorer (the device's completion order), so
 * a run is a function of the choices made, and every ordering can be
 * replayed.  That engine never blocks in a reap (it always has a read to
 * complete when asked for one), so the pool's thread never sleeps inside
 * the reader there.  Two more kinds of scenario run the real thread-pool
 * engine (src/io/io_threads.c: pause points after the lock releases of its
 * workers, queue, submit, reap and cancel, not wake's, which the pool calls
 * under its own lock; a signal wakes any one waiter, and its waits may end
 * spuriously): the engine alone under its contract (io_engine.h), and the
 * pool reading through it (one worker, two reads in flight: the I/O thread
 * blocked inside the engine's reap, woken by the sessions' reader_wake), on
 * real preads.  A lost wake-up is found where the scheduler can preempt,
 * at lock releases: a wake() changing the engine's state without its lock
 * could slip between a reap's check and its wait unseen.
 *
 * Each scenario is explored depth-first over those choices, up to a bound
 * on deviations from the default order (the running thread goes on until
 * it blocks, then the next thread round-robin; a timeout is never the
 * default): every ordering with at most that many deviations is run
 * exactly once and counted (delay-bounded search; with two threads, a
 * deviation is a preemption, as in CHESS).  After every
 * step of every ordering the contract is checked:
 *  - a step buffer holds, row by row, either the caller's poison or exactly
 *    the row a plain engram_model_read_bf16 gives (never another step's);
 *  - once abort, commit or close has returned for a step, its buffer never
 *    changes again (for a prefill with caller ring memory: once cancel or
 *    end returned);
 *  - a wait that returns 0 finds every row of its table in place;
 *  - a session's history is always the one its owner committed (it moves
 *    only inside a successful commit or prefill end);
 *  - no ordering deadlocks (a state where nobody can run fails the test
 *    and prints the ordering).
 * Larger scenarios (three sessions) are also sampled at random from a
 * printed seed (ENGRAM_INTERLEAVE_SEED replays one).
 * Some scenarios run again on a sharded pool (shard_rank r of shard_world
 * N, issue #24): the expected rows are then the plain reads for the ids
 * of rank r's row block, [floor(r R / N), floor((r + 1) R / N)) of a
 * table of R rows (computed here, not by the library), and zeros for the
 * others; those foreign rows must be zero as soon as begin returns and
 * stay so (not merely at the wait), and a prefill chunk's too.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <time.h>

#include "testutil.h"
#include "../src/io/io_engine.h"
#define ENGRAM_SCHED 1 /* the hooks' prototypes: defined here */
#include "../src/serve/sched_points.h"

/* ------------------------------------------------------------ the scheduler */

#define MAXT 8
#define MAXDEC 60000

enum { T_RUN = 1, T_CV, T_JOIN, T_DONE };

struct sthread {
    int state;
    const void *cv;              /* T_CV: what it waits on                 */
    int timed, woken;
    int spurious;                /* timed: an unwoken end is spurious (never due) */
    int join;                    /* T_JOIN: whom                           */
    pthread_t pt;
    sem_t go;
};

struct decision {
    uint8_t n, opt[MAXT];        /* who could run; the default first       */
    uint8_t cost[MAXT];          /* 1: a preemption or a timeout           */
    uint8_t idx;                 /* the choice                             */
    uint16_t used;               /* preemptions before this decision       */
};

static struct {
    pthread_mutex_t mu;          /* registration of new threads            */
    pthread_cond_t cv;
    int on, n, registered, acknowledged;
    struct sthread t[MAXT];
    struct decision dec[MAXDEC];
    int ndec, nprefix, used;
    uint8_t prefix[MAXDEC];
    int random;
    uint64_t rng;
    void (*check)(const char *where);
    const char *where;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static __thread int self = -1;
static const char *scenario_name = "";
static atomic_ulong progress; /* decisions made, for the watchdog */

/* The ordering so far as the choice made at each decision (an index into
 * that decision's options, default first): ENGRAM_INTERLEAVE_REPLAY="..."
 * with the scenario's name as argument runs exactly that ordering again. */
static void print_schedule(void)
{
    fprintf(stderr, "  ordering (%d decisions): ENGRAM_INTERLEAVE_REPLAY=\"", S.ndec);
    for (int i = 0; i < S.ndec; i++)
        fprintf(stderr, "%s%u", i ? " " : "", S.dec[i].idx);
    fprintf(stderr, "\"\n");
}

static void sched_fatal(const char *what)
{
    fprintf(stderr, "test_interleave: %s: %s (at '%s')\n", scenario_name, what, S.where ? S.where : "?");
    print_schedule();
    exit(1);
}

static int runnable(int i)
{
    const struct sthread *t = &S.t[i];
    return t->state == T_RUN || (t->state == T_CV && (t->woken || t->timed));
}

/* Who runs next; the caller holds the baton.  The options: the deciding
 * thread if it can go on (the default), then the others round-robin from
 * the next id, threads that are running or woken before timeouts.  Any
 * choice but the first is a deviation. */
static int decide(void)
{
    struct decision d = {0};
    int me = self >= 0 && S.t[self].state == T_RUN;
    if (me)
        d.opt[d.n++] = (uint8_t)self;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 1; k <= S.n; k++) {
            int i = (self + k + S.n) % S.n;
            if ((me && i == self) || !runnable(i))
                continue;
            int timeout = S.t[i].state == T_CV && !S.t[i].woken;
            if (timeout != pass)
                continue;
            d.cost[d.n] = d.n > 0;
            d.opt[d.n++] = (uint8_t)i;
        }
    int due = 0; /* options that are not a spurious wake-up: with none, nothing is bound to happen */
    for (int k = 0; k < d.n; k++) {
        const struct sthread *o = &S.t[d.opt[k]];
        due += !(o->state == T_CV && !o->woken && o->spurious);
    }
    if (due == 0)
        sched_fatal("deadlock: no thread can run");
    if (S.ndec >= MAXDEC)
        sched_fatal("an ordering longer than MAXDEC decisions (a livelock?)");
    if (S.ndec < S.nprefix) {
        d.idx = S.prefix[S.ndec];
        if (d.idx >= d.n)
            sched_fatal("a replayed ordering diverged (the run is not deterministic)");
    } else if (S.random && d.n > 1 && tu_rand(&S.rng) % 8 == 0) {
        d.idx = (uint8_t)(tu_rand(&S.rng) % d.n);
    }
    d.used = (uint16_t)S.used;
    S.used += d.cost[d.idx];
    S.dec[S.ndec++] = d;
    atomic_fetch_add(&progress, 1);
    return d.opt[d.idx];
}

/* A choice that is not a thread's: n options, the first the default, any
 * other one a deviation (the device's completion order). */
static int choose(int n)
{
    if (!S.on || self < 0 || n < 2)
        return 0;
    struct decision d = {0};
    for (int i = 0; i < n; i++) {
        d.opt[i] = (uint8_t)i;
        d.cost[i] = i > 0;
    }
    d.n = (uint8_t)n;
    if (S.ndec >= MAXDEC)
        sched_fatal("an ordering longer than MAXDEC decisions (a livelock?)");
    if (S.ndec < S.nprefix) {
        d.idx = S.prefix[S.ndec];
        if (d.idx >= d.n)
            sched_fatal("a replayed ordering diverged (the run is not deterministic)");
    } else if (S.random && tu_rand(&S.rng) % 4 == 0) {
        d.idx = (uint8_t)(tu_rand(&S.rng) % d.n);
    }
    d.used = (uint16_t)S.used;
    S.used += d.cost[d.idx];
    S.dec[S.ndec++] = d;
    return d.idx;
}

static void hand_to(int next, int wait)
{
    if (next == self)
        return;
    sem_post(&S.t[next].go);
    if (wait)
        sem_wait(&S.t[self].go);
}

void engram_sched_point(const char *name)
{
    if (!S.on || self < 0)
        return;
    S.where = name;
    if (S.check)
        S.check(name);
    hand_to(decide(), 1);
}

/* A wait that may end unwoken (a timeout, or spuriously) ends so only where
 * the explorer chooses it, as a deviation.  A spurious end is never due: a
 * state where only such ends could run is a deadlock (a lost wake-up hangs
 * a real program, which spurious wake-ups are not bound to rescue). */
static int sched_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int may_end_unwoken, int spurious)
{
    struct sthread *t = &S.t[self];
    t->state = T_CV;
    t->cv = cv;
    t->timed = may_end_unwoken;
    t->spurious = spurious;
    t->woken = 0;
    pthread_mutex_unlock(mu);
    S.where = "wait";
    if (S.check)
        S.check("wait");
    int next = decide();
    if (next != self)
        hand_to(next, 1);
    int rc = t->woken ? 0 : ETIMEDOUT;
    t->state = T_RUN;
    pthread_mutex_lock(mu);
    return rc;
}

static int all_spurious; /* ENGRAM_INTERLEAVE_SPURIOUS=1: the pool's waits too (a campaign) */

int engram_sched_wait(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *abs_mono)
{
    if (!S.on || self < 0)
        return abs_mono ? pthread_cond_timedwait(cv, mu, abs_mono) : pthread_cond_wait(cv, mu);
    if (!abs_mono && all_spurious) {
        sched_wait(cv, mu, 1, 1);
        return 0;
    }
    return sched_wait(cv, mu, abs_mono != NULL, 0);
}

/* pthread_cond_wait as POSIX allows it: it may also return unwoken. */
int engram_sched_wait_spurious(pthread_cond_t *cv, pthread_mutex_t *mu)
{
    if (!S.on || self < 0)
        return pthread_cond_wait(cv, mu);
    sched_wait(cv, mu, 1, 1);
    return 0;
}

void engram_sched_wake(pthread_cond_t *cv)
{
    pthread_cond_broadcast(cv);
    if (!S.on || self < 0)
        return;
    for (int i = 0; i < S.n; i++)
        if (S.t[i].state == T_CV && S.t[i].cv == cv)
            S.t[i].woken = 1;
}

/* pthread_cond_signal: one of the threads then waiting on cv (not already
 * woken) is woken, the first by default, another one a deviation; with
 * nobody waiting the signal is lost. */
void engram_sched_signal(pthread_cond_t *cv)
{
    pthread_cond_signal(cv);
    if (!S.on || self < 0)
        return;
    int w[MAXT], n = 0;
    for (int i = 0; i < S.n; i++)
        if (S.t[i].state == T_CV && S.t[i].cv == cv && !S.t[i].woken)
            w[n++] = i;
    if (n > 0)
        S.t[w[choose(n)]].woken = 1;
}

void engram_sched_thread_begin(const char *name)
{
    (void)name;
    if (!S.on)
        return;
    pthread_mutex_lock(&S.mu);
    int id = S.n++;
    if (id >= MAXT)
        sched_fatal("too many threads");
    struct sthread *t = &S.t[id];
    memset(t, 0, sizeof *t);
    t->state = T_RUN;
    t->pt = pthread_self();
    sem_init(&t->go, 0, 0);
    self = id;
    S.registered++;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    sem_wait(&t->go); /* until chosen */
}

void engram_sched_spawned(void)
{
    if (!S.on || self < 0)
        return;
    pthread_mutex_lock(&S.mu);
    while (S.registered == S.acknowledged)
        pthread_cond_wait(&S.cv, &S.mu);
    S.acknowledged++;
    pthread_mutex_unlock(&S.mu);
}

void engram_sched_thread_end(void)
{
    if (!S.on || self < 0)
        return;
    S.t[self].state = T_DONE;
    for (int i = 0; i < S.n; i++)
        if (S.t[i].state == T_JOIN && S.t[i].join == self)
            S.t[i].state = T_RUN;
    S.where = "thread end";
    int next = decide();
    self = -1;
    sem_post(&S.t[next].go);
}

void engram_sched_join(pthread_t pt)
{
    if (S.on && self >= 0)
        for (int i = 0; i < S.n; i++)
            if (pthread_equal(S.t[i].pt, pt) && S.t[i].state != T_DONE) {
                S.t[self].state = T_JOIN;
                S.t[self].join = i;
                hand_to(decide(), 1);
                S.t[self].state = T_RUN;
                break;
            }
    pthread_join(pt, NULL);
}

/* A thread outside the scheduler: an ordering in which a thread blocks
 * where the scheduler cannot see it (a lock held across a pause point, a
 * lock of freed memory) makes no decision for a long time: it fails the
 * test with the ordering printed instead of hanging. */
static void *watchdog(void *arg)
{
    (void)arg;
    unsigned long last = 0;
    for (int still = 0;; ) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        unsigned long now = atomic_load(&progress);
        still = now == last ? still + 1 : 0;
        last = now;
        if (still >= 60) {
            fprintf(stderr, "test_interleave: %s: no scheduling decision for 60 s: a thread is blocked "
                            "outside the scheduler\n", scenario_name);
            tu_cleanup_at_exit(); /* the model's directory; _exit runs no atexit handler */
            _exit(1);
        }
    }
    return NULL;
}

/* A thread of a scenario (besides main and the pool's I/O thread). */
struct actor {
    void (*fn)(int id);
    int id;
    pthread_t pt;
};

static void *actor_main(void *arg)
{
    struct actor *a = arg;
    engram_sched_thread_begin("actor");
    a->fn(a->id);
    engram_sched_thread_end();
    return NULL;
}

static void spawn(struct actor *a)
{
    if (pthread_create(&a->pt, NULL, actor_main, a) != 0)
        sched_fatal("pthread_create");
    engram_sched_spawned();
}


/* One ordering of a scenario: main is thread 0. */
static void run_once(void (*scenario)(void))
{
    memset(S.t, 0, sizeof S.t);
    S.n = 1;
    S.registered = S.acknowledged = 0;
    S.ndec = S.used = 0;
    S.t[0].state = T_RUN;
    S.t[0].pt = pthread_self();
    sem_init(&S.t[0].go, 0, 0);
    self = 0;
    S.on = 1;
    scenario();
    for (int i = 1; i < S.n; i++)
        if (S.t[i].state != T_DONE)
            sched_fatal("a thread still runs at the end of the scenario");
    S.on = 0;
    self = -1;
    for (int i = 0; i < S.n; i++)
        sem_destroy(&S.t[i].go);
}

/* Every ordering with at most `bound` deviations (timeouts included),
 * depth first; stops after max_runs.  Returns the orderings run, *complete
 * = 1 if that was all of them. */
static unsigned long explore(void (*scenario)(void), int bound, unsigned long max_runs, int *complete)
{
    S.nprefix = 0;
    S.random = 0;
    unsigned long runs = 0;
    for (;;) {
        run_once(scenario);
        runs++;
        int i;
        for (i = S.ndec - 1; i >= 0; i--) {
            struct decision *d = &S.dec[i];
            int idx = d->idx + 1;
            while (idx < d->n && d->used + d->cost[idx] > bound)
                idx++;
            if (idx < d->n) {
                for (int k = 0; k < i; k++)
                    S.prefix[k] = S.dec[k].idx;
                S.prefix[i] = (uint8_t)idx;
                S.nprefix = i + 1;
                break;
            }
        }
        if (i < 0) {
            *complete = 1;
            return runs;
        }
        if (runs >= max_runs) {
            *complete = 0;
            return runs;
        }
    }
}

/* ------------------------------------------------------------ a deterministic engine */

static uint8_t *image;   /* the model file's bytes */
static size_t image_len;

struct sim_read {
    unsigned slot;
    void *buf;
    uint32_t len;
    uint64_t off;
    int cancelled;
    unsigned batch;              /* reads queued between two reaps */
};

/* Reads in flight in the order they were queued. */
struct sim {
    struct io_engine e;
    struct sim_read q[1024];
    unsigned n, batch;
};

static int sim_queue(struct io_engine *e, unsigned slot, void *buf, uint32_t len, uint64_t off)
{
    struct sim *m = (struct sim *)e;
    if (m->n == 1024)
        return -EBUSY;
    m->q[m->n++] = (struct sim_read){slot, buf, len, off, 0, m->batch};
    return 0;
}

static int sim_submit(struct io_engine *e)
{
    (void)e;
    return 0;
}

/* Completes read i (its bytes from the image) into *c and removes it. */
static void sim_complete(struct sim *m, unsigned i, struct io_cqe *c)
{
    struct sim_read *r = &m->q[i];
    int32_t res = -ECANCELED;
    if (!r->cancelled) {
        size_t have = r->off < image_len ? image_len - r->off : 0;
        size_t len = r->len < have ? r->len : have;
        memcpy(r->buf, image + r->off, len);
        res = (int32_t)len;
    }
    *c = (struct io_cqe){r->slot, res};
    memmove(&m->q[i], &m->q[i + 1], (m->n - i - 1) * sizeof m->q[0]);
    m->n--;
}

/* The device: up to 8 reads (at least min) of one submission batch, the
 * oldest batch or (a choice of the explorer) a later one, oldest read
 * first; more from the oldest reads when min asks for more. */
static int sim_reap(struct io_engine *e, struct io_cqe *out, unsigned max, unsigned min)
{
    struct sim *m = (struct sim *)e;
    m->batch++;
    unsigned batches[MAXT], nb = 0;
    for (unsigned i = 0; i < m->n && nb < MAXT; i++)
        if (nb == 0 || batches[nb - 1] != m->q[i].batch)
            batches[nb++] = m->q[i].batch;
    unsigned from = nb ? batches[choose((int)nb)] : 0, k = 0;
    for (unsigned i = 0; i < m->n && k < max && k < 8;)
        if (m->q[i].batch == from)
            sim_complete(m, i, &out[k++]);
        else
            i++;
    while (k < min && k < max && m->n > 0)
        sim_complete(m, 0, &out[k++]);
    return (int)k;
}

static int sim_cancel(struct io_engine *e)
{
    struct sim *m = (struct sim *)e;
    for (unsigned i = 0; i < m->n; i++)
        m->q[i].cancelled = 1;
    return 0;
}

static void sim_wake(struct io_engine *e)
{
    (void)e;
}

static void sim_destroy(struct io_engine *e)
{
    struct sim *m = (struct sim *)e;
    if (m->n)
        sched_fatal("engine destroyed with reads in flight");
    free(m);
}

static const struct io_engine_ops sim_ops = {sim_queue, sim_submit, sim_reap, sim_cancel, sim_wake,
                                             sim_destroy};

static int sim_new(struct io_engine **out)
{
    struct sim *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->e.ops = &sim_ops;
    m->e.name = "io_uring";
    m->e.bytes = sizeof *m;
    *out = &m->e;
    return 0;
}

int __wrap_io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                               struct io_engine **out, char *note, size_t note_len);
int __wrap_io_uring_engine_new(int fd, unsigned depth, void *arena, size_t arena_len, int wakeable,
                               struct io_engine **out, char *note, size_t note_len)
{
    (void)fd, (void)depth, (void)arena, (void)arena_len, (void)wakeable;
    if (note_len)
        note[0] = 0;
    return sim_new(out);
}

/* The real thread engine (src/io/io_threads.c, with its pause points):
 * the engine's own scenarios below, and the pool's on it (real_engine). */
int __real_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out);
static int real_engine; /* the scenario's pool reads through it (struct scenario) */

int __wrap_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out);
int __wrap_io_threads_engine_new(int fd, unsigned threads, unsigned queue, enum io_drop drop,
                                 struct io_engine **out)
{
    if (real_engine)
        return __real_io_threads_engine_new(fd, threads, queue, drop, out);
    return sim_new(out);
}

/* ------------------------------------------------------------ the contract */

static engram_model *model;
static char model_path[512];
static engram_pool *pool;
static uint64_t table_rows[2];
static unsigned shard_rank, shard_world; /* the scenario's pool: 0 0 unsharded */

/* Row id of table t is this rank's: its block by the floor formula
 * (engram.h), written out here as the oracle. */
static int owned(int t, uint32_t id)
{
    if (shard_world <= 1)
        return 1;
    uint64_t R = table_rows[t];
    uint64_t lo = (uint64_t)shard_rank * R / shard_world, hi = ((uint64_t)shard_rank + 1) * R / shard_world;
    return id >= lo && id < hi;
}

#define ROWV 256
#define TOKV (48 * ROWV)
#define POISON 0xdeadu

/* A step buffer under watch. */
struct watched {
    int live, frozen;
    int begun;                   /* begin returned 0: foreign rows zero     */
    uint8_t foreign[2 * 48];     /* a row another rank owns (sharded pool)  */
    unsigned k;
    uint16_t buf[2 * TOKV];
    uint16_t want[2 * TOKV];
    uint16_t snap[2 * TOKV];
    uint8_t masked[2];
};

/* A session's committed history as its owner knows it. */
struct hist_watch {
    engram_session *s;
    int open, in_commit;
    engram_history committed, pending;
};

#define NW 8
static struct watched W[NW];
static struct hist_watch Hw[4];
static unsigned long checks_done;
static int contract_broken;

static void broken(const char *what, const char *where)
{
    if (contract_broken++ < 5)
        fprintf(stderr, "test_interleave: %s: %s (at '%s')\n", scenario_name, what, where);
    if (contract_broken == 1)
        print_schedule();
}

static uint16_t poison_row[ROWV]; /* ROWV POISONs, set by main */

/* Nonzero when the n values at a and b differ.  The checks below read the
 * watched buffers at every pause point, also where no caller may read them
 * (the scheduler's hand-offs order those reads): plain loads of the test's
 * own static buffers, not instrumented by TSan or ASan, under which a memcmp is a
 * range check of every byte (under TSan two thirds of this program's
 * time).  The callers' own reads, after a wait, stay memcmp. */
__attribute__((no_sanitize("address", "thread"))) static int differ(const uint16_t *a, const uint16_t *b, size_t n)
{
    if (!SANITIZED) /* libc's vectorized compare, nothing intercepted */
        return memcmp(a, b, n * sizeof *a) != 0;
    uint64_t acc[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++) {
            uint64_t x, y;
            memcpy(&x, a + i + 4 * j, 8);
            memcpy(&y, b + i + 4 * j, 8);
            acc[j] |= x ^ y;
        }
    for (; i < n; i++)
        acc[0] |= (uint64_t)(a[i] ^ b[i]);
    return (acc[0] | acc[1] | acc[2] | acc[3]) != 0;
}

static void check_contract(const char *where)
{
    checks_done++;
    for (int i = 0; i < NW; i++) {
        struct watched *w = &W[i];
        if (!w->live)
            continue;
        if (w->frozen) {
            if (differ(w->buf, w->snap, (size_t)w->k * TOKV))
                broken("a step buffer changed after its step ended", where);
            continue;
        }
        for (unsigned r = 0; r < w->k * 48; r++) {
            const uint16_t *g = w->buf + (size_t)r * ROWV, *x = w->want + (size_t)r * ROWV;
            int poison = g[0] == POISON && !differ(g, poison_row, ROWV);
            if (!poison && (w->masked[r / 48] || differ(g, x, ROWV)))
                broken("a step buffer holds a row that is not the step's", where);
            if (poison && w->begun && w->foreign[r])
                broken("a foreign row of a sharded step is not zero after begin returned", where);
        }
    }
    for (int i = 0; i < 4; i++) {
        struct hist_watch *h = &Hw[i];
        if (!h->open)
            continue;
        engram_history g;
        engram_session_history(h->s, &g);
        if (memcmp(&g, &h->committed, sizeof g) != 0 &&
            !(h->in_commit && memcmp(&g, &h->pending, sizeof g) == 0))
            broken("a session's history is not the committed one", where);
    }
}

/* Watches w for a step of k tokens from history h (expected rows read with
 * plain reads); the buffer is poisoned. */
static void watch(struct watched *w, const uint32_t *tok, const uint8_t *mask, unsigned k, engram_history h)
{
    uint32_t ids[2 * 48];
    w->k = k;
    w->frozen = 0;
    for (size_t i = 0; i < (size_t)k * TOKV; i++)
        w->buf[i] = POISON;
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, k, ids, NULL), 0);
    for (unsigned i = 0; i < k; i++) {
        w->masked[i] = mask && !mask[i];
        for (int t = 0; t < 2; t++) {
            uint16_t *x = w->want + ((size_t)i * 48 + (size_t)t * 24) * ROWV;
            CHECK_EQ(engram_model_read_bf16(model, t, ids + i * 48 + t * 24, 24, x, NULL), 0);
            for (int c = 0; c < 24; c++) {
                w->foreign[i * 48 + t * 24 + c] = !w->masked[i] && !owned(t, ids[i * 48 + t * 24 + c]);
                if (w->foreign[i * 48 + t * 24 + c])
                    memset(x + (size_t)c * ROWV, 0, ROWV * 2);
            }
        }
    }
    w->begun = 0;
    w->live = 1;
}

/* engram_step_begin of w's step into w->buf; once it returns 0 the foreign
 * rows (a sharded pool) must be zero, and are checked from then on. */
static int begin_watched(engram_session *s, const uint32_t *tok, const uint8_t *mask, unsigned k,
                         struct watched *w)
{
    int rc = engram_step_begin(s, tok, mask, k, ENGRAM_BF16, w->buf, NULL);
    if (rc == 0) {
        w->begun = 1;
        check_contract("after begin");
    }
    return rc;
}

static void freeze(struct watched *w)
{
    memcpy(w->snap, w->buf, (size_t)w->k * TOKV * 2);
    w->frozen = 1;
}

/* After a wait returned 0: every row of table t is in place. */
static void table_complete(const struct watched *w, int t)
{
    for (unsigned i = 0; i < w->k; i++) {
        if (w->masked[i])
            continue;
        size_t at = ((size_t)i * 48 + (size_t)t * 24) * ROWV;
        if (memcmp(w->buf + at, w->want + at, 24 * ROWV * 2) != 0)
            broken("a wait returned 0 with rows of its table missing or wrong", "after wait");
    }
}

static engram_history hist_after(engram_history h, const uint32_t *tok, const uint8_t *mask, unsigned j)
{
    uint32_t ids[8 * 48];
    if (j)
        CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, tok, mask, j, ids, NULL), 0);
    return h;
}

/* A commit of j tokens, checked: the history moves inside it, to the
 * expected value, and only if it succeeds. */
static int commit_watched(struct hist_watch *h, const uint32_t *tok, const uint8_t *mask, unsigned j)
{
    h->pending = hist_after(h->committed, tok, mask, j);
    h->in_commit = 1;
    int rc = engram_step_commit(h->s, j, NULL);
    h->in_commit = 0;
    if (rc == 0)
        h->committed = h->pending;
    return rc;
}

static void open_pool(void)
{
    engram_pool_opts o = {.reader = {.engine = ENGRAM_IO_URING, .depth = 64},
                          .shard_rank = shard_rank, .shard_world = shard_world};
    if (real_engine) /* one worker, two reads in flight */
        o.reader = (engram_reader_opts){.engine = ENGRAM_IO_THREADS, .depth = 2};
    engram_error err;
    if (engram_pool_open(model, &o, &pool, &err) < 0)
        sched_fatal(err.msg);
}

static engram_session *open_session(int i)
{
    engram_session *s = NULL;
    if (engram_session_open(pool, &s, NULL) < 0)
        sched_fatal("session open");
    Hw[i] = (struct hist_watch){s, 1, 0, {{-1, -1, -1}}, {{-1, -1, -1}}};
    engram_history_reset(&Hw[i].committed);
    return s;
}

static void close_session(int i)
{
    Hw[i].open = 0;
    engram_session_close(Hw[i].s);
}

static void reset_watch(void)
{
    for (int i = 0; i < NW; i++) { /* watch() sets the rest (buffers: 1.2 MB) */
        W[i].live = W[i].frozen = W[i].begun = 0;
        W[i].k = 0;
    }
    memset(Hw, 0, sizeof Hw);
}

/* The usual scenario: a pool and n_sessions sessions, the actors run to
 * their end, then every session still open and the pool closed. */
static void run_actors(int n_sessions, struct actor *a, int n_actors)
{
    reset_watch();
    open_pool();
    for (int i = 0; i < n_sessions; i++)
        open_session(i);
    for (int i = 0; i < n_actors; i++)
        spawn(&a[i]);
    for (int i = 0; i < n_actors; i++)
        engram_sched_join(a[i].pt);
    for (int i = 0; i < n_sessions; i++)
        if (Hw[i].open)
            close_session(i);
    engram_pool_close(pool);
}

/* ------------------------------------------------------------ scenarios */

/* The caller may be preempted between two calls, not only inside them. */
#define YIELD() engram_sched_point("caller: between calls")

static const uint32_t tokA[2] = {11, 12}, tokB[2] = {13, 14}, tokC[2] = {15, 16};
static int rc_seen[8];

/* 1. begin(A), abort, begin(B), wait both tables, commit: the ordering of
 * defect 1 (a step answered with rows it never wrote). */
static void a1_abort_begin(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[0], tokA, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokA, NULL, 1, &W[0]), 0);
    YIELD();
    engram_step_abort(s);
    freeze(&W[0]);
    YIELD();
    watch(&W[1], tokB, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokB, NULL, 1, &W[1]), 0);
    YIELD();
    for (int t = 0; t < 2; t++) {
        CHECK_EQ(engram_step_wait(s, t, NULL), 0);
        table_complete(&W[1], t);
        YIELD();
    }
    CHECK_EQ(commit_watched(&Hw[id], tokB, NULL, 1), 0);
    freeze(&W[1]);
    YIELD();
}

static void sc_abort_begin(void)
{
    struct actor a[] = {{a1_abort_begin, 0, 0}};
    run_actors(1, a, 1);
}

/* 2. Two sessions whose steps want the same rows (one read serves both):
 * one aborts and begins again, the other waits and commits. */
static void a2_share_commit(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[2], tokA, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokA, NULL, 1, &W[2]), 0);
    YIELD();
    /* no wait: a commit that returns 0 has waited for both tables */
    CHECK_EQ(commit_watched(&Hw[id], tokA, NULL, 1), 0);
    table_complete(&W[2], 0);
    table_complete(&W[2], 1);
    freeze(&W[2]);
    YIELD();
}

static void sc_shared_rows(void)
{
    struct actor a[] = {{a1_abort_begin, 0, 0}, {a2_share_commit, 1, 0}};
    run_actors(2, a, 2);
}

/* 3. A timed wait that may time out (and is retried), then an abort, a new
 * step and a close while it may still be reading. */
static void a3_timeout_close(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[3], tokC, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokC, NULL, 1, &W[3]), 0);
    YIELD();
    int rc = engram_step_wait_timed(s, 0, 1000, NULL);
    CHECK(rc == 0 || rc == -ETIMEDOUT);
    if (rc == 0)
        table_complete(&W[3], 0);
    else if ((rc = engram_step_wait_timed(s, 0, 1000, NULL)) == 0) /* nothing lost: again */
        table_complete(&W[3], 0);
    CHECK(rc == 0 || rc == -ETIMEDOUT);
    engram_step_abort(s);
    freeze(&W[3]);
    YIELD();
    watch(&W[4], tokA, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokA, NULL, 1, &W[4]), 0);
    YIELD();
    close_session(id); /* reads may be in flight: nothing written after */
    freeze(&W[4]);
    YIELD();
}

static void sc_timeout_close(void)
{
    struct actor a[] = {{a3_timeout_close, 0, 0}};
    run_actors(1, a, 1); /* the actor closes its session itself */
}

/* 4. The pool closes while a session steps: the step either succeeds whole
 * or fails with -ESHUTDOWN, the history moves only with a success, and the
 * handle stays usable (a later begin -ESHUTDOWN, then close). */
static void a4_step_during_close(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[5], tokB, NULL, 1, Hw[id].committed);
    int rc = begin_watched(s, tokB, NULL, 1, &W[5]);
    CHECK(rc == 0 || rc == -ESHUTDOWN);
    YIELD();
    if (rc == 0) {
        for (int t = 0; t < 2; t++) {
            int w = engram_step_wait(s, t, NULL);
            CHECK(w == 0 || w == -ESHUTDOWN);
            if (w == 0)
                table_complete(&W[5], t);
        }
        rc = commit_watched(&Hw[id], tokB, NULL, 1);
        CHECK(rc == 0 || rc == -ESHUTDOWN);
    }
    freeze(&W[5]);
    rc_seen[id] = rc;
}

static void sc_pool_close(void)
{
    reset_watch();
    open_pool();
    open_session(0);
    struct actor a = {a4_step_during_close, 0, 0};
    spawn(&a);
    engram_sched_point("main: before pool close"); /* the actor may begin first */
    engram_pool_close(pool); /* with the session open and stepping */
    engram_sched_join(a.pt);
    uint16_t out[TOKV];
    CHECK_EQ(engram_step_begin(Hw[0].s, tokA, NULL, 1, ENGRAM_BF16, out, NULL), -ESHUTDOWN);
    close_session(0); /* the last handle: frees the pool */
}

/* 5. Two pipeline stages of one session on two threads: one waits for
 * table 0, the other for table 1 and commits after both. */
static pthread_mutex_t stage_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stage_cv = PTHREAD_COND_INITIALIZER;
static int stage_begun, stage0_done;

static void stage_wait_flag(int *flag)
{
    pthread_mutex_lock(&stage_mu);
    while (!*flag)
        engram_sched_wait(&stage_cv, &stage_mu, NULL);
    pthread_mutex_unlock(&stage_mu);
}

static void stage_set_flag(int *flag)
{
    pthread_mutex_lock(&stage_mu);
    *flag = 1;
    engram_sched_wake(&stage_cv);
    pthread_mutex_unlock(&stage_mu);
}

static void a5_stage0(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[6], tokA, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokA, NULL, 1, &W[6]), 0);
    stage_set_flag(&stage_begun);
    CHECK_EQ(engram_step_wait(s, 0, NULL), 0);
    table_complete(&W[6], 0);
    stage_set_flag(&stage0_done);
}

static void a5_stage1(int id)
{
    engram_session *s = Hw[id].s;
    stage_wait_flag(&stage_begun);
    CHECK_EQ(engram_step_wait(s, 1, NULL), 0);
    table_complete(&W[6], 1);
    stage_wait_flag(&stage0_done);
    CHECK_EQ(commit_watched(&Hw[id], tokA, NULL, 1), 0);
    freeze(&W[6]);
}

static void sc_two_stages(void)
{
    stage_begun = stage0_done = 0;
    struct actor a[] = {{a5_stage0, 0, 0}, {a5_stage1, 0, 0}};
    run_actors(1, a, 2);
}

/* 6. A prefill (2 chunks of 2 tokens, ring 1, table 1 on a signal, the
 * ring in caller memory) read chunk by chunk while another session steps;
 * then a second prefill cancelled midway, and one whose session is closed
 * under it. */
static const uint32_t ptok[4] = {21, 22, 23, 24};
static uint16_t ring_mem[2 * 2 * 2 * 24 * ROWV] __attribute__((aligned(64)));
static uint16_t ring_snap[2 * 2 * 2 * 24 * ROWV];
static uint16_t pwant[2][4 * 24 * ROWV]; /* [table][token][24] */
static int ring_frozen;

static void prefill_want(void)
{
    uint32_t ids[4 * 48];
    engram_history h;
    engram_history_reset(&h);
    CHECK_EQ(engram_hash_tokens(engram_model_hasher(model), &h, ptok, NULL, 4, ids, NULL), 0);
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 2; t++) {
            CHECK_EQ(engram_model_read_bf16(model, t, ids + i * 48 + t * 24, 24,
                                            pwant[t] + (size_t)i * 24 * ROWV, NULL), 0);
            for (int c = 0; c < 24; c++) /* a sharded pool's chunks: zeros */
                if (!owned(t, ids[i * 48 + t * 24 + c]))
                    memset(pwant[t] + ((size_t)i * 24 + (size_t)c) * ROWV, 0, ROWV * 2);
        }
}

static void check_ring(const char *where)
{
    check_contract(where);
    if (ring_frozen && differ(ring_mem, ring_snap, sizeof ring_mem / sizeof ring_mem[0]))
        broken("prefill ring memory written after cancel or end returned", where);
}

static engram_prefill_opts popts(void)
{
    engram_prefill_opts o = {.chunk_tokens = 2, .ring_chunks = 1, .dtype = ENGRAM_BF16,
                             .table1_delay_ns = ENGRAM_PREFILL_MANUAL, .ring_mem = ring_mem,
                             .ring_bytes = sizeof ring_mem};
    return o;
}

static void a6_prefill(int id)
{
    engram_session *s = Hw[id].s;
    engram_prefill_opts o = popts();
    engram_prefill *pf = NULL;
    CHECK_EQ(engram_prefill_begin(s, ptok, NULL, 4, &o, &pf, NULL), 0);
    for (size_t c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++) {
            const void *rows = NULL;
            size_t first = 0, n = 0;
            CHECK_EQ(engram_prefill_wait(pf, t, c, &rows, &first, &n, NULL), 0);
            CHECK(n == 2 && first == c * 2);
            if (rows && memcmp(rows, pwant[t] + c * 2 * 24 * ROWV, 2 * 24 * ROWV * 2) != 0)
                broken("a prefill chunk that is not the prompt's rows", "after prefill wait");
            if (t == 0 && c == 0)
                engram_prefill_start_table1(pf);
            engram_prefill_release(pf, t, c);
        }
    Hw[id].pending = hist_after(Hw[id].committed, ptok, NULL, 4);
    Hw[id].in_commit = 1;
    CHECK_EQ(engram_prefill_end(pf, NULL), 0);
    Hw[id].in_commit = 0;
    Hw[id].committed = Hw[id].pending;
    memcpy(ring_snap, ring_mem, sizeof ring_mem);
    ring_frozen = 1;
}

static void a6_stepper(int id);

/* A prefill cancelled after its first chunk of table 1 (table 1 on a delay
 * of 0, a ring of 2 chunks: chunk 1 may be in flight), then a step of the
 * same session. */
static void a6_cancel(int id)
{
    engram_session *s = Hw[id].s;
    engram_prefill_opts o = popts();
    o.table1_delay_ns = 0;
    o.ring_chunks = 2;
    engram_prefill *pf = NULL;
    CHECK_EQ(engram_prefill_begin(s, ptok, NULL, 4, &o, &pf, NULL), 0);
    const void *rows = NULL;
    CHECK_EQ(engram_prefill_wait(pf, 1, 0, &rows, NULL, NULL, NULL), 0);
    if (rows && memcmp(rows, pwant[1], 2 * 24 * ROWV * 2) != 0)
        broken("a prefill chunk that is not the prompt's rows", "after prefill wait");
    YIELD();
    engram_prefill_cancel(pf);
    memcpy(ring_snap, ring_mem, sizeof ring_mem);
    ring_frozen = 1;
    YIELD();
    a6_stepper(id);
}

static void a6_stepper(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[7], tokB, NULL, 1, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokB, NULL, 1, &W[7]), 0);
    YIELD();
    for (int t = 0; t < 2; t++) {
        CHECK_EQ(engram_step_wait(s, t, NULL), 0);
        table_complete(&W[7], t);
    }
    CHECK_EQ(commit_watched(&Hw[id], tokB, NULL, 1), 0);
    freeze(&W[7]);
}

static void sc_prefill(void)
{
    ring_frozen = 0;
    struct actor a[] = {{a6_prefill, 0, 0}, {a6_stepper, 1, 0}};
    run_actors(2, a, 2);
}

static void sc_prefill_cancel(void)
{
    ring_frozen = 0;
    struct actor a[] = {{a6_cancel, 0, 0}};
    run_actors(1, a, 1);
}

/* 7. A session closed under its prefill: the prefill's handle stays valid,
 * its waits end, end says -ECANCELED, and the ring is not written after. */
static void a7_close_under_prefill(int id)
{
    engram_session *s = Hw[id].s;
    engram_prefill_opts o = popts();
    engram_prefill *pf = NULL;
    CHECK_EQ(engram_prefill_begin(s, ptok, NULL, 4, &o, &pf, NULL), 0);
    YIELD();
    close_session(id);
    YIELD();
    int rc = engram_prefill_wait(pf, 0, 0, NULL, NULL, NULL, NULL);
    CHECK(rc == 0 || rc == -ECANCELED);
    CHECK_EQ(engram_prefill_end(pf, NULL), -ECANCELED);
    memcpy(ring_snap, ring_mem, sizeof ring_mem);
    ring_frozen = 1;
}

static void sc_close_under_prefill(void)
{
    ring_frozen = 0;
    struct actor a[] = {{a7_close_under_prefill, 0, 0}};
    run_actors(1, a, 1);
}

/* 8. Three sessions at once: the abort/begin pattern, a shared-rows step
 * and a draft step of two tokens committed partly. */
static const uint8_t mask2[2] = {1, 0};
static void a8_draft(int id)
{
    engram_session *s = Hw[id].s;
    watch(&W[3], tokC, mask2, 2, Hw[id].committed);
    CHECK_EQ(begin_watched(s, tokC, mask2, 2, &W[3]), 0);
    CHECK_EQ(engram_step_wait(s, 1, NULL), 0);
    table_complete(&W[3], 1);
    CHECK_EQ(commit_watched(&Hw[id], tokC, mask2, 1), 0);
    freeze(&W[3]);
}

static void sc_three(void)
{
    struct actor a[] = {{a1_abort_begin, 0, 0}, {a2_share_commit, 1, 0}, {a8_draft, 2, 0}};
    run_actors(3, a, 3);
}

/* ------------------------------------------------------------ the thread engine */

/* The real thread-pool engine (src/io/io_threads.c, built with its pause
 * points; the pool's scenarios above use the deterministic one instead):
 * its workers, a caller queueing, submitting, reaping and cancelling, and
 * a second thread's wake(), under every ordering within the bound, a
 * signal waking any one of the threads waiting on it.  The contract
 * (io_engine.h), checked at every reap and pause point:
 *  - every read queued completes through reap exactly once, with the file's
 *    bytes, or with -ECANCELED only after a cancel and only when no worker
 *    took it (its buffer never written);
 *  - a reap returns at most what is in flight, and fewer than its min only
 *    after a wake(): at most one such early return a wake;
 *  - a reaped buffer never changes again until it is queued again;
 *  - no ordering deadlocks: a reap that waits for a completion nobody
 *    signals is a state where no thread can run.
 * Reads are plain preads of the model file (a buffered descriptor). */

#define ESLOTS 4
#define ELEN 264
#define EPOISON 0xA5

static int eng_fd = -1;
static struct io_engine *eng;
static struct {
    uint8_t buf[ELEN], snap[ELEN];
    uint64_t off;
    int in_flight, reaped;       /* reaped: snap holds what reap left */
} E[ESLOTS];
static unsigned e_in_flight;
static int e_cancelled;          /* cancel() was called                 */
static int e_wakes, e_early;     /* wake() calls; reaps short of min   */
static unsigned long e_early_all; /* reaps short of min, every ordering */

/* Pause-point check: a reaped buffer stays as reap left it. */
static void check_engine(const char *where)
{
    for (int i = 0; i < ESLOTS; i++)
        if (E[i].reaped && !E[i].in_flight) {
            checks_done++;
            if (memcmp(E[i].buf, E[i].snap, ELEN) != 0)
                broken("a reaped buffer changed", where);
        }
}

static void eng_open(unsigned threads, unsigned queue)
{
    memset(E, 0, sizeof E);
    e_in_flight = 0;
    e_cancelled = e_wakes = e_early = 0;
    if (__real_io_threads_engine_new(eng_fd, threads, queue, DROP_NONE, &eng) < 0)
        sched_fatal("io_threads_engine_new failed");
}

/* Queues slot's read; the offsets are distinct and none is slot-aligned. */
static void eng_queue(unsigned slot)
{
    memset(E[slot].buf, EPOISON, ELEN);
    E[slot].off = image_len / 8 * (slot + 2) + 7 * slot + 3;
    E[slot].reaped = 0;
    checks_done++;
    if (eng->ops->queue(eng, slot, E[slot].buf, ELEN, E[slot].off) != 0) {
        broken("a read within the queue's bound refused", "queue");
        return;
    }
    E[slot].in_flight = 1;
    e_in_flight++;
}

/* One reap(min); checks each completion.  Returns how many. */
static unsigned eng_reap(unsigned min)
{
    struct io_cqe out[ESLOTS];
    int n = eng->ops->reap(eng, out, ESLOTS, min);
    checks_done++;
    if (n < 0 || (unsigned)n > e_in_flight) {
        broken("reap returned an error or more reads than in flight", "reap");
        return 0;
    }
    if ((unsigned)n < min) {
        e_early_all++;
        if (++e_early > e_wakes)
            broken("a reap returned short of its min without a wake", "reap");
    }
    for (int k = 0; k < n; k++) {
        unsigned slot = out[k].slot;
        checks_done++;
        if (slot >= ESLOTS || !E[slot].in_flight) {
            broken("a completion for a read not in flight", "reap");
            continue;
        }
        int poison = 1;
        for (int b = 0; b < ELEN; b++)
            poison &= E[slot].buf[b] == EPOISON;
        if (out[k].res == ELEN) {
            if (memcmp(E[slot].buf, image + E[slot].off, ELEN) != 0)
                broken("a read's bytes are not the file's", "reap");
        } else if (out[k].res == -ECANCELED) {
            if (!e_cancelled || !poison)
                broken("-ECANCELED without a cancel, or for a read a worker wrote", "reap");
        } else {
            broken("a read's result is neither its length nor -ECANCELED", "reap");
        }
        E[slot].in_flight = 0;
        E[slot].reaped = 1;
        memcpy(E[slot].snap, E[slot].buf, ELEN);
        e_in_flight--;
    }
    return (unsigned)n;
}

static void eng_drain(void)
{
    while (e_in_flight > 0)
        eng_reap(e_in_flight);
}

static void eng_close(void)
{
    eng->ops->destroy(eng);
    eng = NULL;
    check_engine("destroyed"); /* the workers have ended: nothing wrote since */
}

/* 10. One worker, a queue of two: a reap that wants both returns both
 * (woken at the count it waits for, never left asleep); then the ring
 * wraps. */
static void sc_eng_want(void)
{
    eng_open(1, 2);
    eng_queue(0);
    eng_queue(1);
    eng_reap(2);
    YIELD();
    eng_queue(0);
    eng_reap(1);
    eng_close();
}

/* 11. Two workers, a queue of three: reads taken in any order, completions
 * reaped one or more at a time, a reaped slot queued again while the
 * others are in flight. */
static void sc_eng_two(void)
{
    eng_open(2, 3);
    eng_queue(0);
    eng_queue(1);
    eng_queue(2);
    CHECK_EQ(eng->ops->submit(eng), 0);
    eng_reap(1);
    for (unsigned i = 0; i < 3; i++)
        if (!E[i].in_flight) {
            eng_queue(i);
            break;
        }
    eng_drain();
    eng_close();
}

static void a_eng_wake(int id)
{
    (void)id;
    e_wakes++; /* before the call: no pause point between the two */
    eng->ops->wake(eng);
}

/* 12. A second thread's wake() against reaps that want every read in
 * flight: the reap it meets (blocked, or the next one, also after the
 * drain) may return short, once; and in some ordering it does (after_wake:
 * a wake() that never ends a reap early is no wake). */
static void after_wake(void)
{
    CHECK(e_early_all > 0);
}

static void sc_eng_wake(void)
{
    eng_open(1, 2);
    struct actor a = {a_eng_wake, 0, 0};
    spawn(&a);
    eng_queue(0);
    eng_queue(1);
    eng_drain();
    engram_sched_join(a.pt);
    eng_queue(0);
    eng_drain();
    eng_close();
}

/* 13. cancel() with reads queued and being read by two workers; then the
 * engine made and destroyed with no read at all (workers still starting). */
static void sc_eng_cancel(void)
{
    eng_open(2, 4);
    for (unsigned i = 0; i < 4; i++)
        eng_queue(i);
    CHECK_EQ(eng->ops->submit(eng), 0);
    YIELD();
    e_cancelled = 1;
    CHECK_EQ(eng->ops->cancel(eng), 0);
    eng_drain();
    eng_close();
    eng_open(2, 2);
    eng_close();
}

/* ------------------------------------------------------------ main */

struct scenario {
    const char *name;
    void (*fn)(void);
    void (*check)(const char *);
    int bound;
    unsigned long max_runs, samples;
    unsigned rank, world;        /* the pool's shard (0 0: unsharded)       */
    int real_engine;             /* the pool reads through the real thread
                                    engine: its I/O thread blocks inside the
                                    engine's reap, woken by the sessions'
                                    reader_wake, which the deterministic
                                    engine never makes it do */
    void (*after)(void);         /* checks over all the orderings run, or NULL */
};

static void run_scenario(const struct scenario *sc, uint64_t seed)
{
    shard_rank = sc->rank;
    shard_world = sc->world;
    real_engine = sc->real_engine;
    prefill_want(); /* the prompt's rows as this pool delivers them */
    const char *replay = getenv("ENGRAM_INTERLEAVE_REPLAY");
    if (replay) { /* one ordering, as printed by a failure */
        scenario_name = sc->name;
        S.check = sc->check;
        S.random = 0;
        S.nprefix = 0;
        for (char *end; *replay && S.nprefix < MAXDEC; replay = end) {
            unsigned long v = strtoul(replay, &end, 10);
            if (end == replay)
                break;
            S.prefix[S.nprefix++] = (uint8_t)v;
        }
        run_once(sc->fn);
        printf("%-26s replayed one ordering of %d decisions\n", sc->name, S.ndec);
        return;
    }
    scenario_name = sc->name;
    S.check = sc->check;
    e_early_all = 0; /* for sc->after */
    int before = tu_failures, complete = 0;
    unsigned long long c0 = checks_done;
    unsigned long runs = sc->bound >= 0 ? explore(sc->fn, sc->bound, sc->max_runs, &complete) : 0;
    unsigned long samples = 0;
    int longest = S.ndec;
    if (sc->samples) {
        S.random = 1;
        S.rng = seed;
        S.nprefix = 0;
        for (; samples < sc->samples; samples++) {
            run_once(sc->fn);
            if (S.ndec > longest)
                longest = S.ndec;
        }
        S.random = 0;
    }
    if (sc->bound >= 0)
        printf("%-26s %7lu orderings (%s with <= %d deviations)", sc->name, runs,
               complete ? "all" : "capped: not all", sc->bound);
    else
        printf("%-26s", sc->name);
    if (samples)
        printf("%s%lu random orderings (seed %" PRIu64 ")", sc->bound >= 0 ? " + " : " ", samples, seed);
    if (sc->after)
        sc->after();
    printf("; %llu contract checks%s\n", checks_done - c0, tu_failures > before ? ", FAILED" : "");
    CHECK(complete || sc->bound < 0 || getenv("ENGRAM_INTERLEAVE_CAP"));
}

int main(int argc, char **argv)
{
    alarm(1500);
    engram_layout l;
    static uint32_t map[1000];
    CHECK_EQ(tu_layout(&l, map, 1000, 800, 2000), 0);
    CHECK_EQ(tu_build("interleave.gguf", &l, ENGRAM_FILL_RANDOM, 0, model_path, sizeof model_path), 0);
    engram_error err;
    if (engram_model_open(model_path, &model, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(model_path, "rb");
    fseek(f, 0, SEEK_END);
    image_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    image = malloc(image_len);
    CHECK(image && fread(image, 1, image_len, f) == image_len);
    fclose(f);
    eng_fd = open(model_path, O_RDONLY | O_CLOEXEC);
    CHECK(eng_fd >= 0);
    for (unsigned i = 0; i < ESLOTS; i++) { /* the engine's reads are told from untouched buffers */
        uint64_t off = image_len / 8 * (i + 2) + 7 * i + 3;
        int all_poison = 1;
        for (int b = 0; b < ELEN; b++)
            all_poison &= image[off + b] == EPOISON;
        CHECK(off + ELEN <= image_len && !all_poison);
    }
    engram_model_info mi;
    engram_model_get_info(model, &mi);
    table_rows[0] = mi.table[0].rows;
    table_rows[1] = mi.table[1].rows;
    for (int v = 0; v < ROWV; v++)
        poison_row[v] = POISON;
    pthread_t dog;
    pthread_create(&dog, NULL, watchdog, NULL);
    pthread_detach(dog);

    /* the suite's bounds; one less (and a quarter of the samples) under the
     * sanitizers, which run every ordering several times slower, or with
     * ENGRAM_INTERLEAVE_QUICK=1 (mutation runs); ENGRAM_INTERLEAVE_DEEP=1
     * for a campaign; ENGRAM_INTERLEAVE_SPURIOUS=1 lets the pool's untimed
     * waits end spuriously too (a campaign: every ordering count grows) */
    int deep = getenv("ENGRAM_INTERLEAVE_DEEP") != NULL;
    all_spurious = getenv("ENGRAM_INTERLEAVE_SPURIOUS") != NULL;
    int quick = SANITIZED || getenv("ENGRAM_INTERLEAVE_QUICK") != NULL;
    const char *seed_s = getenv("ENGRAM_INTERLEAVE_SEED");
    uint64_t seed = seed_s ? strtoull(seed_s, NULL, 10) : (uint64_t)time(NULL);
    const struct scenario all[] = {
        {"abort/begin (1 session)", sc_abort_begin, check_contract, deep ? 5 : 3, 2000000, 0, 0, 0, 0, NULL},
        {"shared rows (2 sessions)", sc_shared_rows, check_contract, deep ? 3 : 2, 2000000, 200, 0, 0, 0, NULL},
        {"timeout, close (1)", sc_timeout_close, check_contract, deep ? 4 : 2, 2000000, 0, 0, 0, 0, NULL},
        {"pool close under a step", sc_pool_close, check_contract, deep ? 5 : 4, 2000000, 0, 0, 0, 0, NULL},
        {"two pipeline stages", sc_two_stages, check_contract, deep ? 3 : 2, 2000000, 200, 0, 0, 0, NULL},
        {"prefill + step", sc_prefill, check_ring, deep ? 3 : 2, 2000000, 200, 0, 0, 0, NULL},
        {"prefill cancelled", sc_prefill_cancel, check_ring, deep ? 3 : 2, 2000000, 0, 0, 0, 0, NULL},
        {"close under a prefill", sc_close_under_prefill, check_ring, deep ? 5 : 4, 2000000, 0, 0, 0, 0, NULL},
        {"three sessions", sc_three, check_contract, deep ? 2 : 1, 2000000, deep ? 5000 : 300, 0, 0, 0, NULL},
        /* sharded pools (issue #24): both ranks of 2, one rank of 3 */
        {"shared rows, rank 0 of 2", sc_shared_rows, check_contract, deep ? 3 : 2, 2000000, 0, 0, 2, 0, NULL},
        {"shared rows, rank 1 of 2", sc_shared_rows, check_contract, deep ? 3 : 2, 2000000, 0, 1, 2, 0, NULL},
        {"prefill + step, rank 2 of 3", sc_prefill, check_ring, deep ? 3 : 2, 2000000, 0, 2, 3, 0, NULL},
        {"pool close, rank 1 of 3", sc_pool_close, check_contract, deep ? 5 : 4, 2000000, 0, 1, 3, 0, NULL},
        /* the thread engine itself */
        {"thread engine: want", sc_eng_want, check_engine, deep ? 5 : 4, 2000000, 0, 0, 0, 0, NULL},
        {"thread engine: two workers", sc_eng_two, check_engine, deep ? 4 : 3, 2000000, 0, 0, 0, 0, NULL},
        {"thread engine: wake", sc_eng_wake, check_engine, deep ? 5 : 4, 2000000, 0, 0, 0, 0, after_wake},
        {"thread engine: cancel", sc_eng_cancel, check_engine, deep ? 4 : 3, 2000000, 0, 0, 0, 0, NULL},
        /* the pool on it (one worker; random orderings besides) */
        {"abort/begin, thread engine", sc_abort_begin, check_contract, deep ? 3 : 1, 2000000,
         deep ? 2000 : 120, 0, 0, 1, NULL},
        {"pool close, thread engine", sc_pool_close, check_contract, deep ? 3 : 2, 2000000,
         deep ? 2000 : 120, 0, 0, 1, NULL},
        {"prefill + step, thread engine", sc_prefill, check_ring, deep ? 2 : 0, 2000000,
         deep ? 2000 : 200, 0, 0, 1, NULL},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (argc > 1 && !strstr(all[i].name, argv[1]))
            continue;
        struct scenario sc = all[i];
        if (quick && !deep) {
            sc.bound = sc.bound > 1 ? sc.bound - 1 : sc.bound;
            sc.samples /= 4;
        }
        run_scenario(&sc, seed + i);
    }
    if (contract_broken)
        tu_failures++;
    engram_model_close(model);
    close(eng_fd);
    free(image);
    tu_cleanup();
    return tu_finish("test_interleave");
}
