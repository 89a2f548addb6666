// sm_bw.cu - how fast C CTAs (one per SM) stream the layer's 314.6 MB of weights with the copy engine
// (cp.async.bulk into a ring of S stages of B bytes, one thread issuing, as wsd_kernel's producer does)
// or with plain 16-byte loads, for C = 100 (wsd_kernel's grid at W = 5120) and 132 (every SM).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
__global__ void bulk_kernel(const uint8_t *w, size_t per, int S, int B, unsigned *sink)
{
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t bar[8];
    const uint8_t *src = w + (size_t)blockIdx.x * per;
    uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm), b0 = (uint32_t)__cvta_generic_to_shared(bar);
    if (threadIdx.x != 0) return;
    for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b0 + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    size_t nt = per / B;
    unsigned acc = 0;
    for (size_t q = 0; q < nt + S; q++) {
        if (q >= (size_t)S) { /* tile q - S arrived: consume a word, reuse its stage */
            size_t r = q - S; int s = (int)(r % S);
            asm volatile("{\n.reg .pred p;\nW1:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W1;\n}\n" ::"r"(b0 + 8 * s), "r"((unsigned)((r / S) & 1)) : "memory");
            acc += *(volatile unsigned *)(sm + s * B);
        }
        if (q < nt) {
            int s = (int)(q % S);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b0 + 8 * s), "r"(B) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                         ::"r"(sbase + s * B), "l"(src + q * B), "r"(B), "r"(b0 + 8 * s) : "memory");
        }
    }
    if (acc == 0x12345678u) *sink = acc;
}
__global__ void __launch_bounds__(1024, 1) ld_kernel(const uint4 *w, size_t per16, unsigned *sink)
{
    const uint4 *src = w + (size_t)blockIdx.x * per16;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i < per16; i += 4 * blockDim.x) {
        uint4 a = src[i], b = i + blockDim.x < per16 ? src[i + blockDim.x] : make_uint4(0,0,0,0);
        uint4 c = i + 2 * blockDim.x < per16 ? src[i + 2 * blockDim.x] : make_uint4(0,0,0,0);
        uint4 d = i + 3 * blockDim.x < per16 ? src[i + 3 * blockDim.x] : make_uint4(0,0,0,0);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}
static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }
int main(void)
{
    const size_t total = 25600ull * 6144 * 2; /* 314.6 MB */
    uint8_t *w; unsigned *sink; CU(cudaMalloc(&w, total + (1 << 20))); CU(cudaMalloc(&sink, 4));
    CU(cudaMemset(w, 1, total));
    uint8_t *cp; CU(cudaMalloc(&cp, 1ull << 30));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float ms[11];
    for (int i = 0; i < 11; i++) { cudaEventRecord(a); cudaMemcpy(cp, w, total, cudaMemcpyDeviceToDevice); cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b); }
    qsort(ms, 11, 4, cmpf);
    double floor_us = 1e3 * ms[5] / 2; /* a copy reads and writes */
    printf("device copy of 314.6 MB: %.1f us; read floor (half): %.1f us\n", 1e3 * ms[5], floor_us);
    int S[] = {5, 5, 8}, B[] = {32768, 40960, 24576};
    CU(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    for (int rep = 0; rep < 2; rep++)
    for (int ci = 0; ci < 3; ci++) {
        int C = ci == 0 ? 100 : ci == 1 ? 132 : 66;
        for (int v = 0; v < 3; v++) {
            size_t per = total / C / B[v] * B[v];
            for (int i = 0; i < 11; i++) {
                cudaEventRecord(a);
                bulk_kernel<<<C, 32, S[v] * B[v]>>>(w, per, S[v], B[v], sink);
                cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b);
            }
            CU(cudaGetLastError());
            qsort(ms, 11, 4, cmpf);
            double us = 1e3 * ms[5] * ((double)total / (per * C));
            printf("bulk  C=%3d S=%d B=%5d: %.1f us for all 314.6 MB (scaled from %zu B/CTA) = %.3f x read floor, %.1f GB/s per CTA\n",
                   C, S[v], B[v], us, per, us / floor_us, per / (1e3 * ms[5]) / 1e6 * 1e3);
        }
        size_t per16 = total / C / 16;
        for (int i = 0; i < 11; i++) {
            cudaEventRecord(a);
            ld_kernel<<<C, 1024>>>((const uint4 *)w, per16, sink);
            cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b);
        }
        CU(cudaGetLastError());
        qsort(ms, 11, 4, cmpf);
        printf("ld16  C=%3d 1024 thr: %.1f us = %.3f x read floor\n", C, 1e3 * ms[5], 1e3 * ms[5] / floor_us);
    }
    return 0;
}
