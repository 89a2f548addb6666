/*
 * cli.c - helpers shared by the engram command's source files: error
 * reporting and exit codes, number and file parsing, timing, the progress
 * bar.  Only the public API of the libraries is used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

const char *prog = "engram";

int fail_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(try '%s --help')\n", prog);
    return EXIT_USAGE;
}

/* Maps a library error to an exit code after printing it. */
int fail_lib(int rc, const engram_error *err, const char *what)
{
    const char *msg = err && err->msg[0] ? err->msg : engram_strerror(rc);
    fprintf(stderr, "%s: %s: %s\n", prog, what, msg);
    switch (rc) {
    case -EBADMSG: case -EDOM: case -ENOTSUP: case -EINVAL: case -ERANGE:
        return EXIT_DATA;
    default:
        return EXIT_SYSTEM;
    }
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

int has_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

/* Reads a whole file (or "-" for stdin); the caller frees *buf. */
int slurp(const char *path, char **buf, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *nb = realloc(b, 2 * cap + 1);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    int rc = b ? (ferror(f) ? -EIO : 0) : -ENOMEM;
    if (f != stdin)
        fclose(f);
    if (rc < 0) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* Whitespace-separated decimal numbers <= max into a new u32 array. */
int read_numbers(const char *path, uint64_t max, uint32_t **out, size_t *count,
                        const char *what)
{
    char *text = NULL;
    size_t len;
    int rc = slurp(path, &text, &len);
    if (rc < 0) {
        fprintf(stderr, "%s: cannot read %s file '%s': %s\n", prog, what, path, strerror(-rc));
        return EXIT_SYSTEM;
    }
    size_t cap = 1024, n = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    char *p = text;
    int status = v ? 0 : EXIT_SYSTEM;
    while (status == 0) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *start = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            p++;
        char save = *p;
        *p = '\0';
        uint64_t x;
        if (parse_u64(start, max, &x) < 0) {
            fprintf(stderr, "%s: %s file '%s': item %zu ('%.40s') is not a decimal number <= %" PRIu64 "\n",
                    prog, what, path, n, start, max);
            status = EXIT_DATA;
            break;
        }
        *p = save;
        if (n == cap) {
            uint32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                status = EXIT_SYSTEM;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[n++] = (uint32_t)x;
    }
    free(text);
    if (status) {
        free(v);
        return status;
    }
    *out = v;
    *count = n;
    return 0;
}

int open_model(const char *path, engram_model **m)
{
    engram_error err = {0};
    int rc = engram_model_open(path, m, &err);
    return rc < 0 ? fail_lib(rc, &err, path) : 0;
}

void progress_bar(int t, uint64_t done, uint64_t total, double t0)
{
    double frac = total ? (double)done / (double)total : 1.0;
    double dt = now_s() - t0;
    int w = 40, k = (int)(frac * w);
    fprintf(stderr, "\rtable %d [", t);
    for (int i = 0; i < w; i++)
        fputc(i < k ? '#' : '.', stderr);
    fprintf(stderr, "] %5.1f%% %8.1f MB/s", 100.0 * frac, dt > 0 ? (double)done / dt / 1e6 : 0.0);
    fflush(stderr);
}

/* "A,B,C": 3 compressed ids, newest first, -1 = dead.  0 or -1. */
int parse_history(const char *s, engram_history *h)
{
    char *copy = strdup(s), *save = NULL;
    int n = 0, rc = copy ? 0 : -1;
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && rc == 0;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (n >= ENGRAM_HISTORY)
            rc = -1;
        else if (!strcmp(tok, "-1"))
            h->id[n++] = ENGRAM_DEAD;
        else if (parse_u64(tok, INT32_MAX, &v) == 0)
            h->id[n++] = (int32_t)v;
        else
            rc = -1;
    }
    free(copy);
    return rc == 0 && n == ENGRAM_HISTORY ? 0 : -1;
}


int fout_open(struct fout *o, const char *path)
{
    size_t n = strlen(path) + 32;
    o->path = path;
    o->tmp = malloc(n);
    if (!o->tmp)
        return EXIT_SYSTEM;
    snprintf(o->tmp, n, "%s.tmp%ld", path, (long)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f) {
        fprintf(stderr, "%s: cannot write '%s': %s\n", prog, o->tmp, strerror(errno));
        free(o->tmp);
        return EXIT_SYSTEM;
    }
    return 0;
}

/* Closes; renames into place if ok, else removes.  0 or an exit code. */
int fout_close(struct fout *o, int ok)
{
    if (fclose(o->f) != 0)
        ok = 0;
    if (ok && rename(o->tmp, o->path) != 0) {
        fprintf(stderr, "%s: cannot write '%s': %s\n", prog, o->path, strerror(errno));
        ok = 0;
    }
    if (!ok)
        unlink(o->tmp);
    free(o->tmp);
    return ok ? 0 : EXIT_SYSTEM;
}

int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        if (got == 0)
            return -EIO;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}
