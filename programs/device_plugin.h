/* device_plugin.h - the interface between the engram command (device.c)
 * and its CUDA plugin (cuda/device_cuda.c -> engram-cuda.so), loaded with
 * dlopen only for --device cuda|cuda-fma. */
#ifndef ENGRAM_DEVICE_PLUGIN_H
#define ENGRAM_DEVICE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define DEV_PIN_MAX 64
#define DEV_PLUGIN_VERSION 2

struct dev_plugin {
    int version;
    /* flags: engram_cuda_args.flags.  0 or -errno with err filled. */
    int (*open)(const engram_layer *L, size_t max_tokens, unsigned flags, void **h, engram_error *err);
    int (*apply)(void *h, const void *rows, size_t stride, float *x, const uint8_t *mask, size_t n,
                 float *kv_out, engram_error *err);
    int (*pin)(void *h, void *p, size_t len);
    void (*unpin)(void *h, void *p); /* before p is freed; no-op if not pinned */
    void (*close)(void *h);
};

/* The plugin's one exported symbol. */
typedef const struct dev_plugin *(*dev_plugin_fn)(void);
const struct dev_plugin *engram_cli_cuda_plugin(void);
#define DEV_PLUGIN_SYMBOL "engram_cli_cuda_plugin"

#endif
