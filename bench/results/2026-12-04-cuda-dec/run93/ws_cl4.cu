/*
 * ws_cl4.cu - run 93's experiment (not built by make): ws_gemm_kernel in
 * clusters of four CTAs, 2 token tiles x 2 weights tiles, against the
 * kernel as it is (clusters of two sharing the weights) and cuBLAS.
 *
 * Why: run 92's ncu (H100, n = 2048, N = 25600) showed the consumers of
 * ws_gemm_kernel waiting most at the stages' "full" barriers (the k-tiles'
 * data not yet there: 21.6% of all stall samples, against 15.4% at the
 * wgmma waits and 5.6% at HGMMA, where cuBLAS's warps wait 53.6%), 1.56x
 * cuBLAS's L2 sectors and 1.24x its bytes from L2 into the SMs.  Per
 * k-tile a cluster of two reads 2 x 16 KiB of tokens and 22 KiB of weights
 * for 2 x 128 x 176 outputs (1.23 bytes an output); cuBLAS's 320 x 128
 * tiles in pairs ~0.90.
 * In a cluster of four the tokens' tile is shared by the two CTAs of the
 * same token tile and the weights' by the two of the same weights tile: each
 * CTA loads half of each and multicasts it, 0.86 bytes an output.
 * The sums, their order and the promotion are the kernel's own: the bits
 * must equal ws_gemm_kernel's on every output.
 *   nvcc -std=c++17 -O2 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Icuda \
 *        -o ws_cl4 bench/results/2026-12-04-cuda-dec/run93/ws_cl4.cu -lcublas
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ws_gemm.cuh"
#include "cuda_check.h"

/* one arrival on barrier b of this CTA and of the CTAs whose producers
 * write into this CTA's stages: rank ^ 1 (the same weights tile) and
 * rank ^ 2 (the same token tile) */
__device__ __forceinline__ void ws4_arrive(uint32_t b, uint32_t rank)
{
    uint32_t to[3] = {rank, rank ^ 1u, rank ^ 2u};
#pragma unroll
    for (int i = 0; i < 3; i++)
        asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                     "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(b),
                     "r"(to[i])
                     : "memory");
}

__host__ __device__ __forceinline__ int ws4_units(int n, int N)
{
    return (n + WS_BM - 1) / WS_BM / 2 * (((N + WS_BN - 1) / WS_BN + 1) / 2);
}

/* ta: the tokens in boxes of 64 rows (half a token tile); tb: the weights
 * in boxes of WS_BN / 2 rows.  Rank r of a cluster: token tile r & 1,
 * weights tile r >> 1 of its unit; it loads the half r >> 1 of its token
 * tile (multicast to ranks r & 1 and (r & 1) + 2) and the half r & 1 of its
 * weights tile (multicast to ranks 2 (r >> 1) and 2 (r >> 1) + 1). */
__global__ void __launch_bounds__(WS_THREADS, 1)
ws4_gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb, int n, int N,
                float *__restrict__ out, int *__restrict__ next)
{
#ifdef WS_SM90A
    extern __shared__ uint8_t ws_smem_raw[];
    __shared__ __align__(8) uint64_t full[WS_STAGES], empty[WS_STAGES], ufull[2];
    __shared__ int uslot[2];
    uint32_t sbase = (uint32_t)__cvta_generic_to_shared(ws_smem_raw);
    sbase = (sbase + 1023) & ~1023u;
    uint32_t bfull = (uint32_t)__cvta_generic_to_shared(full),
             bempty = (uint32_t)__cvta_generic_to_shared(empty),
             bunit = (uint32_t)__cvta_generic_to_shared(ufull), sslot = (uint32_t)__cvta_generic_to_shared(uslot);
    const int KT = K / WS_BK, rank = blockIdx.x % 4, ti = rank & 1, tj = rank >> 1;
    const int mu = (n + WS_BM - 1) / WS_BM / 2, units = ws4_units(n, N);
    int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WS_STAGES; s++) {
            ws_bar_init(bfull + 8 * s, 1);
            ws_bar_init(bempty + 8 * s, 3 * 8); /* the consumer warps of this CTA, rank ^ 1 and rank ^ 2 */
        }
        ws_bar_init(bunit, 1);
        ws_bar_init(bunit + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    ws_cluster_sync();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int q = 0;
            for (int ui = 0;; ui++) {
                int u;
                if (rank == 0) {
                    u = atomicAdd(next, 1);
                    ws_unit_post(sslot + 4 * (ui & 1), bunit + 8 * (ui & 1), u, 4);
                } else {
                    u = ws_unit_get(sslot, bunit, ui);
                }
                if (u >= units)
                    break;
                int m0 = (2 * (u % mu) + ti) * WS_BM, n0 = (2 * (u / mu) + tj) * WS_BN;
                for (int kt = 0; kt < KT; kt++, q++) {
                    int s = q % WS_STAGES;
                    uint32_t sa = sbase + s * WS_STAGE_BYTES, sb = sa + WS_A_BYTES;
                    ws_bar_wait(bempty + 8 * s, ((q / WS_STAGES) & 1) ^ 1);
                    ws_bar_expect(bfull + 8 * s, WS_STAGE_BYTES);
                    ws_tma_mc(sa + tj * 64 * 128, &ta, bfull + 8 * s, kt * WS_BK, m0 + tj * 64,
                              (uint16_t)((1u << ti) | (1u << (ti + 2))));
                    ws_tma_mc(sb + ti * (WS_BN / 2) * 128, &tb, bfull + 8 * s, 0, kt * N + n0 + ti * (WS_BN / 2),
                              (uint16_t)(3u << (2 * tj)));
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, lane = threadIdx.x & 31;
        int q0 = 0;
        for (int ui = 0;; ui++, q0 += KT) {
            int u = ws_unit_get(sslot, bunit, ui);
            if (u >= units)
                break;
            int m0 = (2 * (u % mu) + ti) * WS_BM, n0 = (2 * (u / mu) + tj) * WS_BN;
            float acc[WS_ACC], p[WS_ACC];
#pragma unroll
            for (int i = 0; i < WS_ACC; i++)
                acc[i] = p[i] = 0.0f;
            for (int g = 0; g < KT / WS_PROM; g++) {
#pragma unroll
                for (int j = 0; j < WS_PROM; j++) {
                    int q = q0 + g * WS_PROM + j, s = q % WS_STAGES;
                    ws_bar_wait(bfull + 8 * s, (q / WS_STAGES) & 1);
                    uint32_t sa = sbase + s * WS_STAGE_BYTES + cw * 64 * 128,
                             sb = sbase + s * WS_STAGE_BYTES + WS_A_BYTES;
                    if (j == 0)
                        ws_fence(p);
                    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                    for (int kk = 0; kk < WS_BK / 16; kk++)
                        ws_wgmma(p, ws_desc(sa + kk * 32), ws_desc(sb + kk * 32), j > 0 || kk > 0);
                    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                    if (j > 0) {
                        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                        __syncwarp();
                        if (lane == 0)
                            ws4_arrive(bempty + 8 * ((q - 1) % WS_STAGES), rank);
                    }
                }
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                __syncwarp();
                if (lane == 0)
                    ws4_arrive(bempty + 8 * ((q0 + g * WS_PROM + WS_PROM - 1) % WS_STAGES), rank);
                ws_fence(p);
#pragma unroll
                for (int i = 0; i < WS_ACC; i++)
                    acc[i] += p[i];
            }
            int warp = (threadIdx.x >> 5) & 3;
            int r0 = m0 + cw * 64 + warp * 16 + (lane >> 2);
            int pairs = !(N & 1) && !((uintptr_t)out & 7);
#pragma unroll
            for (int i = 0; i < WS_ACC; i += 2) {
                int t = r0 + 8 * ((i >> 1) & 1), o = n0 + 8 * (i >> 2) + 2 * (lane & 3);
                if (t >= n || o >= N)
                    continue;
                float *kv = out + (size_t)t * N + o;
                if (pairs) {
                    *(float2 *)kv = make_float2(acc[i], acc[i + 1]);
                } else {
                    kv[0] = acc[i];
                    if (o + 1 < N)
                        kv[1] = acc[i + 1];
                }
            }
        }
    }
    ws_cluster_sync();
#endif
}

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static uint16_t f2h(float f) { return __half_raw(__float2half_rn(f)).x; }
static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }
template <typename F> static float timed(cudaStream_t st, F fn)
{
    for (int i = 0; i < 3; i++)
        fn();
    CU(cudaStreamSynchronize(st));
    float ms[15];
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < 15; i++) {
        CU(cudaEventRecord(a, st));
        fn();
        CU(cudaEventRecord(b, st));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&ms[i], a, b));
    }
    qsort(ms, 15, 4, cmpf);
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return ms[7];
}

int main(void)
{
    int ns[8] = {2048, 1024, 512, 4096}, nn = 4;
    if (getenv("GV_NS")) {
        const char *s = getenv("GV_NS");
        for (nn = 0; s && *s && nn < 8; nn++) {
            ns[nn] = atoi(s);
            s = strchr(s, ',');
            s = s ? s + 1 : NULL;
        }
    }
    int rounds = getenv("GV_ROUNDS") ? atoi(getenv("GV_ROUNDS")) : 3;
    cudaStream_t st;
    CU(cudaStreamCreate(&st));
    int *d_probe;
    CU(cudaMalloc(&d_probe, sizeof(int)));
    int fit[2], ready = ws_probe(d_probe, fit);
    CU(cudaFuncSetAttribute(ws4_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_SMEM));
    int fit4 = 0;
    {
        cudaLaunchAttribute at[1];
        cudaLaunchConfig_t cfg = ws_cfg(4, 4, 0, at);
        CU(cudaOccupancyMaxActiveClusters(&fit4, (void *)ws4_gemm_kernel, &cfg));
    }
    printf("ws ready: %d (BN %d, stages %d, smem %d); clusters at once: %d of 1 CTA, %d of 2, %d of 4\n", ready,
           WS_BN, WS_STAGES, WS_SMEM, fit[0], fit[1], fit4);
    if (!ready || fit4 <= 0)
        return 1;
    int *dnext;
    CU(cudaMalloc(&dnext, sizeof(int)));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return 1;
    cublasSetStream(h, st);
    /* the model's N; then (bits only, one round) an N whose weights tiles
     * are odd in number (the last unit's second weights tile wholly past
     * N) with a partial token tile */
    int bad = 0;
    for (int ni = 0; ni <= nn; ni++) {
        int n = ni < nn ? ns[ni] : 2000, N = ni < nn ? 25600 : 25424;
        if ((n + WS_BM - 1) / WS_BM % 2) {
            printf("n=%d: token tiles odd, no clusters of 4\n", n);
            continue;
        }
        size_t ne = (size_t)n * K, nw = (size_t)N * K, no = (size_t)n * N;
        uint16_t *he = (uint16_t *)malloc(ne * 2), *hw = (uint16_t *)malloc(nw * 2);
        for (size_t i = 0; i < ne; i++) {
            int blk = (int)((i / 32) % 7);
            int mm = 8 + (int)(rnd() % 8), ex = (int)(rnd() % 12) - 9 - blk;
            float v = ldexpf((float)mm / 8.0f, ex) * ((rnd() & 1) ? -1.f : 1.f);
            if (rnd() % 10 == 0)
                v = 0;
            he[i] = f2h(v);
        }
        for (size_t i = 0; i < nw; i++)
            hw[i] = f2h((float)(((double)(rnd() % 2000001) / 1e6 - 1.0) * 0.05));
        __half *de;
        uint16_t *dw, *dwt;
        float *k1, *k2, *k4;
        CU(cudaMalloc(&de, ne * 2));
        CU(cudaMalloc(&dw, nw * 2));
        CU(cudaMalloc(&dwt, nw * 2));
        CU(cudaMalloc(&k1, no * 4));
        CU(cudaMalloc(&k2, no * 4));
        CU(cudaMalloc(&k4, no * 4));
        CU(cudaMemcpy(de, he, ne * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dw, hw, nw * 2, cudaMemcpyHostToDevice));
        CU(cudaMemset(k2, 0xff, no * 4));
        CU(cudaMemset(k4, 0xff, no * 4));
        uint16_t *ht = (uint16_t *)malloc((size_t)N * 128);
        CU(ws_tile_weights(dwt, hw, N, ht));
        free(ht);
        CUtensorMap maps[3], a64;
        if (ws_maps(maps, de, n, dwt, N) < 0 || ws_map(&a64, de, n, 64) < 0) {
            printf("maps failed\n");
            return 1;
        }
        const float one = 1, zero = 0;
        int units4 = ws4_units(n, N);
        auto blas = [&] {
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, dw, CUDA_R_16F, K, de, CUDA_R_16F, K, &zero, k1,
                         CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        auto ws2 = [&] {
            CU(cudaMemsetAsync(dnext, 0, 4, st));
            CU(ws_gemm(maps, fit, n, N, 0, k2, NULL, dnext, st));
        };
        auto ws4 = [&] {
            CU(cudaMemsetAsync(dnext, 0, 4, st));
            cudaLaunchAttribute at[1];
            cudaLaunchConfig_t cfg = ws_cfg(4, 4 * (fit4 < units4 ? fit4 : units4), st, at);
            CU(cudaLaunchKernelEx(&cfg, ws4_gemm_kernel, a64, maps[2], n, N, k4, dnext));
        };
        blas();
        ws2();
        ws4();
        CU(cudaStreamSynchronize(st));
        CU(cudaGetLastError());
        float *r2 = (float *)malloc(no * 4), *r4 = (float *)malloc(no * 4);
        CU(cudaMemcpy(r2, k2, no * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(r4, k4, no * 4, cudaMemcpyDeviceToHost));
        long differ = 0, unwritten = 0;
        for (size_t i = 0; i < no; i++) {
            differ += memcmp(&r2[i], &r4[i], 4) != 0;
            unwritten += isnan(r4[i]);
        }
        printf("n=%5d N=%d: clusters of 4 against the kernel: %ld of %zu outputs differ in bits, %ld unwritten\n", n,
               N, differ, no, unwritten);
        bad |= differ || unwritten;
        double fl = 2.0 * n * N * K;
        for (int r = 0; r < (ni < nn ? rounds : 0); r++) {
            float tb = timed(st, blas), t2 = timed(st, ws2), t4 = timed(st, ws4);
            printf("n=%5d round %d: cuBLAS %.3f ms (%.0f TF/s)  ws (pairs) %.3f ms = %.3fx  ws4 (2x2) %.3f ms = "
                   "%.3fx  (ws4 / ws %.3f)\n",
                   n, r, tb, fl / tb / 1e9, t2, t2 / tb, t4, t4 / tb, t4 / t2);
            fflush(stdout);
        }
        cudaFree(de); cudaFree(dw); cudaFree(dwt); cudaFree(k1); cudaFree(k2); cudaFree(k4);
        free(he); free(hw); free(r2); free(r4);
    }
    return bad;
}
