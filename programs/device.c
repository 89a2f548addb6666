/*
 * device.c - where `engram apply` and `engram run` apply a layer: the CPU
 * (engram_applier) or, in builds with the CUDA path, a GPU
 * (engram_cuda_layer): rows and the residual are copied to the device,
 * applied there and the residual copied back, per call.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifdef ENGRAM_HAVE_CUDA
#include <cuda_runtime.h>

#include "engram_cuda.h"
#endif

struct dev {
    int cuda;
    unsigned flags;        /* engram_cuda_args.flags                     */
    engram_applier *a;
#ifdef ENGRAM_HAVE_CUDA
    engram_cuda_layer *c;
    cudaStream_t st;
    void *pinned[DEV_PIN_MAX];
    int n_pinned;
    uint8_t *d_raw, *d_mask;
    float *d_x, *d_kv;
    size_t max_tokens, per, nkv;
#endif
};

int dev_rows_dtype(const struct dev *d)
{
    return d->cuda ? ENGRAM_RAW : ENGRAM_BF16;
}

void dev_close(struct dev *d)
{
    if (!d)
        return;
    engram_applier_free(d->a);
#ifdef ENGRAM_HAVE_CUDA
    engram_cuda_layer_close(d->c);
    for (int i = 0; i < d->n_pinned; i++)
        cudaHostUnregister(d->pinned[i]);
    if (d->st)
        cudaStreamDestroy(d->st);
    cudaFree(d->d_raw);
    cudaFree(d->d_mask);
    cudaFree(d->d_x);
    cudaFree(d->d_kv);
#endif
    free(d);
}

int dev_name_ok(const char *name)
{
    return !strcmp(name, "cpu") || !strcmp(name, "cuda") || !strcmp(name, "cuda-fma");
}

int dev_open(const char *name, const engram_layer *L, unsigned threads, size_t max_tokens,
             struct dev **out, engram_error *err)
{
    struct dev *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    int rc = 0;
    if (!name || !strcmp(name, "cpu")) {
        engram_apply_opts o = {.threads = threads};
        rc = engram_applier_new(L, &o, &d->a, err);
    } else if (!strcmp(name, "cuda") || !strcmp(name, "cuda-fma")) {
#ifdef ENGRAM_HAVE_CUDA
        d->cuda = 1;
        d->flags = strcmp(name, "cuda") ? ENGRAM_CUDA_FMA_ONLY : 0;
        engram_layer_info li;
        engram_layer_get_info(L, &li);
        d->per = (size_t)li.streams * li.width;
        d->nkv = (size_t)(li.streams + 1) * li.width;
        d->max_tokens = max_tokens;
        rc = engram_cuda_layer_open(L, 0, &d->c, err);
        if (rc == 0 && (cudaMalloc((void **)&d->d_raw, max_tokens * ENGRAM_COLUMNS * ENGRAM_ROW_BYTES) ||
                        cudaMalloc((void **)&d->d_mask, max_tokens) ||
                        cudaMalloc((void **)&d->d_x, max_tokens * d->per * 4) ||
                        cudaMalloc((void **)&d->d_kv, max_tokens * d->nkv * 4) ||
                        cudaStreamCreateWithFlags(&d->st, cudaStreamNonBlocking))) {
            snprintf(err->msg, sizeof err->msg, "cudaMalloc failed for %zu tokens", max_tokens);
            rc = err->code = -ENOMEM;
        }
#else
        (void)max_tokens;
        snprintf(err->msg, sizeof err->msg,
                 "this engram was built without the CUDA path (no nvcc at build time)");
        rc = err->code = -ENODEV;
#endif
    } else {
        snprintf(err->msg, sizeof err->msg, "unknown device '%s' (cpu, cuda or cuda-fma)", name);
        rc = err->code = -EINVAL;
    }
    if (rc < 0) {
        dev_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

#ifdef ENGRAM_HAVE_CUDA
static int cu(cudaError_t e, engram_error *err, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(err->msg, sizeof err->msg, "%s: %s", what, cudaGetErrorString(e));
    return err->code = -EIO;
}
#endif

int dev_pin(struct dev *d, void *p, size_t len)
{
#ifdef ENGRAM_HAVE_CUDA
    if (!d->cuda || !p || !len || d->n_pinned == DEV_PIN_MAX)
        return 0;
    if (cudaHostRegister(p, len, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not fatal: copies from pageable memory still work */
        return 0;
    }
    d->pinned[d->n_pinned++] = p;
    return 1;
#else
    (void)d; (void)p; (void)len;
    return 0;
#endif
}

/* rows: n tokens' 24 rows of the layer's table, `stride` bytes apart (raw
 * rows for CUDA, BF16 for the CPU); x: the host residual [n][S][W] F32. */
int dev_apply(struct dev *d, const void *rows, size_t stride, float *x, const uint8_t *mask,
              size_t n, float *kv_out, engram_error *err)
{
    if (!d->cuda) {
        /* the CPU applier takes [n][24][256] contiguous rows */
        if (stride != (size_t)ENGRAM_COLUMNS * ENGRAM_ROW_VALUES * 2)
            return err->code = -EINVAL;
        int rc = engram_apply(d->a, rows, ENGRAM_BF16, x, ENGRAM_F32, mask, n, err);
        if (rc == 0 && kv_out)
            rc = engram_project(d->a, rows, ENGRAM_BF16, n, kv_out, err);
        return rc;
    }
#ifdef ENGRAM_HAVE_CUDA
    const size_t rb = (size_t)ENGRAM_COLUMNS * ENGRAM_ROW_BYTES;
    for (size_t at = 0; at < n; at += d->max_tokens) {
        size_t k = n - at < d->max_tokens ? n - at : d->max_tokens;
        int rc = cu(cudaMemcpy2DAsync(d->d_raw, rb, (const uint8_t *)rows + at * stride, stride, rb,
                                      k, cudaMemcpyHostToDevice, d->st), err, "copying rows to the GPU");
        if (rc == 0 && mask)
            rc = cu(cudaMemcpyAsync(d->d_mask, mask + at, k, cudaMemcpyHostToDevice, d->st), err,
                    "copying the mask");
        if (rc == 0)
            rc = cu(cudaMemcpyAsync(d->d_x, x + at * d->per, k * d->per * 4, cudaMemcpyHostToDevice,
                                    d->st), err, "copying the residual to the GPU");
        engram_cuda_args a;
        memset(&a, 0, sizeof a);
        a.raw = d->d_raw;
        a.resid = d->d_x;
        a.resid_dtype = ENGRAM_F32;
        a.mask = mask ? d->d_mask : NULL;
        a.n = (unsigned)k;
        a.stream = d->st;
        a.flags = d->flags;
        if (rc == 0)
            rc = engram_cuda_apply(d->c, &a, err);
        if (rc == 0 && kv_out)
            rc = engram_cuda_project(d->c, &a, d->d_kv, err);
        if (rc == 0)
            rc = cu(cudaMemcpyAsync(x + at * d->per, d->d_x, k * d->per * 4, cudaMemcpyDeviceToHost,
                                    d->st), err, "copying the residual back");
        if (rc == 0 && kv_out)
            rc = cu(cudaMemcpyAsync(kv_out + at * d->nkv, d->d_kv, k * d->nkv * 4,
                                    cudaMemcpyDeviceToHost, d->st), err, "copying kv back");
        /* waits for the stream (also after an error above: nothing of this
         * call is left in flight on its buffers) */
        engram_error e2;
        int rs = engram_cuda_sync(d->c, d->st, rc == 0 ? err : &e2);
        if (rc == 0)
            rc = rs;
        if (rc < 0)
            return rc;
    }
    return 0;
#else
    (void)rows; (void)x; (void)mask; (void)n; (void)kv_out;
    return err->code = -ENODEV;
#endif
}
