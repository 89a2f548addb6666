// box_bw.cu - does the weights' layout limit the decode kernel's stream?  wsd_kernel's producer reads
// boxes of R weight rows x 64 inputs (R x 128 bytes, 128-byte swizzle) through a 2D tensor map of the
// row-major [N = 25600][K = 6144] F16 weights: every box is R pieces of 128 bytes, 12 KB apart.  Here
// the same ring (S stages, one thread issuing, one thread waiting and giving the stage back, no
// arithmetic) reads, per CTA of R rows, its 96 k-tiles:
//   rowmajor: 2D map over [N][K], box (64, R) (wsd_kernel's pattern);
//   ktmajor:  3D map over the same bytes laid out [K/64][N][64], box (64, R, 1): each box 16 or 32 KB
//             contiguous;
//   bulk:     cp.async.bulk of R x 128 contiguous bytes (the CTA's 1.5 or 3 MB in order).
// R = 128 (200 CTAs, two an SM) and R = 256 (100 CTAs); times against half a device copy of the same
// 314.6 MB (the floor bench_cuda uses), kernel launches timed alone, medians of 11.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define NN 25600
#define KK 6144
#define KT (KK / 64)
enum { ROWMAJOR, KTMAJOR, BULK };
__global__ void ring_kernel(const __grid_constant__ CUtensorMap m, const uint8_t *w, int mode, int R, int S, unsigned *sink)
{
    extern __shared__ uint8_t smraw[];
    __shared__ __align__(8) uint64_t bar[8];
    uint32_t sbase = ((uint32_t)__cvta_generic_to_shared(smraw) + 1023) & ~1023u, b0 = (uint32_t)__cvta_generic_to_shared(bar);
    if (threadIdx.x != 0) return;
    const int B = R * 128, n0 = blockIdx.x * R;
    for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b0 + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    unsigned acc = 0;
    for (int q = 0; q < KT + S; q++) {
        if (q >= S) {
            int r = q - S, s = r % S;
            asm volatile("{\n.reg .pred p;\nW1:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W1;\n}\n" ::"r"(b0 + 8 * s), "r"((unsigned)((r / S) & 1)) : "memory");
            acc += *(volatile unsigned *)(smraw + (sbase - (uint32_t)__cvta_generic_to_shared(smraw)) + s * B);
        }
        if (q < KT) {
            int s = q % S;
            uint32_t dst = sbase + s * B, bb = b0 + 8 * s;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bb), "r"(B) : "memory");
            if (mode == ROWMAJOR)
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                             ::"r"(dst), "l"((uint64_t)&m), "r"(bb), "r"(q * 64), "r"(n0) : "memory");
            else if (mode == KTMAJOR)
                asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                             ::"r"(dst), "l"((uint64_t)&m), "r"(bb), "r"(0), "r"(n0), "r"(q) : "memory");
            else
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                             ::"r"(dst), "l"(w + (size_t)n0 * KK * 2 + (size_t)q * B), "r"(B), "r"(bb) : "memory");
        }
    }
    if (acc == 0x12345678u) *sink = acc;
}
static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }
static PFN_cuTensorMapEncodeTiled_v12000 enc;
static void map2(CUtensorMap *m, void *p, int R)
{
    cuuint64_t dims[2] = {KK, NN}, str[1] = {KK * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)R}, es[2] = {1, 1};
    if (enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, p, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) { printf("map2\n"); exit(1); }
}
static void map3(CUtensorMap *m, void *p, int R)
{
    cuuint64_t dims[3] = {64, NN, KT}, str[2] = {128, (cuuint64_t)NN * 128};
    cuuint32_t box[3] = {64, (cuuint32_t)R, 1}, es[3] = {1, 1, 1};
    if (enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, p, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) { printf("map3\n"); exit(1); }
}
int main(void)
{
    const size_t total = (size_t)NN * KK * 2;
    uint8_t *w, *cp; unsigned *sink;
    CU(cudaMalloc(&w, total)); CU(cudaMalloc(&cp, total)); CU(cudaMalloc(&sink, 4));
    CU(cudaMemset(w, 1, total));
    cudaDriverEntryPointQueryResult qr;
    CU(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000, cudaEnableDefault, &qr));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    float ms[11];
    for (int i = 0; i < 11; i++) { cudaEventRecord(a); cudaMemcpy(cp, w, total, cudaMemcpyDeviceToDevice); cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b); }
    qsort(ms, 11, 4, cmpf);
    double floor_us = 1e3 * ms[5] / 2;
    printf("device copy of 314.6 MB: %.1f us; read floor (half): %.1f us\n", 1e3 * ms[5], floor_us);
    CU(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    CU(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    const char *names[3] = {"rowmajor", "ktmajor ", "bulk    "};
    for (int rep = 0; rep < 3; rep++)
        for (int R = 128; R <= 256; R *= 2) {
            int S = R == 128 ? 6 : 6, C = NN / R;
            size_t smem = (size_t)S * R * 128 + 1024;
            for (int mode = 0; mode < 3; mode++) {
                CUtensorMap m;
                if (mode == KTMAJOR) map3(&m, w, R); else map2(&m, w, R);
                for (int i = 0; i < 11; i++) {
                    cudaEventRecord(a);
                    ring_kernel<<<C, 32, smem>>>(m, w, mode, R, S, sink);
                    cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b);
                }
                CU(cudaGetLastError());
                qsort(ms, 11, 4, cmpf);
                int occ = 0;
                CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ring_kernel, 32, smem));
                printf("rep %d R=%3d C=%3d S=%d (%d an SM) %s: %.1f us = %.3f x read floor\n", rep, R, C, S, occ, names[mode], 1e3 * ms[5], 1e3 * ms[5] / floor_us);
            }
        }
    return 0;
}
