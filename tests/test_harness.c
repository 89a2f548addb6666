/*
 * test_harness.c - the harness's own promise about its private directory
 * (testutil.h, tu_tmpdir): the process that made it removes it when it
 * leaves through exit() without tu_cleanup (a fatal path) or is ended by
 * TERM, INT, HUP (an interrupted suite) or ALRM (an alarm() limit), and
 * still ends by that signal; a forked child's exit(), or its death by such
 * a signal, leaves its parent's directory alone; a signal the process
 * ignored stays ignored.  Each case runs in a child of its own with its own
 * directory, whose name comes back through a pipe; the parent then looks
 * for it with stat().
 */
#include <signal.h>
#include <sys/wait.h>

#include "testutil.h"

enum { BY_EXIT, BY_TERM, BY_INT, BY_HUP, BY_ALRM, CHILD_EXITS, CHILD_KILLED, HUP_IGNORED, CASES };

/* Each case's end: killed by sig, or (sig 0) exited with code. */
static const struct {
    const char *name;
    int sig, code;
} cases[CASES] = {
    [BY_EXIT] = {"exit(3)", 0, 3},
    [BY_TERM] = {"SIGTERM", SIGTERM, 0},
    [BY_INT] = {"SIGINT", SIGINT, 0},
    [BY_HUP] = {"SIGHUP", SIGHUP, 0},
    [BY_ALRM] = {"SIGALRM", SIGALRM, 0},
    [CHILD_EXITS] = {"a child's exit", 0, 4},  /* 4: kept through the grandchild's end */
    [CHILD_KILLED] = {"a child killed", 0, 4},
    [HUP_IGNORED] = {"SIGHUP ignored", 0, 7},
};

/* In the child: a directory of its own, a file in it, its name to fd. */
static void child_dir(int fd)
{
    tu_dir[0] = 0; /* not the parent's */
    char f[512];
    tu_path(f, sizeof f, "inside");
    FILE *fp = fopen(f, "w");
    if (fp)
        fclose(fp);
    size_t n = strlen(tu_dir) + 1;
    if (write(fd, tu_dir, n) != (ssize_t)n)
        _exit(90);
    close(fd);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void one(int how)
{
    int fd[2];
    CHECK_EQ(pipe(fd), 0);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        /* a disposition inherited as ignored would be kept: default here */
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, how == HUP_IGNORED ? SIG_IGN : SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGALRM, SIG_DFL);
        child_dir(fd[1]);
        switch (how) {
        case BY_EXIT:
            exit(3);
        case BY_ALRM:
            alarm(1);
            pause();
            break;
        case BY_TERM:
        case BY_INT:
        case BY_HUP:
            raise(cases[how].sig);
            break;
        case CHILD_EXITS:
        case CHILD_KILLED: {
            pid_t g = fork();
            if (g == 0) {
                if (how == CHILD_KILLED)
                    raise(SIGTERM); /* its handler: not its directory */
                exit(0);            /* the atexit handlers: not its directory */
            }
            int st;
            waitpid(g, &st, 0);
            int died = how == CHILD_KILLED ? WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM
                                           : WIFEXITED(st) && WEXITSTATUS(st) == 0;
            exit(!died ? 6 : exists(tu_dir) ? 4 : 5); /* then this exit removes it */
        }
        case HUP_IGNORED:
            raise(SIGHUP);
            exit(7); /* still here, then exit removes it */
        }
        _exit(91); /* the signal did not end it */
    }
    close(fd[1]);
    char dir[512] = "";
    ssize_t got = read(fd[0], dir, sizeof dir - 1);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(got > 1 && dir[got - 1] == 0);
    if (cases[how].sig)
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == cases[how].sig);
    else
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == cases[how].code);
    int left = got > 1 && exists(dir);
    CHECK(!left);
    printf("%-16s %s, directory %s\n", cases[how].name,
           WIFSIGNALED(st) ? "killed by it" : "exited", left ? "LEFT" : "removed");
    if (left) { /* do not leak it */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cleanup of %s failed\n", dir);
    }
}

int main(void)
{
    for (int how = BY_EXIT; how < CASES; how++)
        one(how);
    tu_cleanup();
    return tu_finish("test_harness");
}
