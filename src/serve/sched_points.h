/*
 * sched_points.h - named pause points of the pool's shared state machine (the
 * I/O thread, sessions, steps, prefills) and of the thread-pool I/O engine
 * (src/io/io_threads.c: its workers, queue, reap and wake), for the
 * deterministic interleaving test (tests/test_interleave.c).
 *
 * In the library every macro below is the plain pthread call, or nothing.
 * In the test's own build of the library (-DENGRAM_SCHED) they call the
 * test's scheduler, which runs one thread at a time and decides at every
 * point who runs next, so that a test can enumerate the orderings of a
 * small scenario and check the contract after every step:
 *  - SCHED_POINT(name): a gap where another thread may run.  Placed after
 *    the lock releases that end a change of shared state or a read of it
 *    that the thread then acts on (begin, abort/commit/close, a row
 *    answered, a round taken in, a chunk published, a prefill stopped or
 *    detached, a prefill's state read by the I/O thread), never while such
 *    a lock is held; not after the I/O thread's read-only walks of its own
 *    lists or its statistics.  Between two calls of a caller the test adds
 *    its own.
 *  - SCHED_WAIT / SCHED_TIMEDWAIT: condition waits (a blocked thread does
 *    not run until it is woken; a timed wait may also time out whenever
 *    the scheduler chooses); SCHED_WAIT_SPURIOUS: a condition wait that
 *    the scheduler may also end unwoken, as POSIX allows pthread_cond_wait
 *    to (the thread engine's waits: its loops must re-check; the pool's
 *    waits are explored without spurious wake-ups); SCHED_WAKE:
 *    pthread_cond_broadcast (every waiter of the condition is woken);
 *    SCHED_SIGNAL: pthread_cond_signal,
 *    used only by the thread engine (io_threads.c), where it wakes exactly
 *    one of the threads then waiting on the condition, which one being the
 *    scheduler's choice (a signal with nobody waiting is lost, as POSIX
 *    allows).
 *  - SCHED_THREAD_BEGIN/END, SCHED_SPAWNED, SCHED_JOIN: the life of the I/O
 *    thread and of the engine's workers, so that their starts and ends are
 *    scheduling decisions too.
 */
#ifndef ENGRAM_SCHED_POINTS_H
#define ENGRAM_SCHED_POINTS_H

#include <pthread.h>
#include <time.h>

#ifdef ENGRAM_SCHED
void engram_sched_point(const char *name);
int engram_sched_wait(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *abs_mono);
int engram_sched_wait_spurious(pthread_cond_t *cv, pthread_mutex_t *mu);
void engram_sched_wake(pthread_cond_t *cv);
void engram_sched_signal(pthread_cond_t *cv);
void engram_sched_thread_begin(const char *name);
void engram_sched_thread_end(void);
void engram_sched_spawned(void);
void engram_sched_join(pthread_t t);
#define SCHED_POINT(name) engram_sched_point(name)
#define SCHED_WAIT(cv, mu) engram_sched_wait(cv, mu, NULL)
#define SCHED_WAIT_SPURIOUS(cv, mu) engram_sched_wait_spurious(cv, mu)
#define SCHED_TIMEDWAIT(cv, mu, ts) engram_sched_wait(cv, mu, ts)
#define SCHED_WAKE(cv) engram_sched_wake(cv)
#define SCHED_SIGNAL(cv) engram_sched_signal(cv)
#define SCHED_THREAD_BEGIN(name) engram_sched_thread_begin(name)
#define SCHED_THREAD_END() engram_sched_thread_end()
#define SCHED_SPAWNED() engram_sched_spawned()
#define SCHED_JOIN(t) engram_sched_join(t)
#else
#define SCHED_POINT(name) ((void)0)
#define SCHED_WAIT(cv, mu) pthread_cond_wait(cv, mu)
#define SCHED_WAIT_SPURIOUS(cv, mu) pthread_cond_wait(cv, mu)
#define SCHED_TIMEDWAIT(cv, mu, ts) pthread_cond_timedwait(cv, mu, ts)
#define SCHED_WAKE(cv) pthread_cond_broadcast(cv)
#define SCHED_SIGNAL(cv) pthread_cond_signal(cv)
#define SCHED_THREAD_BEGIN(name) ((void)0)
#define SCHED_THREAD_END() ((void)0)
#define SCHED_SPAWNED() ((void)0)
#define SCHED_JOIN(t) pthread_join(t, NULL)
#endif

#endif
