/*
 * cli.c - helpers shared by the engram command's source files: error
 * reporting and exit codes, number and file parsing, timing, the progress
 * bar.  Only the public API of the libraries is used.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

int fail_oom(const char *what, size_t bytes)
{
    if (bytes)
        fprintf(stderr, "%s: %s: out of memory (%zu bytes)\n", prog, what, bytes);
    else
        fprintf(stderr, "%s: %s: out of memory\n", prog, what);
    return EXIT_SYSTEM;
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

/* Length of the well-formed UTF-8 sequence at s[0 .. n) (RFC 3629: no
 * overlongs, no surrogates, nothing past U+10FFFF), or, as a negative
 * number, the length of its maximal ill-formed subpart: the lead byte and
 * the continuation bytes that could still have completed it (Unicode's
 * recommended practice, which Python's decode(errors='replace') follows). */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0) /* a continuation byte, C0, C1 or F5..FF */
        return -1;
    /* the second byte's range depends on the lead (overlongs, surrogates,
     * past U+10FFFF), every later one is 80..BF */
    unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n || s[i] < lo || s[i] > hi)
            return -i;
        lo = 0x80;
        hi = 0xbf;
    }
    return len;
}

void cli_json_string(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    fputc('"', f);
    while (n > 0) {
        unsigned char c = *p;
        int len = utf8_seq(p, n);
        if (len < 0) {
            fputs("\\ufffd", f);
            len = -len;
        } else if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            const char *e = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (e)
                fputs(e, f);
            else
                fprintf(f, "\\u%04x", c);
        } else {
            fwrite(p, 1, (size_t)len, f);
        }
        p += len;
        n -= (size_t)len;
    }
    fputc('"', f);
}

const char *row_reason(const engram_error *err)
{
    const char *p = strstr(err->msg, ": ");
    return p ? p + 2 : err->msg;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') /* no sign, no leading space */
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

/* Opens path for reading ("-": the standard input, not to be closed): fd,
 * or -errno.  A directory is -EISDIR at once: it opens for reading on
 * Linux and fails only at its first read (through stdio, as a bare
 * "Input/output error"). */
static int open_input(const char *path)
{
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? -EISDIR : 0;
    if (rc < 0 && fd != STDIN_FILENO)
        close(fd);
    return rc < 0 ? rc : fd;
}

/* read(2) retried on EINTR: bytes read (0 at the end) or -errno. */
static ssize_t read_some(int fd, void *buf, size_t n)
{
    ssize_t r;
    do
        r = read(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

int slurp(const char *path, size_t max, char **buf, size_t *len)
{
    int fd = open_input(path);
    if (fd < 0)
        return fd;
    size_t cap = max < (1u << 16) ? max + 1 : 1u << 16, n = 0;
    char *b = malloc(cap + 1);
    int rc = b ? 0 : -ENOMEM;
    while (rc == 0) {
        if (n == cap) {
            if (cap > max) { /* max + 1 bytes are in: too many */
                rc = -EFBIG;
                break;
            }
            size_t ncap = cap > max / 2 ? max + 1 : 2 * cap;
            char *nb = realloc(b, ncap + 1);
            if (!nb) {
                rc = -ENOMEM;
                break;
            }
            b = nb;
            cap = ncap;
        }
        ssize_t got = read_some(fd, b + n, cap - n);
        if (got <= 0) {
            rc = got < 0 ? (int)got : 0;
            break;
        }
        n += (size_t)got;
    }
    if (rc == 0 && n > max)
        rc = -EFBIG;
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int input_regular(const char *path, const struct stat *st)
{
    if (S_ISDIR(st->st_mode)) {
        fprintf(stderr, "%s: cannot read '%s': %s\n", prog, path, strerror(EISDIR));
        return EXIT_SYSTEM;
    }
    if (!S_ISREG(st->st_mode)) {
        fprintf(stderr, "%s: '%s' is not a regular file: this input is read by its size\n", prog,
                path);
        return EXIT_DATA;
    }
    return 0;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* An item's characters: a longer one is invalid whatever follows. */
#define ITEM_MAX 31

/* The items of p[0, len) into out[0, cap): stops when cap numbers are
 * written, at len, or (unless final: more bytes may follow) before an
 * item that reaches len and could still be a number.  *used: the bytes
 * consumed; *got: the numbers written.  0, or -EINVAL: the item after
 * them is invalid.  Every byte counts: a NUL makes its item invalid. */
static int scan_numbers(const char *p, size_t len, int final, uint64_t max, uint32_t *out,
                        size_t cap, size_t *used, size_t *got)
{
    size_t i = 0, n = 0;
    int rc = 0;
    while (n < cap) {
        while (i < len && is_space(p[i]))
            i++;
        if (i == len)
            break;
        size_t start = i;
        while (i < len && !is_space(p[i]))
            i++;
        size_t k = i - start;
        if (i == len && !final && k <= ITEM_MAX) {
            i = start; /* its end is in the bytes to come */
            break;
        }
        char item[ITEM_MAX + 1];
        uint64_t x;
        int ok = k <= ITEM_MAX && !memchr(p + start, '\0', k);
        if (ok) {
            memcpy(item, p + start, k);
            item[k] = '\0';
            ok = parse_u64(item, max, &x) == 0;
        }
        if (!ok) {
            i = start;
            rc = -EINVAL;
            break;
        }
        out[n++] = (uint32_t)x;
    }
    *used = i;
    *got = n;
    return rc;
}

/* Whitespace-separated decimal numbers <= max in text[0, len) into a new
 * u32 array.  0; -EINVAL with *bad = the index of the first invalid item;
 * -ENOMEM. */
int parse_numbers(const char *text, size_t len, uint64_t max, uint32_t **out, size_t *count,
                  size_t *bad)
{
    size_t cap = 1024, n = 0, at = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    for (;;) {
        size_t used, got;
        int rc = scan_numbers(text + at, len - at, 1, max, v + n, cap - n, &used, &got);
        at += used;
        n += got;
        if (rc < 0) {
            free(v);
            *bad = n;
            return rc;
        }
        if (n < cap) /* stopped at the end */
            break;
        uint32_t *nv = realloc(v, 2 * cap * sizeof *v);
        if (!nv) {
            free(v);
            return -ENOMEM;
        }
        v = nv;
        cap *= 2;
    }
    *out = v;
    *count = n;
    return 0;
}

int numfile_open(struct numfile *nf, const char *path, uint64_t max, const char *what)
{
    nf->path = path;
    nf->what = what;
    nf->max = max;
    nf->items = nf->at = nf->len = 0;
    nf->eof = 0;
    nf->fd = open_input(path);
    nf->own = nf->fd != STDIN_FILENO;
    if (nf->fd < 0) {
        fprintf(stderr, "%s: cannot read %s file '%s': %s\n", prog, what, path, strerror(-nf->fd));
        return EXIT_SYSTEM;
    }
    return 0;
}

int numfile_read(struct numfile *nf, uint32_t *out, size_t cap, size_t *got)
{
    size_t n = 0;
    *got = 0;
    while (n < cap) {
        size_t used, k;
        int rc = scan_numbers(nf->buf + nf->at, nf->len - nf->at, nf->eof, nf->max, out + n,
                              cap - n, &used, &k);
        nf->at += used;
        n += k;
        nf->items += k;
        if (rc < 0) {
            fprintf(stderr, "%s: %s file '%s': item %zu is not a decimal number <= %" PRIu64 "\n",
                    prog, nf->what, nf->path, nf->items, nf->max);
            return EXIT_DATA;
        }
        if (n == cap || nf->eof)
            break;
        /* what is left is part of an item, at most ITEM_MAX bytes: keep it
         * and read on */
        memmove(nf->buf, nf->buf + nf->at, nf->len - nf->at);
        nf->len -= nf->at;
        nf->at = 0;
        ssize_t r = read_some(nf->fd, nf->buf + nf->len, sizeof nf->buf - nf->len);
        if (r < 0) {
            fprintf(stderr, "%s: cannot read %s file '%s': %s\n", prog, nf->what, nf->path,
                    strerror((int)-r));
            return EXIT_SYSTEM;
        }
        nf->len += (size_t)r;
        nf->eof = r == 0;
    }
    *got = n;
    return 0;
}

void numfile_close(struct numfile *nf)
{
    if (nf->fd >= 0 && nf->own)
        close(nf->fd);
    nf->fd = -1;
}

int read_numbers(const char *path, uint64_t max, uint32_t **out, size_t *count, const char *what)
{
    struct numfile *nf = malloc(sizeof *nf);
    size_t cap = 1024, n = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (nf)
        nf->fd = -1;
    int st = nf && v ? numfile_open(nf, path, max, what) : -ENOMEM;
    while (st == 0) {
        size_t got;
        if (n == cap && cap == CLI_MAX_ITEMS) {
            uint32_t one;
            st = numfile_read(nf, &one, 1, &got);
            if (st == 0 && got) {
                fprintf(stderr, "%s: %s file '%s': more than %u items (the limit)\n", prog, what,
                        path, CLI_MAX_ITEMS);
                st = EXIT_DATA;
            }
            break;
        }
        if (n == cap) {
            size_t ncap = 2 * cap < CLI_MAX_ITEMS ? 2 * cap : CLI_MAX_ITEMS;
            uint32_t *nv = realloc(v, ncap * sizeof *v);
            if (!nv) {
                st = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        st = numfile_read(nf, v + n, cap - n, &got);
        n += got;
        if (n < cap) /* the end */
            break;
    }
    if (nf)
        numfile_close(nf);
    if (st == -ENOMEM) {
        fprintf(stderr, "%s: %s file '%s': out of memory\n", prog, what, path);
        st = EXIT_SYSTEM;
    }
    free(nf);
    if (st) {
        free(v);
        return st;
    }
    *out = v;
    *count = n;
    return 0;
}

/* One field of a .npy header dict: the quoted string, the (tuple) or the
 * bare word after key. */
static int npy_field(const char *hdr, const char *key, char *out, size_t n)
{
    const char *p = strstr(hdr, key);
    if (!p)
        return -1;
    p = strchr(p + strlen(key), ':');
    if (!p)
        return -1;
    p++;
    while (*p == ' ')
        p++;
    size_t k = 0;
    if (*p == '\'') {
        p++;
        while (*p && *p != '\'' && k + 1 < n)
            out[k++] = *p++;
        if (*p != '\'')
            return -1; /* unterminated or too long */
    } else if (*p == '(') {
        while (*p && *p != ')' && k + 1 < n)
            out[k++] = *p++;
        if (*p != ')')
            return -1;
    } else {
        while (*p && *p != ',' && *p != '}' && k + 1 < n)
            out[k++] = *p++;
    }
    out[k] = '\0';
    return 0;
}

int npy_parse(const uint8_t *p, size_t avail, uint64_t file_size, struct npy_info *o)
{
    memset(o, 0, sizeof *o);
    if (avail < 10 || memcmp(p, "\x93NUMPY", 6) != 0)
        return -ENOENT;
    uint64_t hl = (uint64_t)p[8] | (uint64_t)p[9] << 8, off = 10; /* version 1 */
    if (p[6] == 2 || p[6] == 3) {
        if (avail < 12)
            return -EBADMSG;
        hl |= (uint64_t)p[10] << 16 | (uint64_t)p[11] << 24;
        off = 12;
    } else if (p[6] != 1) {
        return -EBADMSG;
    }
    if (hl > NPY_MAX_HEADER || off + hl > avail || off + hl > file_size)
        return -EBADMSG;
    char hdr[NPY_MAX_HEADER + 1];
    memcpy(hdr, p + off, hl);
    hdr[hl] = '\0';
    if (memchr(hdr, '\0', hl))
        return -EBADMSG;
    char descr[16], order[16], shape[128];
    if (npy_field(hdr, "'descr'", descr, sizeof descr) < 0 ||
        npy_field(hdr, "'fortran_order'", order, sizeof order) < 0 ||
        npy_field(hdr, "'shape'", shape, sizeof shape) < 0 || shape[0] != '(')
        return -EBADMSG;
    if (!strcmp(descr, "<f4"))
        o->bf16 = 0;
    else if (!strcmp(descr, "<u2") || !strcmp(descr, "<i2"))
        o->bf16 = 1; /* numpy has no bfloat16: its bit patterns */
    else
        return -ENOTSUP;
    if (strcmp(order, "False") != 0 && strcmp(order, "True") != 0)
        return -EBADMSG;
    /* C order is required unless at most one axis has more than one element */
    uint64_t count = 1, big_axes = 0;
    for (char *q = shape + 1; *q;) {
        while (*q == ' ' || *q == ',')
            q++;
        if (!*q)
            break;
        if (*q < '0' || *q > '9')
            return -EBADMSG;
        char *end;
        errno = 0;
        unsigned long long d = strtoull(q, &end, 10);
        if (errno)
            return -EBADMSG;
        if (d > 1)
            big_axes++;
        if (d && count > UINT64_MAX / d)
            return -EBADMSG;
        count *= d;
        q = end;
    }
    if (!strcmp(order, "True") && big_axes > 1)
        return -EDOM;
    uint64_t es = o->bf16 ? 2 : 4;
    if (count > (file_size - off - hl) / es)
        return -EBADMSG;
    o->data_offset = off + hl;
    o->count = count;
    return 0;
}

int open_model_any(const char *path, engram_model **m)
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
    engram_history v;
    int n = 0;
    for (const char *p = s;; n++) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        char item[16];
        uint64_t x;
        if (n >= ENGRAM_HISTORY || k == 0 || k >= sizeof item)
            return -1; /* too many, empty ("1,,2") or too long */
        memcpy(item, p, k);
        item[k] = '\0';
        if (!strcmp(item, "-1"))
            v.id[n] = ENGRAM_DEAD;
        else if (parse_u64(item, INT32_MAX, &x) == 0)
            v.id[n] = (int32_t)x;
        else
            return -1;
        if (!e)
            break;
        p = e + 1;
    }
    if (n + 1 != ENGRAM_HISTORY)
        return -1;
    *h = v; /* written only when all of it is valid */
    return 0;
}


/* The standard output's descriptor once an output named "-" has claimed it
 * (fd 1 then goes to the standard error, for the report); -1 before. */
static int stdout_data = -1;

/* -ELOOP, -EISDIR, -ENOTSUP, -EPERM (another user's node in a sticky
 * folder): a kind of path refused (usage); the rest are system errors. */
static int refused_kind(int rc)
{
    return rc == -ELOOP || rc == -EISDIR || rc == -ENOTSUP || rc == -EPERM;
}

int fout_check(const char *path, unsigned flags)
{
    if (!strcmp(path, "-")) {
        if (flags & ENGRAM_OUTPUT_SEEKABLE)
            return fail_usage("'-' (standard output) cannot take this output: it is written at "
                              "offsets, so it must be a regular file or a new name");
        if (stdout_data >= 0)
            return 0;
        /* claimed now, before the command prints anything: the data takes
         * the standard output, the report moves to the standard error */
        fflush(stdout);
        int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
        if (fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
            fprintf(stderr, "%s: cannot write to the standard output: %s\n", prog,
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            return EXIT_SYSTEM;
        }
        stdout_data = fd;
        return 0;
    }
    engram_error err = {0};
    int rc = engram_output_check(path, flags, &err);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return refused_kind(rc) ? EXIT_USAGE : EXIT_SYSTEM;
    }
    return 0;
}

int fout_distinct(const char *const *paths, const char *const *names, int n, int n_outputs)
{
    for (int i = 0; i < n_outputs; i++)
        for (int j = 0; j < n; j++) {
            if (j == i || !paths[i] || !paths[j] || (j < n_outputs && j < i))
                continue;
            int out_j = j < n_outputs;
            int same = !strcmp(paths[i], "-")
                           ? out_j && !strcmp(paths[j], "-")
                           : strcmp(paths[j], "-") && engram_output_same(paths[i], paths[j]);
            if (same)
                return fail_usage("%s '%s' and %s '%s' are the same file", names[i], paths[i],
                                  names[j], paths[j]);
        }
    return 0;
}

int fout_open(struct fout *o, const char *path)
{
    *o = (struct fout){.path = path};
    if (!strcmp(path, "-")) {
        int st = fout_check(path, 0); /* claims it if the command did not */
        if (st)
            return st;
        if (!(o->f = fdopen(stdout_data, "wb"))) {
            fprintf(stderr, "%s: cannot write to the standard output: %s\n", prog,
                    strerror(errno));
            return EXIT_SYSTEM;
        }
        stdout_data = -1; /* the stream owns it now */
        o->out.fd = -1;
        return 0;
    }
    engram_error err = {0};
    int rc = engram_output_fopen(&o->out, path, 0, &o->f, &err);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return refused_kind(rc) ? EXIT_USAGE : EXIT_SYSTEM;
    }
    return 0;
}

int fout_close(struct fout *o, int ok)
{
    engram_error err = {0};
    int rc;
    if (o->out.fd < 0) { /* "-" */
        /* a failed flush says why; an earlier failed write only that it failed */
        rc = fflush(o->f) != 0 ? -errno : ferror(o->f) ? -EIO : 0;
        if (fclose(o->f) != 0 && rc == 0)
            rc = -errno;
        if (rc < 0)
            snprintf(err.msg, sizeof err.msg, "cannot write to the standard output: %s",
                     strerror(-rc));
    } else {
        rc = engram_output_fclose(&o->out, o->f, ok, &err);
    }
    if (rc < 0 && ok)
        fprintf(stderr, "%s: %s\n", prog, err.msg);
    return ok && rc == 0 ? 0 : EXIT_SYSTEM;
}

int64_t resident_pages(int fd, uint64_t lo, uint64_t hi)
{
    const uint64_t piece = 1ull << 30;
    long ps = sysconf(_SC_PAGESIZE);
    unsigned char *vec = malloc(piece / (uint64_t)ps);
    int64_t n = vec ? 0 : -ENOMEM;
    lo = lo / (uint64_t)ps * (uint64_t)ps;
    for (uint64_t off = lo; vec && off < hi; off += piece) {
        uint64_t len = hi - off < piece ? hi - off : piece;
        void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
        if (p == MAP_FAILED) {
            n = -errno;
            break;
        }
        int mc = mincore(p, len, vec);
        if (mc < 0)
            n = -errno;
        else
            for (uint64_t i = 0; i < (len + (uint64_t)ps - 1) / (uint64_t)ps; i++)
                n += vec[i] & 1;
        munmap(p, len);
        if (mc < 0)
            break;
    }
    free(vec);
    return n;
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

void cli_seeded_resid(uint64_t seed, uint64_t first, size_t count, float *out)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t z = seed * 0x2545f4914f6cdd1dull + first + i + 0x9e3779b97f4a7c15ull; /* splitmix64 */
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        uint64_t r = z ^ (z >> 31);
        union { float f; uint32_t u; } v;
        v.f = ((float)(r >> 40) / (float)(1u << 24) - 0.5f) * 8.0f;
        v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u; /* BF16, nearest even */
        out[i] = v.f;
    }
}
