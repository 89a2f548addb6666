/*
 * seccomp_run.c - runs a command with io_uring_setup refused (EPERM), as
 * Docker's default seccomp profile refuses it: installs a seccomp filter in
 * this process (no_new_privs, no privilege needed) and execs the command,
 * which inherits the filter.  Used by tests/test_fallback.sh.
 *   seccomp_run COMMAND [ARGS...]
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "seccomp_run: add this architecture's AUDIT_ARCH"
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: seccomp_run COMMAND [ARGS...]\n");
        return 2;
    }
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        fprintf(stderr, "seccomp_run: cannot install the filter: %s\n", strerror(errno));
        return 3;
    }
    /* the filter works: io_uring_setup now fails with EPERM */
    if (syscall(__NR_io_uring_setup, 1, NULL) != -1 || errno != EPERM) {
        fprintf(stderr, "seccomp_run: io_uring_setup was not refused with EPERM\n");
        return 3;
    }
    execvp(argv[1], argv + 1);
    fprintf(stderr, "seccomp_run: %s: %s\n", argv[1], strerror(errno));
    return 127;
}
