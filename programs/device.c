/*
 * device.c - where `engram apply` and `engram run` apply a layer: the CPU
 * (engram_applier) or a GPU through the CUDA plugin (engram-cuda.so, built
 * when nvcc is present: rows and the residual are copied to the device,
 * applied there and the residual copied back, per call).  The plugin is
 * loaded with dlopen only for --device cuda|cuda-fma, so the command links
 * no CUDA library: it starts on machines without one, and its memory is its
 * own otherwise.  Looked for next to the executable, then in ../lib/engram
 * (an installed PREFIX/bin/engram), or at $ENGRAM_CUDA_PLUGIN.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "device_plugin.h"
#include "engram_cuda.h" /* the flags only: no CUDA header, nothing linked */

struct dev {
    engram_applier *a;               /* CPU */
    size_t resid_bytes;              /* CPU: one token's residual, S x W F32 */
    const struct dev_plugin *plugin; /* CUDA */
    void *h;
};

int dev_name_ok(const char *name)
{
    return !strcmp(name, "cpu") || !strcmp(name, "cuda") || !strcmp(name, "cuda-fma");
}

engram_applier *dev_cpu_applier(struct dev *d)
{
    return d ? d->a : NULL;
}

int dev_rows_dtype(const struct dev *d)
{
    return d->plugin ? ENGRAM_RAW : ENGRAM_BF16;
}

void dev_close(struct dev *d)
{
    if (!d)
        return;
    engram_applier_free(d->a);
    if (d->plugin && d->h)
        d->plugin->close(d->h);
    free(d);
}

/* The plugin, loaded once per process (never unloaded: CUDA's runtime does
 * not like it).  NULL with the reason in err. */
static const struct dev_plugin *load_plugin(engram_error *err)
{
    static const struct dev_plugin *loaded;
    if (loaded)
        return loaded;
    char dir[PATH_MAX], cand[3][PATH_MAX + 64], why[600] = "";
    int nc = 0;
    const char *env = getenv("ENGRAM_CUDA_PLUGIN");
    if (env)
        snprintf(cand[nc++], sizeof cand[0], "%s", env);
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash = n > 0 ? (dir[n] = '\0', strrchr(dir, '/')) : NULL;
    if (slash) {
        *slash = '\0';
        snprintf(cand[nc++], sizeof cand[0], "%s/engram-cuda.so", dir);
        snprintf(cand[nc++], sizeof cand[0], "%s/../lib/engram/engram-cuda.so", dir);
    }
    for (int i = 0; i < nc && !loaded; i++) {
        if (access(cand[i], F_OK) != 0)
            continue;
        void *so = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (!so) {
            if (!why[0])
                snprintf(why, sizeof why, "%.500s", dlerror());
            continue;
        }
        dev_plugin_fn fn = (dev_plugin_fn)(uintptr_t)dlsym(so, DEV_PLUGIN_SYMBOL);
        const struct dev_plugin *pl = fn ? fn() : NULL;
        if (pl && pl->version == DEV_PLUGIN_VERSION)
            loaded = pl;
        else if (!why[0])
            snprintf(why, sizeof why, "%.400s is not an engram CUDA plugin of this version", cand[i]);
    }
    if (!loaded) {
        if (!why[0])
            snprintf(why, sizeof why, "no engram-cuda.so next to the engram executable (it is "
                                      "built when nvcc is present)");
        snprintf(err->msg, sizeof err->msg, "the CUDA path is not available: %.200s", why);
        err->code = -ENODEV;
    }
    return loaded;
}

int dev_open(const char *name, const engram_layer *L, unsigned threads, size_t max_tokens,
             struct dev **out, engram_error *err)
{
    struct dev *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        err->code = -ENOMEM;
        return -ENOMEM;
    }
    int rc = 0;
    if (!name || !strcmp(name, "cpu")) {
        engram_apply_opts o = {.threads = threads};
        engram_layer_info li;
        engram_layer_get_info(L, &li);
        d->resid_bytes = (size_t)li.streams * li.width * sizeof(float);
        rc = engram_applier_new(L, &o, &d->a, err);
    } else if (!strcmp(name, "cuda") || !strcmp(name, "cuda-fma")) {
        d->plugin = load_plugin(err);
        rc = !d->plugin ? -ENODEV
                        : d->plugin->open(L, max_tokens, !strcmp(name, "cuda-fma") ? ENGRAM_CUDA_FMA_ONLY : 0,
                                          &d->h, err);
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

int dev_pin(struct dev *d, void *p, size_t len)
{
    return d && d->plugin ? d->plugin->pin(d->h, p, len) : 0;
}

void dev_unpin(struct dev *d, void *p)
{
    if (d && d->plugin)
        d->plugin->unpin(d->h, p);
}

static int hook_reg(void *ctx, void *p, size_t len)
{
    return dev_pin(ctx, p, len) ? 0 : -1;
}

static void hook_unreg(void *ctx, void *p, size_t len)
{
    (void)len;
    dev_unpin(ctx, p);
}

void dev_host_hooks(struct dev *d, engram_host_hooks *h)
{
    memset(h, 0, sizeof *h);
    if (d && d->plugin) {
        h->reg = hook_reg;
        h->unreg = hook_unreg;
        h->ctx = d;
    }
}

/* rows: n tokens' 24 rows of the layer's table, `stride` bytes apart (raw
 * rows for CUDA, BF16 for the CPU: any stride through
 * engram_apply_strided); x: the host residual [n][S][W] F32; kv_out (the
 * projection, [n][(S+1)W] F32) wants dense rows on the CPU. */
int dev_apply(struct dev *d, const void *rows, size_t stride, float *x, const uint8_t *mask,
              size_t n, float *kv_out, engram_error *err)
{
    if (d->plugin)
        return d->plugin->apply(d->h, rows, stride, x, mask, n, kv_out, err);
    /* the CPU applier reads the rows where they are (a step's [n][48][256]
     * included); the projection alone wants them dense */
    size_t dense = (size_t)ENGRAM_COLUMNS * ENGRAM_ROW_VALUES * 2;
    if (kv_out && stride != dense) {
        snprintf(err->msg, sizeof err->msg, "the projection output needs dense rows (stride %zu, not %zu)",
                 dense, stride);
        return err->code = -EINVAL;
    }
    int rc = engram_apply_strided(d->a, rows, ENGRAM_BF16, stride, x, ENGRAM_F32, d->resid_bytes, mask,
                                  n, err);
    if (rc == 0 && kv_out)
        rc = engram_project(d->a, rows, ENGRAM_BF16, n, kv_out, err);
    return rc;
}
