/*
 * layer.c - one Engram layer's weights (SPEC.md section 8), read once from
 * the model file and kept in the panel layout the projection kernels
 * stream: 64 outputs side by side for each input, so a kernel reads each
 * panel front to back.  The weights are validated on the way (no NaN or
 * infinity), and q_norm * k_norm is taken once.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels.h"
#include "ple_apply.h"
#include "format/layout.h"
#include "format/model.h"
#include "common/util.h"

static const char *const part_name[3] = {"engram_kv", "engram_q_norm", "engram_k_norm"};

static size_t weight_bytes(const struct engram_layer *L)
{
    return (size_t)L->panels * ENGRAM_K * PANEL * sizeof(uint16_t);
}

void engram_layer_close(engram_layer *L)
{
    if (!L)
        return;
    ple_layer_free(L->ple);
    if (L->w)
        munmap(L->w, weight_bytes(L));
    free(L->wq);
    free(L);
}

void engram_layer_get_info(const engram_layer *L, engram_layer_info *info)
{
    if (!L || !info)
        return;
    info->table = L->table;
    info->layer = L->layer;
    info->width = L->W;
    info->streams = L->S;
    info->bytes = L->bytes;
    info->member = L->ple ? ENGRAM_MEMBER_PLE : ENGRAM_MEMBER_V41;
    info->state_floats = L->ple ? ple_state_floats(L->ple) : 0;
}

/* The PLE member's one layer (table 0), through the output stage's own
 * loader (ple_layer.c). */
static int open_ple_layer(const engram_model *m, int table, engram_layer **out, engram_error *err)
{
    engram_model_info mi;
    engram_model_get_info(m, &mi);
    if (table != 0)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET,
                       "table %d: a %s model has one table, 0 (layer %u)", table, mi.family.name,
                       mi.family.layers[0]);
    struct engram_layer *L = calloc(1, sizeof *L);
    if (!L)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = ple_layer_open(model_gguf(m), model_ple(m), &L->ple, err);
    if (rc < 0) {
        free(L);
        return rc;
    }
    L->table = 0;
    L->layer = (int)mi.family.layers[0];
    L->W = ple_layer_width(L->ple);
    L->S = PLE_STREAMS;
    L->bytes = sizeof *L + ple_layer_bytes(L->ple);
    *out = L;
    return 0;
}

/* engram_kv: output o's 6144 inputs are contiguous in the file; read a
 * panel's 64 outputs at a time and transpose them into the panel. */
static int load_kv(struct engram_layer *L, int fd, const gguf_tensor *kv, engram_error *err)
{
    const size_t row_bytes = (size_t)ENGRAM_K * 2;
    uint16_t *buf = malloc(PANEL * row_bytes);
    if (!buf)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    int rc = 0;
    for (uint32_t p = 0; p < L->panels && rc == 0; p++) {
        uint32_t o0 = p * PANEL, k = L->N - o0 < PANEL ? L->N - o0 : PANEL;
        uint64_t off = kv->offset + (uint64_t)o0 * row_bytes;
        rc = util_pread_full(fd, buf, k * row_bytes, off);
        if (rc < 0) {
            rc = err_set(err, rc, off, "tensor '%s': cannot read outputs %u..%u at offset %llu: %s",
                         kv->name, o0, o0 + k - 1, (unsigned long long)off, engram_strerror(rc));
            break;
        }
        uint16_t *dst = L->w + (size_t)p * ENGRAM_K * PANEL;
        for (uint32_t j = 0; j < k && rc == 0; j++) {
            const uint16_t *src = buf + (size_t)j * ENGRAM_K;
            for (uint32_t i = 0; i < ENGRAM_K; i++) {
                uint16_t h = src[i];
                if ((h & 0x7c00u) == 0x7c00u) {
                    uint64_t at = off + ((uint64_t)j * ENGRAM_K + i) * 2;
                    rc = err_set(err, -EBADMSG, at,
                                 "tensor '%s': element [%u][%u] (offset %llu) is %s", kv->name,
                                 o0 + j, i, (unsigned long long)at, (h & 0x3ffu) ? "NaN" : "infinite");
                    break;
                }
                dst[(size_t)i * PANEL + j] = h;
            }
        }
        /* zero padding past N was left by mmap */
    }
    free(buf);
    return rc;
}

/* q_norm and k_norm [S][W] F32; wq = q * k. */
static int load_norms(struct engram_layer *L, int fd, const gguf_tensor *q, const gguf_tensor *k,
                      engram_error *err)
{
    size_t n = (size_t)L->S * L->W;
    float *kb = malloc(n * sizeof *kb);
    L->wq = malloc(n * sizeof *L->wq);
    if (!kb || !L->wq) {
        free(kb);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    }
    const gguf_tensor *t[2] = {q, k};
    float *dst[2] = {L->wq, kb};
    int rc = 0;
    for (int x = 0; x < 2 && rc == 0; x++) {
        rc = util_pread_full(fd, dst[x], n * sizeof(float), t[x]->offset);
        if (rc < 0) {
            rc = err_set(err, rc, t[x]->offset, "tensor '%s': cannot read it: %s", t[x]->name,
                         engram_strerror(rc));
            break;
        }
        for (size_t i = 0; i < n; i++)
            if (!isfinite(dst[x][i])) {
                uint64_t at = t[x]->offset + i * 4;
                rc = err_set(err, -EBADMSG, at, "tensor '%s': element [%zu][%zu] (offset %llu) is %s",
                             t[x]->name, i / L->W, i % L->W, (unsigned long long)at,
                             isnan(dst[x][i]) ? "NaN" : "infinite");
                break;
            }
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        L->wq[i] = L->wq[i] * kb[i];
        if (!isfinite(L->wq[i]))
            rc = err_set(err, -EBADMSG, q->offset + i * 4,
                         "'%s' x '%s' overflows at [%zu][%zu]", q->name, k->name, i / L->W, i % L->W);
    }
    free(kb);
    return rc;
}

int engram_layer_open(const engram_model *m, int table, engram_layer **out, engram_error *err)
{
    if (!m || !out)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "NULL argument");
    if (model_member(m) == ENGRAM_MEMBER_PLE)
        return open_ple_layer(m, table, out, err);
    if (table < 0 || table >= ENGRAM_TABLES)
        return err_set(err, -EINVAL, ENGRAM_NO_OFFSET, "table %d is not 0 or 1", table);
    const gguf_tensor *t[3];
    for (int p = 0; p < 3; p++) {
        t[p] = model_weight(m, table, p);
        if (!t[p])
            return err_set(err, -ENOENT, ENGRAM_NO_OFFSET,
                           "layer %d has no projection weights (no tensor 'blk.%d.%s.weight'): "
                           "the model carries the tables only", engram_table_layer[table],
                           engram_table_layer[table], part_name[p]);
    }
    struct engram_layer *L = calloc(1, sizeof *L);
    if (!L)
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "out of memory");
    L->table = table;
    L->layer = engram_table_layer[table];
    L->W = (uint32_t)t[1]->dims[0];
    L->S = (uint32_t)t[1]->dims[1];
    L->N = (L->S + 1) * L->W;
    L->panels = (L->N + PANEL - 1) / PANEL;
    void *w = mmap(NULL, weight_bytes(L), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) {
        size_t want = weight_bytes(L);
        free(L);
        return err_set(err, -ENOMEM, ENGRAM_NO_OFFSET, "cannot allocate %zu bytes of weights", want);
    }
    L->w = w;
#ifdef MADV_HUGEPAGE
    madvise(w, weight_bytes(L), MADV_HUGEPAGE); /* fewer TLB misses when streamed */
#endif
    /* A descriptor of our own on the same file, without read-ahead: the
     * tables follow the weights, and read-ahead would pull their first
     * megabytes into the page cache. */
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", model_fd(m));
    int own = open(proc, O_RDONLY | O_CLOEXEC);
    int fd = own >= 0 ? own : model_fd(m);
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    int rc = load_kv(L, fd, t[0], err);
    if (rc == 0)
        rc = load_norms(L, fd, t[1], t[2], err);
    /* The weights were read once; leave no copy of them in the page cache. */
    for (int k = 0; k < 3; k++)
        posix_fadvise(fd, (off_t)t[k]->offset, (off_t)t[k]->bytes, POSIX_FADV_DONTNEED);
    if (own >= 0)
        close(own);
    if (rc < 0) {
        engram_layer_close(L);
        return rc;
    }
    L->bytes = sizeof *L + weight_bytes(L) + (uint64_t)L->S * L->W * sizeof(float);
    *out = L;
    return 0;
}

void engram_layer_export(const engram_layer *L, uint16_t *w, float *wq)
{
    if (!L || L->ple)
        return;
    if (w)
        for (uint32_t o = 0; o < L->N; o++) {
            const uint16_t *src = L->w + (size_t)(o / PANEL) * ENGRAM_K * PANEL + o % PANEL;
            for (uint32_t i = 0; i < ENGRAM_K; i++)
                w[(size_t)o * ENGRAM_K + i] = src[(size_t)i * PANEL];
        }
    if (wq)
        memcpy(wq, L->wq, (size_t)L->S * L->W * sizeof *wq);
}
