/*
 * rusage_run.c - runs a command and reports what it took: its peak resident
 * memory (ru_maxrss from wait4, the largest of it and the descendants it
 * waited for) and its wall time; kills it (its whole process group) when it
 * runs past a time limit, and can cap its address space.  Used by
 * tests/test_inputs.sh to hold commands to bounds without /usr/bin/time.
 *   rusage_run [-t SECONDS] [-m MIB] [-o FILE] COMMAND [ARGS...]
 * -t: SIGKILL after SECONDS (default 60); -m: RLIMIT_AS of MIB (leave it
 * out under ASan, which reserves terabytes); -o: the report to FILE
 * (default stderr), one line:
 *   maxrss_kib=N wall_ms=N status=S
 * where S is the exit code, 128 + the signal, or "timeout".  Exits with the
 * command's exit code, 128 + its signal, or 124 when it timed out.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t timed_out;
static volatile pid_t child;

static void on_alarm(int sig)
{
    (void)sig;
    timed_out = 1;
    kill(-child, SIGKILL);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int usage(void)
{
    fprintf(stderr, "usage: rusage_run [-t SECONDS] [-m MIB] [-o FILE] COMMAND [ARGS...]\n");
    return 2;
}

int main(int argc, char **argv)
{
    long seconds = 60, mib = 0;
    const char *report = NULL;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        char *end;
        long v = strtol(argv[i + 1], &end, 10);
        if (!strcmp(argv[i], "-o"))
            report = argv[i + 1];
        else if (*end || v <= 0)
            return usage();
        else if (!strcmp(argv[i], "-t"))
            seconds = v;
        else if (!strcmp(argv[i], "-m"))
            mib = v;
        else
            return usage();
    }
    if (i >= argc)
        return usage();
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        perror("rusage_run: fork");
        return 3;
    }
    if (pid == 0) {
        setpgid(0, 0); /* a group of its own, killed whole at the time limit */
        if (mib) {
            struct rlimit rl = {(rlim_t)mib << 20, (rlim_t)mib << 20};
            setrlimit(RLIMIT_AS, &rl);
        }
        execvp(argv[i], argv + i);
        fprintf(stderr, "rusage_run: %s: %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* either side may run first */
    child = pid;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: wait4 returns EINTR */
    sigaction(SIGALRM, &sa, NULL);
    alarm((unsigned)seconds);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("rusage_run: wait4");
            return 3;
        }
    }
    alarm(0);
    double wall = now_ms() - t0;
    int rc = timed_out ? 124 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = report ? fopen(report, "w") : stderr;
    if (!f) {
        perror("rusage_run: report");
        return 3;
    }
    char st[16];
    if (timed_out)
        snprintf(st, sizeof st, "timeout");
    else
        snprintf(st, sizeof st, "%d", rc);
    fprintf(f, "maxrss_kib=%ld wall_ms=%.0f status=%s\n", ru.ru_maxrss, wall, st);
    if (f != stderr)
        fclose(f);
    return rc;
}
