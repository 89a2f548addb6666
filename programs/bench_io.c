/*
 * bench_io.c - `engram bench io`: the project's reader against the device's
 * limit (fio on the same file, same block size and depth, O_DIRECT +
 * io_uring) and against a baseline that does what the reference engine does
 * on Linux (16 threads created per 2048-token batch, plain cached pread of
 * 264 bytes, per-batch de-duplication), all in one run.
 *
 * This file is the command (options, the machine and reader it reports,
 * the sections it runs), fio and sections (a) and (b); section (c) and
 * the baseline reader are in bench_prefill.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ------------------------------------------------------------ fio */

struct fio_result {
    int ok;
    double iops, clat_p50_us, clat_p99_us, lat_mean_us;
};

static double json_number_after(const char *s, const char *key)
{
    const char *p = s ? strstr(s, key) : NULL;
    if (!p)
        return -1;
    p = strchr(p + strlen(key), ':');
    return p ? strtod(p + 1, NULL) : -1;
}

enum fio_mode {
    FIO_PLAIN,        /* SPEC.md section 11's command: bs = alignment        */
    FIO_MIX,          /* the same with engram's read sizes: rows that cross a
                         block boundary need two blocks (--bssplit)          */
    FIO_MIX_BATCHED,  /* the mix with batched submission, registered file and
                         buffers                                              */
    FIO_STEPS,        /* a step's reads (48, PLE 16) submitted and completed
                         together                                             */
    FIO_MIX_PSYNC,    /* the mix from `depth` jobs of blocking reads (psync):
                         the thread pool's way, with as many threads          */
    FIO_BS1,          /* bs = alignment only (rows inside one block)          */
    FIO_BS2           /* bs = 2 x alignment only (rows that straddle two)     */
};

#define FIO_MIN_S 0.1 /* fio's shortest run, in seconds */

/* fio's run for secs seconds, FIO_MIN_S at least */
static double fio_secs(double secs)
{
    return secs < FIO_MIN_S ? FIO_MIN_S : secs;
}

static struct fio_result run_fio(struct bench *b, unsigned depth, enum fio_mode mode, double secs)
{
    struct fio_result r = {0};
    char cmd[1024], extra[256] = "", bs[96];
    uint64_t off = b->in.table[0].offset / b->align * b->align;
    uint64_t size = b->in.table[0].bytes / b->align * b->align;
    if (mode == FIO_STEPS) /* steps read every table: the same span of the file */
        size = (b->in.table[b->tables - 1].offset + b->in.table[b->tables - 1].bytes - off) /
               b->align * b->align;
    if (mode == FIO_MIX || mode == FIO_MIX_BATCHED || mode == FIO_STEPS || mode == FIO_MIX_PSYNC)
        snprintf(bs, sizeof bs, "--bssplit=%u/%u:%u/%u --blockalign=%u", b->align,
                 100 - b->cross_pct, 2 * b->align, b->cross_pct, b->align);
    else if (mode == FIO_BS2)
        snprintf(bs, sizeof bs, "--bs=%u --blockalign=%u", 2 * b->align, b->align);
    else
        snprintf(bs, sizeof bs, "--bs=%u", b->align);
    if (mode == FIO_MIX_BATCHED)
        snprintf(extra, sizeof extra,
                 "--iodepth_batch_submit=%u --iodepth_batch_complete_max=%u --registerfiles --fixedbufs",
                 depth / 4 ? depth / 4 : 1, depth);
    else if (mode == FIO_STEPS)
        snprintf(extra, sizeof extra, "--iodepth_batch_submit=%u --iodepth_batch_complete_min=%u",
                 depth, depth);
    char engine[64];
    if (mode == FIO_MIX_PSYNC) /* one read at a time per job; the jobs' sum */
        snprintf(engine, sizeof engine, "--ioengine=psync --numjobs=%u --group_reporting", depth);
    else
        snprintf(engine, sizeof engine, "--ioengine=io_uring --iodepth=%u", depth);
    snprintf(cmd, sizeof cmd,
             "fio --name=engram --filename='%s' --readonly --direct=1 --rw=randread %s "
             "%s %s --offset=%" PRIu64 " --size=%" PRIu64
             " --runtime=%.0fms --time_based --norandommap --randrepeat=0 --output-format=json 2>/dev/null",
             b->path, bs, engine, extra, off, size, fio_secs(secs) * 1000);
    FILE *p = popen(cmd, "r");
    if (!p)
        return r;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, p);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) { /* no figures rather than figures from half the output */
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int status = pclose(p);
    if (!buf)
        return r;
    buf[n] = '\0';
    const char *rd = strstr(buf, "\"read\"");
    if (status == 0 && rd) {
        r.iops = json_number_after(rd, "\"iops\"");
        const char *clat = strstr(rd, "\"clat_ns\"");
        const char *pct = clat ? strstr(clat, "\"percentile\"") : NULL;
        r.clat_p50_us = json_number_after(pct, "\"50.000000\"") / 1e3;
        r.clat_p99_us = json_number_after(pct, "\"99.000000\"") / 1e3;
        const char *lat = strstr(rd, "\"lat_ns\"");
        r.lat_mean_us = json_number_after(lat, "\"mean\"") / 1e3;
        /* every field found (a missing one reads as -1): else no fio figures */
        r.ok = r.iops > 0 && r.clat_p50_us >= 0 && r.clat_p99_us >= 0 && r.lat_mean_us >= 0;
    }
    free(buf);
    return r;
}

/* ------------------------------------------------------------ sections */

static void print_machine(struct bench *b)
{
    char cpu[128] = "unknown", line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f)
        fclose(f);
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    printf("engram bench io  %s  |  %s, %ld cores, %.1f GiB RAM, kernel %s\n", date, cpu,
           sysconf(_SC_NPROCESSORS_ONLN), (double)pages * (double)psz / (1u << 30), u.release);
    if (b->ple)
        printf("file %s: %.2f GiB, %s (one table of %.2f GiB: %u-byte BF16 rows, 16 per token)\n",
               b->path, (double)b->in.file_bytes / (1u << 30), b->in.family.name,
               (double)b->in.table[0].bytes / (1u << 30), b->row_bytes);
    else
        printf("file %s: %.2f GiB (tables %.2f + %.2f GiB)\n", b->path,
               (double)b->in.file_bytes / (1u << 30), (double)b->in.table[0].bytes / (1u << 30),
               (double)b->in.table[1].bytes / (1u << 30));
}

/* Uniformly random rows for n tokens, each token's as the hash lays them
 * out (stride 48: 24 of table 0 then 24 of table 1; PLE: 16 of its one
 * table). */
static void random_rows(struct bench *b, uint32_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (unsigned k = 0; k < b->stride; k++)
            rows[i * b->stride + k] =
                (uint32_t)(bench_rnd(&b->seed) % b->in.table[k / b->cols].rows);
}

struct depth_point {
    unsigned depth;
    double ours, fio;
};

/* The smallest and largest of v[0..n). */
static void range_of(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
}

static int section_depths(struct bench *b, struct depth_point *pts)
{
    printf("\n(a) batch reads of uniformly random rows of table 0, %u-byte aligned reads\n", b->align);
    printf("    fio bs=%u: SPEC.md section 11's command.  fio same sizes: engram's read sizes\n"
           "    (%u%% of rows span two blocks: --bssplit=%u/%u:%u/%u), plain and with batched\n"
           "    submission + registered file/buffers.  IOPS: each tool's median of %d rounds (they\n"
           "    take turns, %.2f s each).  ratio: the median over the rounds of engram / the better\n"
           "    same-size fio of the same round, [its lowest, highest]; of medians: engram's median\n"
           "    / the better same-size fio median (this column's figure before 2026-12-05).\n"
           "    The thread pool (engine threads, ENGRAM_READER_THREADS(depth) threads) is also set\n"
           "    against fio's psync engine with as many jobs, same sizes, a fifth run each round.\n",
           b->align, b->cross_pct, b->align, 100 - b->cross_pct, 2 * b->align, b->cross_pct,
           b->rounds, b->seconds / b->rounds);
    printf("    %5s %12s %10s %12s %12s %7s %13s %7s %6s %10s %9s\n", "depth", "engram IOPS",
           "fio bs=512", "fio same sz", "...batched", "ratio", "[rounds]", "of med", "cores",
           "bytes/read", "engine");
    uint32_t *rows = malloc((size_t)ENGRAM_BATCH_TOKENS * b->stride * sizeof *rows);
    uint16_t *out = malloc((size_t)ENGRAM_BATCH_TOKENS * b->cols * b->row_values * 2);
    if (!rows || !out) {
        free(rows);
        free(out);
        return fail_oom("bench io: the depth sweep's buffers", 0);
    }
    for (int d = 0; d < b->n_depths; d++) {
        unsigned depth = b->depths[d];
        engram_reader_opts o = {.engine = ENGRAM_IO_AUTO, .depth = depth};
        engram_reader *r;
        engram_error err;
        if (engram_reader_open(b->m, &o, &r, &err) < 0) {
            fprintf(stderr, "%s: reader: %s\n", prog, err.msg);
            free(rows);
            free(out);
            return EXIT_SYSTEM;
        }
        size_t tokens = depth * 16u < 4 ? 4 : depth * 16u > ENGRAM_BATCH_TOKENS ? ENGRAM_BATCH_TOKENS : depth * 16u;
        /* Shared disks drift: engram and the fio runs take turns in
         * rounds, and each round's engram figure is set against the fio
         * runs beside it in time (ratio_r, over the nv rounds where a
         * same-size fio gave a figure); each tool's median round is
         * reported too. */
        const int nr = b->rounds;
        double ours_r[MAX_ROUNDS], plain_r[MAX_ROUNDS], mix_r[MAX_ROUNDS], batched_r[MAX_ROUNDS],
            psync_r[MAX_ROUNDS], psync_v[MAX_ROUNDS], cores_r[MAX_ROUNDS], ratio_r[MAX_ROUNDS],
            pratio_r[MAX_ROUNDS];
        int nv = 0, np = 0;
        double slice = b->seconds / nr;
        engram_io_stats st;
        engram_reader_get_stats(r, &st);
        unsigned r_depth = st.depth;
        /* the thread pool: fio's psync engine with as many jobs as threads */
        unsigned pool = !strcmp(st.engine, "threads") ? ENGRAM_READER_THREADS(r_depth) : 0;
        const int runs = pool ? 5 : 4;
        for (int round = 0; round < nr; round++) {
            /* The runs rotate their order every round, so no tool always
             * follows the same one (burst credits of cloud disks). */
            plain_r[round] = mix_r[round] = batched_r[round] = psync_r[round] = 0;
            for (int k = 0; k < runs; k++) {
                int which = (k + round) % runs;
                if (which > 0 && !b->use_fio)
                    continue;
                if (which == 1)
                    plain_r[round] = run_fio(b, r_depth, FIO_PLAIN, slice).iops;
                else if (which == 2)
                    mix_r[round] = run_fio(b, r_depth, FIO_MIX, slice).iops;
                else if (which == 3)
                    batched_r[round] = run_fio(b, r_depth, FIO_MIX_BATCHED, slice).iops;
                else if (which == 4)
                    psync_r[round] = run_fio(b, pool, FIO_MIX_PSYNC, slice).iops;
                if (which != 0)
                    continue;
                engram_reader_reset_stats(r);
                double t0 = now_s(), c0 = cpu_s(), t1;
                do {
                    random_rows(b, rows, tokens);
                    if (engram_reader_batch(r, 0, rows, tokens, ENGRAM_BF16, out, &err) < 0) {
                        fprintf(stderr, "%s: batch: %s\n", prog, err.msg);
                        engram_reader_close(r);
                        free(rows);
                        free(out);
                        return EXIT_SYSTEM;
                    }
                    t1 = now_s();
                } while (t1 - t0 < slice);
                cores_r[round] = (cpu_s() - c0) / (t1 - t0);
                engram_reader_get_stats(r, &st);
                ours_r[round] = (double)st.rows_read / (t1 - t0);
            }
            double fio_best = mix_r[round] > batched_r[round] ? mix_r[round] : batched_r[round];
            if (fio_best > 0)
                ratio_r[nv++] = ours_r[round] / fio_best;
            if (psync_r[round] > 0) { /* the rounds where psync gave a figure */
                psync_v[np] = psync_r[round];
                pratio_r[np++] = ours_r[round] / psync_r[round];
            }
            bench_csv_row(b, "round", "engram_iops", st.depth, ours_r[round], "reads/s");
            bench_csv_row(b, "round", "fio_same_size_iops", st.depth, mix_r[round], "reads/s");
            bench_csv_row(b, "round", "fio_batched_iops", st.depth, batched_r[round], "reads/s");
            if (pool)
                bench_csv_row(b, "round", "fio_psync_iops", st.depth, psync_r[round], "reads/s");
        }
        engram_reader_close(r);
        double lo = 0, hi = 0, ratio = 0;
        if (nv > 0) {
            range_of(ratio_r, nv, &lo, &hi);
            ratio = median(ratio_r, nv);
        }
        double iops = median(ours_r, nr), cores = median(cores_r, nr);
        double plain = median(plain_r, nr), mix = median(mix_r, nr), batched = median(batched_r, nr);
        double best = mix > batched ? mix : batched;
        pts[d] = (struct depth_point){st.depth, iops, best};
        char span[32];
        snprintf(span, sizeof span, "[%.2f, %.2f]", lo, hi);
        printf("    %5u %12.0f %10.0f %12.0f %12.0f %7.2f %13s %7.2f %6.2f %10.0f %9s\n", st.depth,
               iops, plain, mix, batched, ratio, nv > 0 ? span : "", best > 0 ? iops / best : 0,
               cores, (double)st.bytes_read / (double)st.rows_read, st.engine);
        bench_csv_row(b, "depth", "engram_iops", st.depth, iops, "reads/s");
        bench_csv_row(b, "depth", "fio_plain_iops", st.depth, plain, "reads/s");
        bench_csv_row(b, "depth", "fio_same_size_iops", st.depth, mix, "reads/s");
        bench_csv_row(b, "depth", "fio_batched_iops", st.depth, batched, "reads/s");
        bench_csv_row(b, "depth", "engram_cores", st.depth, cores, "cores");
        if (nv > 0) {
            bench_csv_row(b, "depth", "ratio_rounds", st.depth, nv, "rounds");
            bench_csv_row(b, "depth", "ratio_rounds_median", st.depth, ratio, "x");
            bench_csv_row(b, "depth", "ratio_rounds_min", st.depth, lo, "x");
            bench_csv_row(b, "depth", "ratio_rounds_max", st.depth, hi, "x");
        }
        if (np > 0) {
            double plo, phi, psync = median(psync_v, np), pratio = median(pratio_r, np);
            range_of(pratio_r, np, &plo, &phi);
            printf("    %5s thread pool of %u: fio psync, %u jobs, same sizes %.0f reads/s; ratio %.2f "
                   "[%.2f, %.2f] (rounds' median, lowest, highest)\n",
                   "", pool, pool, psync, pratio, plo, phi);
            bench_csv_row(b, "depth", "fio_psync_iops", st.depth, psync, "reads/s");
            bench_csv_row(b, "depth", "ratio_psync_median", st.depth, pratio, "x");
            bench_csv_row(b, "depth", "ratio_psync_min", st.depth, plo, "x");
            bench_csv_row(b, "depth", "ratio_psync_max", st.depth, phi, "x");
        }
        fflush(stdout);
    }
    free(rows);
    free(out);
    return 0;
}

static int section_decode(struct bench *b)
{
    const unsigned per = b->stride; /* rows of a step: 48, or PLE's 16 */
    if (b->ple)
        printf("\n(b) decode steps: 16 random rows (the one table) per step, submit then wait\n");
    else
        printf("\n(b) decode steps: 48 random rows (both tables) per step, submit then wait\n");
    engram_reader_opts o = {.engine = ENGRAM_IO_AUTO, .depth = 64};
    engram_reader *r;
    engram_error err;
    if (engram_reader_open(b->m, &o, &r, &err) < 0)
        return fail_lib(-EIO, &err, "bench io: reader");
    uint32_t rows[ENGRAM_ROWS_PER_TOKEN];   /* the larger member's */
    static uint16_t out[ENGRAM_ROWS_PER_TOKEN * ENGRAM_ROW_VALUES];
    double t0 = now_s();
    while (now_s() - t0 < b->seconds) {
        random_rows(b, rows, 1); /* per rows */
        if (engram_reader_step_submit(r, rows, ENGRAM_BF16, out, &err) < 0 ||
            engram_reader_step_wait(r, &err) < 0) {
            fprintf(stderr, "%s: step: %s\n", prog, err.msg);
            engram_reader_close(r);
            return EXIT_SYSTEM;
        }
    }
    engram_io_stats st;
    engram_reader_get_stats(r, &st);
    engram_reader_close(r);
    printf("    engram (%s): %" PRIu64 " steps, p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us\n",
           st.engine, st.steps, (double)st.step_p50_ns / 1e3, (double)st.step_p99_ns / 1e3,
           (double)st.step_p999_ns / 1e3, (double)st.step_max_ns / 1e3);
    bench_csv_row(b, "decode", "engram_p50_us", per, (double)st.step_p50_ns / 1e3, "us");
    bench_csv_row(b, "decode", "engram_p99_us", per, (double)st.step_p99_ns / 1e3, "us");
    bench_csv_row(b, "decode", "engram_p999_us", per, (double)st.step_p999_ns / 1e3, "us");
    if (b->use_fio) {
        struct fio_result f = run_fio(b, per, FIO_STEPS, b->seconds);
        if (f.ok) {
            double t_per = per / f.iops * 1e6;
            printf("    fio depth %u over %s span, same read sizes, submitted and completed\n"
                   "    %u at a time: %.0f IOPS = %.1f us per %u reads"
                   " (per-read clat p50 %.1f us, p99 %.1f us)\n", per,
                   b->tables > 1 ? "both tables'" : "the table's", per, f.iops, t_per, per,
                   f.clat_p50_us, f.clat_p99_us);
            printf("    engram step p50 / fio time per %u reads = %.2f\n", per,
                   (double)st.step_p50_ns / 1e3 / t_per);
            bench_csv_row(b, "decode", b->ple ? "fio_us_per_16" : "fio_us_per_48", per, t_per, "us");
        }
    }
    return 0;
}

/* What a row that straddles two blocks costs: fio with every read one
 * block, then every read two blocks, at depth 1 and at the sweep's deepest
 * depth (rows/s = reads/s: a read is a row), and the rate this file's mix
 * of the two would give if reads of the two sizes shared the device. */
static void section_sizes(struct bench *b)
{
    unsigned deep = 1;
    for (int d = 0; d < b->n_depths; d++)
        deep = b->depths[d] > deep ? b->depths[d] : deep;
    double secs = fio_secs(b->seconds / 2);
    printf("    read sizes (fio alone, %.1f s each): a row inside one %u-byte block is one read of\n"
           "    %u B, one across two blocks (%u%% of this file's rows) a read of %u B; (x): rows/s\n"
           "    against %u B reads; mix: the rows/s of this file's share of each, 1 / sum(share / rate)\n",
           secs, b->align, b->align, b->cross_pct, 2 * b->align, b->align);
    unsigned depths[2] = {1, deep};
    for (int i = 0; i < (deep > 1 ? 2 : 1); i++) {
        struct fio_result one = run_fio(b, depths[i], FIO_BS1, secs);
        struct fio_result two = run_fio(b, depths[i], FIO_BS2, secs);
        if (!one.ok || !two.ok) {
            printf("    depth %u: fio gave no figures\n", depths[i]);
            continue;
        }
        double c = b->cross_pct / 100.0;
        double mix = 1.0 / ((1 - c) / one.iops + c / two.iops);
        printf("    depth %3u: %u B %7.0f rows/s %6.1f MB/s | %u B %7.0f rows/s %6.1f MB/s (%.2fx)"
               " | mix %7.0f rows/s (%.2fx)\n",
               depths[i], b->align, one.iops, one.iops * b->align / 1e6, 2 * b->align, two.iops,
               two.iops * 2 * b->align / 1e6, two.iops / one.iops, mix, mix / one.iops);
        bench_csv_row(b, "sizes", "fio_1block_iops", depths[i], one.iops, "reads/s");
        bench_csv_row(b, "sizes", "fio_2block_iops", depths[i], two.iops, "reads/s");
        fflush(stdout);
    }
}

/* The depth plot as an SVG file (fout: all or nothing).  0 or an exit code. */
static int write_svg(const char *path, const struct depth_point *p, int n)
{
    struct fout o;
    int st = fout_open(&o, path);
    if (st)
        return st;
    FILE *f = o.f;
    double maxv = 1;
    for (int i = 0; i < n; i++) {
        maxv = p[i].ours > maxv ? p[i].ours : maxv;
        maxv = p[i].fio > maxv ? p[i].fio : maxv;
    }
    const int W = 640, H = 400, L = 70, R = 20, T = 30, B = 50;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='12'>\n", W, H);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='%d' y='18'>random 512 B-aligned row reads: engram vs fio (same file, O_DIRECT, io_uring)</text>\n", L);
    double lx0 = 0, lx1 = 1;
    for (int i = 0; i < n; i++) {
        double lx = __builtin_log2((double)p[i].depth);
        lx1 = lx > lx1 ? lx : lx1;
    }
#define X(d) (L + (W - L - R) * (__builtin_log2((double)(d)) - lx0) / (lx1 - lx0))
#define Y(v) (H - B - (H - T - B) * (v) / maxv)
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", L, T, L, H - B);
    for (int i = 0; i < n; i++)
        fprintf(f, "<text x='%.1f' y='%d' text-anchor='middle'>%u</text>\n", X(p[i].depth), H - B + 16, p[i].depth);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>queue depth</text>\n", (W + L) / 2, H - 10);
    for (int k = 0; k <= 4; k++)
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end'>%.0fk</text>\n", L - 6, Y(maxv * k / 4) + 4, maxv * k / 4 / 1e3);
    const char *colors[2] = {"#d62728", "#1f77b4"};
    const char *names[2] = {"engram", "fio (better of plain and batched)"};
    for (int s = 0; s < 2; s++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colors[s]);
        for (int i = 0; i < n; i++)
            fprintf(f, "%.1f,%.1f ", X(p[i].depth), Y(s ? p[i].fio : p[i].ours));
        fprintf(f, "'/>\n<text x='%d' y='%d' fill='%s'>%s IOPS</text>\n", L + 10, T + 16 + 16 * s, colors[s], names[s]);
    }
#undef X
#undef Y
    fprintf(f, "</svg>\n");
    return fout_close(&o, !ferror(f));
}

/* A size with an optional K, M, G or T suffix (powers of 1024), e.g. 32G
 * or 1.5M.  0, or -1 if it is not one (negative, trailing text, > 2^50). */
static int parse_size(const char *v, uint64_t *out)
{
    char *end;
    double x = strtod(v, &end);
    double mult = 1;
    switch (*end) {
    case 'K': case 'k': mult = 1024.0; end++; break;
    case 'M': case 'm': mult = 1048576.0; end++; break;
    case 'G': case 'g': mult = 1073741824.0; end++; break;
    case 'T': case 't': mult = 1099511627776.0; end++; break;
    default: break;
    }
    if (end == v || *end || !(x >= 0) || x * mult > 1125899906842624.0)
        return -1;
    *out = (uint64_t)(x * mult);
    return 0;
}

/* ------------------------------------------------------------ create */

static int create_file(const char *path, uint64_t bytes)
{
    /* Tables of ~bytes in all: rows per table ~ bytes / 2 / 264, base ~ rows / 24. */
    uint64_t base = bytes / 2 / ENGRAM_ROW_BYTES / ENGRAM_COLUMNS;
    if (base < 100 || base > UINT32_MAX / 64)
        return fail_usage("bench io: --create size out of range");
    /* engram build OUT --base B --fill pool (progress bar on a terminal) */
    char a0[] = "build", a2[] = "--base", a4[] = "--fill", a5[] = "pool", b[32];
    char *out = strdup(path);
    snprintf(b, sizeof b, "%" PRIu64, base);
    char *argv[] = {a0, out, a2, b, a4, a5, NULL};
    printf("creating %s (%.1f GiB, base %" PRIu64 ")\n", path, (double)bytes / (1u << 30), base);
    int rc = out ? cmd_build(6, argv) : EXIT_SYSTEM;
    free(out);
    return rc;
}

/* ------------------------------------------------------------ main */

static const char *bench_io_help =
    "usage: engram bench io FILE [--create SIZE] [--depths 1,2,...] [--seconds S]\n"
    "                        [--rounds N] [--corpus TOKENS]... [--csv OUT.csv] [--svg OUT.svg]\n"
    "                        [--max-tokens N] [--cache SIZE] [--sections abc]\n"
    "                        [--no-fio] [--no-baseline]\n"
    "FILE is a model (V4.1, or a PLE file: its one table, 16 rows per token); with\n"
    "--create SIZE (e.g. 32G) a V4.1 model is written first if FILE does not exist\n"
    "(tables of SIZE in all, valid rows; use more than RAM).  Measures in one run:\n"
    " (a) the reader's batch IOPS at each depth vs fio on the same file and region\n"
    "     (O_DIRECT, io_uring, same block size and depth), and the CPU cores used;\n"
    "     then fio with every read one block, then two (the rows that straddle\n"
    "     blocks), at depth 1 and the deepest depth: what a straddling row costs;\n"
    " (b) decode steps of 48 rows (PLE 16): p50/p99/p99.9 vs fio's time for as many\n"
    "     reads at that depth;\n"
    " (c) prefill of each token file (hashed, 2048-token batches, every table) vs the\n"
    "     baseline reader (the reference on Linux: 16 threads per batch, cached pread),\n"
    "     with page-cache growth of both and the share de-duplication saved; also\n"
    "     engram with a row cache of --cache SIZE (default 256M; 0 leaves it out).\n"
    "Default depths 1,2,4,8,16,32,48,64,128,256; --seconds per measurement (8), split\n"
    "into --rounds N (8, up to 32) in which engram and the fio runs take turns in\n"
    "rotating order (shared disks drift: each round's engram figure is set against\n"
    "the fio runs of its round, and medians are reported; a multiple of 4 gives\n"
    "each tool each place in the order equally often; a fio run lasts at least\n"
    "0.1 s); --csv also writes each round's figures (section \"round\");\n"
    "--max-tokens N (up to 2^24) reads the first N tokens of each corpus; else a\n"
    "corpus of more than 2^24 is refused.\n"
    "fio must be installed (apt-get install fio) for the device-limit columns.\n";

/* What the command line asks beyond the run's settings. */
struct bench_opts {
    const char *csv, *svg;    /* --csv, --svg: files to write             */
    uint64_t create;          /* --create SIZE: bytes of tables, 0: none   */
};

/* The settings of a run (b) and the rest of the command line (o): 0, or
 * the exit code of a usage error (printed). */
static int parse_bench_opts(int argc, char **argv, struct bench *b, struct bench_opts *o)
{
    memset(b, 0, sizeof *b);
    memset(o, 0, sizeof *o);
    b->seconds = 8;
    b->rounds = 8;
    b->use_fio = b->use_baseline = 1;
    b->seed = 12345;
    b->cache_bytes = 256ull << 20;
    const unsigned defaults[] = {1, 2, 4, 8, 16, 32, 48, 64, 128, 256};
    memcpy(b->depths, defaults, sizeof defaults);
    b->n_depths = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--create") && v) {
            if (parse_size(v, &o->create) < 0)
                return fail_usage("bench io: bad --create '%s' (e.g. 32G)", v);
            i++;
        } else if (!strcmp(a, "--depths") && v) {
            b->n_depths = 0;
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t && b->n_depths < MAX_DEPTHS; t = strtok_r(NULL, ",", &save)) {
                uint64_t d;
                if (parse_u64(t, ENGRAM_READER_MAX_DEPTH, &d) < 0 || d == 0) {
                    int st = fail_usage("bench io: bad depth '%s'", t); /* t lies in copy */
                    free(copy);
                    return st;
                }
                b->depths[b->n_depths++] = (unsigned)d;
            }
            free(copy);
            i++;
        } else if (!strcmp(a, "--seconds") && v) {
            char *end;
            b->seconds = strtod(v, &end);
            if (end == v || *end || !(b->seconds > 0 && b->seconds <= 86400))
                return fail_usage("bench io: --seconds takes a number of seconds in (0, 86400]");
            i++;
        } else if (!strcmp(a, "--rounds") && v) {
            uint64_t x;
            if (parse_u64(v, MAX_ROUNDS, &x) < 0 || x == 0)
                return fail_usage("bench io: --rounds takes 1 to %d", MAX_ROUNDS);
            b->rounds = (int)x;
            i++;
        } else if (!strcmp(a, "--corpus") && v) {
            if (b->n_corpora < MAX_CORPORA)
                b->corpora[b->n_corpora++] = v;
            i++;
        } else if (!strcmp(a, "--csv") && v) {
            o->csv = v;
            i++;
        } else if (!strcmp(a, "--svg") && v) {
            o->svg = v;
            i++;
        } else if (!strcmp(a, "--max-tokens") && v) {
            uint64_t x;
            if (parse_u64(v, SIZE_MAX, &x) < 0)
                return fail_usage("bench io: bad --max-tokens");
            b->max_tokens = (size_t)x;
            i++;
        } else if (!strcmp(a, "--cache") && v) {
            if (parse_size(v, &b->cache_bytes) < 0 || b->cache_bytes > (1ull << 40) ||
                (b->cache_bytes > 0 && b->cache_bytes < ENGRAM_READER_MIN_CACHE))
                return fail_usage("bench io: bad --cache '%s' (0, or 64K to 1T)", v);
            i++;
        } else if (!strcmp(a, "--sections") && v) {
            if (!*v || strspn(v, "abc") != strlen(v))
                return fail_usage("bench io: --sections takes letters of 'abc' (a depths, b decode, "
                                  "c prefill)");
            b->sections = v;
            i++;
        } else if (!strcmp(a, "--no-fio")) {
            b->use_fio = 0;
        } else if (!strcmp(a, "--no-baseline")) {
            b->use_baseline = 0;
        } else if (a[0] == '-') {
            return fail_usage("bench io: unknown option '%s'", a);
        } else if (!b->path) {
            b->path = a;
        } else {
            return fail_usage("bench io: more than one FILE");
        }
    }
    if (!b->path)
        return fail_usage("bench io: FILE is required");
    if (b->n_corpora == 0)
        b->corpora[b->n_corpora++] = "data/gpl3.tok";
    /* --create writes FILE at offsets when it does not exist: a node or
     * link there is refused, not opened as a model */
    struct stat fs;
    if (o->create && stat(b->path, &fs) == 0 && !S_ISREG(fs.st_mode)) {
        int cst = fout_check(b->path, ENGRAM_OUTPUT_SEEKABLE);
        if (cst)
            return cst;
    }
    /* the outputs, before anything is read or created: kinds fout writes,
     * neither the same file as the other or as an input */
    const char *paths[3 + MAX_CORPORA] = {o->csv, o->svg, b->path};
    const char *names[3 + MAX_CORPORA] = {"--csv", "--svg", "FILE"};
    for (int k = 0; k < b->n_corpora; k++) {
        paths[3 + k] = b->corpora[k];
        names[3 + k] = "--corpus";
    }
    int st = o->csv ? fout_check(o->csv, 0) : 0;
    if (!st && o->svg)
        st = fout_check(o->svg, 0);
    return st ? st : fout_distinct(paths, names, 3 + b->n_corpora, 2);
}

/* The reader's alignment, and the share of rows that span two aligned
 * blocks (fio's read sizes); prints the machine and the reader.  0 or an
 * exit code. */
static int probe_reader(struct bench *b)
{
    engram_reader *r;
    engram_error err;
    engram_io_stats s;
    if (engram_reader_open(b->m, NULL, &r, &err) < 0)
        return fail_lib(-EIO, &err, "reader");
    engram_reader_get_stats(r, &s);
    b->align = s.align > 1 ? s.align : 512;
    /* Rows start at multiples of the row size (264, PLE 320) from the
     * table offset: count the share whose bytes span two aligned blocks
     * (4096 rows: a whole number of periods for either size and any
     * power-of-two alignment up to 4096). */
    unsigned cross = 0;
    for (unsigned k = 0; k < 4096; k++) {
        uint64_t o = b->in.table[0].offset + (uint64_t)k * b->row_bytes;
        cross += o / b->align != (o + b->row_bytes - 1) / b->align;
    }
    b->cross_pct = (cross * 100 + 2048) / 4096;
    print_machine(b);
    printf("reader: %s, %s, alignment %u%s%s\n", s.engine, s.direct ? "O_DIRECT" : "buffered",
           s.align, s.note[0] ? "; " : "", s.note);
    printf("rows: %u bytes at table offset %" PRIu64 " + %u x row: %u of 4096 (%.1f%%) span two "
           "%u-byte blocks (a %u-byte read)\n", b->row_bytes, b->in.table[0].offset, b->row_bytes,
           cross, 100.0 * cross / 4096, b->align, 2 * b->align);
    engram_reader_close(r);
    return 0;
}

/* The sections --sections names (default all), in order, each only if
 * the one before succeeded.  0 or an exit code. */
static int run_sections(struct bench *b, const char *svg)
{
    struct depth_point pts[MAX_DEPTHS];
    const char *sec = b->sections ? b->sections : "abc";
    int rc = 0;
    if (strchr(sec, 'a')) {
        rc = section_depths(b, pts);
        if (!rc && b->use_fio)
            section_sizes(b);
        if (!rc && svg)
            rc = write_svg(svg, pts, b->n_depths);
    }
    if (!rc && strchr(sec, 'b'))
        rc = section_decode(b);
    if (!rc && strchr(sec, 'c'))
        rc = bench_section_prefill(b);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "io") != 0) {
        if (has_help(argc, argv)) {
            fputs(bench_io_help, stdout);
            return 0;
        }
        return fail_usage("bench: the only benchmark here is 'io' (bench_core is build/bench/bench_core)");
    }
    argc--;
    argv++;
    if (has_help(argc, argv)) {
        fputs(bench_io_help, stdout);
        return 0;
    }
    struct bench b;
    struct bench_opts o;
    int rc = parse_bench_opts(argc, argv, &b, &o);
    if (rc)
        return rc;
    struct stat st;
    if (o.create && stat(b.path, &st) != 0) {
        rc = create_file(b.path, o.create);
        if (rc)
            return rc;
    }
    if (b.use_fio && system("fio --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "%s: fio not found (apt-get install fio); device-limit columns skipped\n", prog);
        b.use_fio = 0;
    }
    rc = open_model_any(b.path, &b.m);
    if (rc)
        return rc;
    engram_model_get_info(b.m, &b.in);
    b.l = engram_model_layout(b.m);
    const engram_family *fam = &b.in.family;
    b.ple = fam->member == ENGRAM_MEMBER_PLE;
    b.tables = fam->tables;
    b.cols = fam->rows_per_token;
    b.stride = fam->tables * fam->rows_per_token;
    b.row_bytes = fam->row_bytes;
    b.row_values = fam->row_values;
    rc = probe_reader(&b);
    if (rc) {
        engram_model_close(b.m);
        return rc;
    }
    struct fout csv;
    if (o.csv && (rc = fout_open(&csv, o.csv)) != 0) {
        engram_model_close(b.m);
        return rc;
    }
    if (o.csv) {
        b.csv = csv.f;
        fprintf(b.csv, "section,what,depth,value,unit\n");
    }
    rc = run_sections(&b, o.svg);
    if (o.csv) {
        int c = fout_close(&csv, rc == 0 && !ferror(csv.f));
        rc = rc ? rc : c;
    }
    engram_model_close(b.m);
    return rc;
}
