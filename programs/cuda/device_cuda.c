/*
 * device_cuda.c - the CUDA half of the CLI's devices (programs/device.c),
 * built as a plugin (engram-cuda.so, with libengram-cuda, cuBLAS and the
 * CUDA runtime) that the engram command loads only for --device cuda: the
 * command itself links no CUDA library, starts without one, and keeps its
 * memory small for everything else.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../device_plugin.h"
#include "engram_cuda.h"

struct cdev {
    unsigned flags;
    engram_cuda_layer *c;
    cudaStream_t st;
    uint8_t *d_raw, *d_mask;
    float *d_x, *d_kv;
    size_t max_tokens, per, nkv;
    void *pinned[DEV_PIN_MAX];
    int n_pinned;
};

static int cu(cudaError_t e, engram_error *err, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(err->msg, sizeof err->msg, "%s: %s", what, cudaGetErrorString(e));
    return err->code = -EIO;
}

static void c_close(void *h)
{
    struct cdev *d = h;
    if (!d)
        return;
    engram_cuda_layer_close(d->c);
    for (int i = 0; i < d->n_pinned; i++)
        cudaHostUnregister(d->pinned[i]);
    if (d->st)
        cudaStreamDestroy(d->st);
    cudaFree(d->d_raw);
    cudaFree(d->d_mask);
    cudaFree(d->d_x);
    cudaFree(d->d_kv);
    free(d);
}

static int c_open(const engram_layer *L, size_t max_tokens, unsigned flags, void **out,
                  engram_error *err)
{
    struct cdev *d = calloc(1, sizeof *d);
    if (!d)
        return err->code = -ENOMEM;
    d->flags = flags;
    engram_layer_info li;
    engram_layer_get_info(L, &li);
    d->per = (size_t)li.streams * li.width;
    d->nkv = (size_t)(li.streams + 1) * li.width;
    d->max_tokens = max_tokens;
    int rc = engram_cuda_layer_open(L, 0, &d->c, err);
    if (rc == 0 && (cudaMalloc((void **)&d->d_raw, max_tokens * ENGRAM_COLUMNS * ENGRAM_ROW_BYTES) ||
                    cudaMalloc((void **)&d->d_mask, max_tokens) ||
                    cudaMalloc((void **)&d->d_x, max_tokens * d->per * 4) ||
                    cudaMalloc((void **)&d->d_kv, max_tokens * d->nkv * 4) ||
                    cudaStreamCreateWithFlags(&d->st, cudaStreamNonBlocking))) {
        snprintf(err->msg, sizeof err->msg, "cudaMalloc failed for %zu tokens", max_tokens);
        rc = err->code = -ENOMEM;
    }
    if (rc < 0) {
        c_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

static int c_pin(void *h, void *p, size_t len)
{
    struct cdev *d = h;
    if (!p || !len || d->n_pinned == DEV_PIN_MAX)
        return 0;
    if (cudaHostRegister(p, len, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not fatal: copies from pageable memory still work */
        return 0;
    }
    d->pinned[d->n_pinned++] = p;
    return 1;
}

/* rows: n tokens' 24 raw rows, stride bytes apart; x: the host residual
 * [n][S][W] F32, updated. */
static int c_apply(void *h, const void *rows, size_t stride, float *x, const uint8_t *mask,
                   size_t n, float *kv_out, engram_error *err)
{
    struct cdev *d = h;
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
}

static void c_unpin(void *h, void *p)
{
    struct cdev *d = h;
    for (int i = 0; i < d->n_pinned; i++)
        if (d->pinned[i] == p) {
            cudaHostUnregister(p);
            d->pinned[i] = d->pinned[--d->n_pinned];
            return;
        }
}

static const struct dev_plugin ops = {DEV_PLUGIN_VERSION, c_open, c_apply, c_pin, c_unpin, c_close};

__attribute__((visibility("default"))) const struct dev_plugin *engram_cli_cuda_plugin(void)
{
    return &ops;
}
