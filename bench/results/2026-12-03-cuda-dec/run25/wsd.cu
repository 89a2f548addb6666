/*
 * wsd.cu - issue #25, sitting 25 (a probe, not built by make): the decode
 * projection shaped as cuBLAS's nvjet_sm90_hss_256xB_64x5 kernels (run 24):
 * a CTA per 256 outputs over the whole K, the weights as wgmma's A straight
 * from shared memory (TMA boxes of 256 x 64, 128-byte swizzle), the tokens
 * as B (one box of 64 x 64, rows past n zero-filled), WSD_STAGES stages,
 * a producer warpgroup and two consumers of 128 outputs (two m64n64k16 a
 * k16 step), sums promoted to F32 every 4 k-tiles as ws_gemm promotes them.
 * Asks: (1) its time at n = 1..64 against cuBLAS and the weights' floor;
 * (2) whether its bits are ws_gemm's (the prefill kernel, tokens as A) on
 * the same operands: the same products in the same k16 groups with A and B
 * swapped.  Built against cuda/ws_gemm.cuh of f764206 (the library's
 * header now holds wsd_kernel itself, so this file no longer compiles
 * beside it).  Build (from the repository root, at f764206):
 *   nvcc -std=c++17 -O2 -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -Icuda \
 *        -o wsd bench/results/2026-12-03-cuda-dec/run25/wsd.cu -lcublas -lcuda
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static const int K = 6144;
#include "ws_gemm.cuh"
#include "cuda_check.h"

#ifndef WSD_STAGES
#define WSD_STAGES 5
#endif
#define WSD_BM 256 /* outputs a CTA */
#define WSD_BN 64  /* tokens (zero-filled past n) */
#define WSD_A (WSD_BM * 64 * 2)
#define WSD_B (WSD_BN * 64 * 2)
#define WSD_STAGE (WSD_A + WSD_B)
#define WSD_SMEM (WSD_STAGES * WSD_STAGE + 1024)

__device__ __forceinline__ void wsd_wgmma(float *d, uint64_t da, uint64_t db, int scale_d)
{
#ifdef WS_SM90A
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
#endif
}

__device__ __forceinline__ void wsd_fence(float *r)
{
#pragma unroll
    for (int i = 0; i < 64; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}

__global__ void __launch_bounds__(384, 1)
wsd_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap te, int n, int N,
           float *__restrict__ kv)
{
#ifdef WS_SM90A
    extern __shared__ uint8_t smraw[];
    __shared__ __align__(8) uint64_t full[WSD_STAGES], empty[WSD_STAGES];
    uint32_t sbase = ((uint32_t)__cvta_generic_to_shared(smraw) + 1023) & ~1023u;
    uint32_t bfull = (uint32_t)__cvta_generic_to_shared(full), bempty = (uint32_t)__cvta_generic_to_shared(empty);
    const int n0 = blockIdx.x * WSD_BM, KT = K / 64, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WSD_STAGES; s++) {
            ws_bar_init(bfull + 8 * s, 1);
            ws_bar_init(bempty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0)
            for (int kt = 0; kt < KT; kt++) {
                int s = kt % WSD_STAGES;
                uint32_t sa = sbase + s * WSD_STAGE, sb = sa + WSD_A;
                ws_bar_wait(bempty + 8 * s, ((kt / WSD_STAGES) & 1) ^ 1);
                ws_bar_expect(bfull + 8 * s, WSD_STAGE);
                ws_tma(sa, &tw, bfull + 8 * s, kt * 64, n0);
                ws_tma(sb, &te, bfull + 8 * s, kt * 64, 0);
            }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, lane = threadIdx.x & 31;
        float acc[64], p[64];
#pragma unroll
        for (int i = 0; i < 64; i++)
            acc[i] = p[i] = 0.0f;
        for (int g = 0; g < KT / WS_PROM; g++) {
#pragma unroll
            for (int j = 0; j < WS_PROM; j++) {
                int kt = g * WS_PROM + j, s = kt % WSD_STAGES;
                ws_bar_wait(bfull + 8 * s, (kt / WSD_STAGES) & 1);
                uint32_t sa = sbase + s * WSD_STAGE + cw * 128 * 128, sb = sbase + s * WSD_STAGE + WSD_A;
                if (j == 0)
                    wsd_fence(p);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    wsd_wgmma(p, ws_desc(sa + kk * 32), ws_desc(sb + kk * 32), j > 0 || kk > 0);
                    wsd_wgmma(p + 32, ws_desc(sa + 64 * 128 + kk * 32), ws_desc(sb + kk * 32), j > 0 || kk > 0);
                }
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                if (j > 0) {
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    __syncwarp();
                    if (lane == 0)
                        ws_bar_arrive(bempty + 8 * ((kt - 1) % WSD_STAGES), 1);
                }
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0)
                ws_bar_arrive(bempty + 8 * ((g * WS_PROM + WS_PROM - 1) % WSD_STAGES), 1);
            wsd_fence(p);
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[i] += p[i];
        }
        int warp = (threadIdx.x >> 5) & 3;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 32; i++) {
                int o = n0 + cw * 128 + h * 64 + warp * 16 + (lane >> 2) + 8 * ((i >> 1) & 1);
                int t = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
                if (t < n && o < N)
                    kv[(size_t)t * N + o] = acc[h * 32 + i];
            }
    }
#endif
}

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static uint16_t f2h(float f) { __half x = __float2half_rn(f); uint16_t h; memcpy(&h, &x, 2); return h; }
static int cmpf(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }
template <typename F> static float timed(cudaStream_t st, F fn) {
    for (int i = 0; i < 3; i++) fn();
    CU(cudaStreamSynchronize(st));
    float ms[41]; cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 41; i++) { cudaEventRecord(a, st); fn(); cudaEventRecord(b, st); cudaEventSynchronize(b); cudaEventElapsedTime(&ms[i], a, b); }
    qsort(ms, 41, 4, cmpf); return ms[20];
}

int main(void)
{
    const int N = 25600, nmax = 128;
    cudaStream_t st; CU(cudaStreamCreate(&st));
    int *d_probe; CU(cudaMalloc(&d_probe, sizeof(int)));
    int ok = ws_probe(d_probe);
    CU(cudaFuncSetAttribute(wsd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WSD_SMEM));
    printf("ws ready %d; wsd: stages %d, smem %d bytes\n", ok, WSD_STAGES, WSD_SMEM);
    size_t cb = (size_t)1 << 30; void *c0, *c1; CU(cudaMalloc(&c0, cb)); CU(cudaMalloc(&c1, cb));
    CU(cudaMemset(c0, 1, cb));
    float cms = timed(st, [&] { cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, st); });
    double bw = 2.0 * cb / (cms * 1e-3), floor_ms = (double)N * K * 2 / bw * 1e3;
    printf("copy %.0f GB/s; floor for %d x %d F16 weights %.1f us\n", bw / 1e9, N, K, floor_ms * 1e3);
    cudaFree(c0); cudaFree(c1);
    size_t ne = (size_t)nmax * K, nw = (size_t)N * K;
    uint16_t *he = (uint16_t *)malloc(ne * 2), *hw = (uint16_t *)malloc(nw * 2);
    for (size_t i = 0; i < ne; i++) {
        int blk = (int)((i / 32) % 7), mm = 8 + (int)(rnd() % 8), ex = (int)(rnd() % 12) - 9 - blk;
        float v = ldexpf((float)mm / 8.0f, ex) * ((rnd() & 1) ? -1.f : 1.f);
        he[i] = f2h(rnd() % 10 == 0 ? 0.0f : v);
    }
    for (size_t i = 0; i < nw; i++) hw[i] = f2h((float)(((double)(rnd() % 2000001) / 1e6 - 1.0) * 0.05));
    __half *de; uint16_t *dw; float *k1, *k2, *k3;
    CU(cudaMalloc(&de, ne * 2)); CU(cudaMalloc(&dw, nw * 2));
    CU(cudaMalloc(&k1, (size_t)nmax * N * 4)); CU(cudaMalloc(&k2, (size_t)nmax * N * 4)); CU(cudaMalloc(&k3, (size_t)nmax * N * 4));
    CU(cudaMemcpy(de, he, ne * 2, cudaMemcpyHostToDevice)); CU(cudaMemcpy(dw, hw, nw * 2, cudaMemcpyHostToDevice));
    cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, st);
    const float one = 1, zero = 0;
    int nsv[] = {1, 8, 16, 32, 64};
    for (int q = 0; q < 5; q++) {
        int n = nsv[q];
        CUtensorMap maps[3], tw, te;
        if (ws_maps(maps, de, n, dw, N) < 0 || ws_map(&tw, dw, N, WSD_BM) < 0 || ws_map(&te, de, n, WSD_BN) < 0) {
            printf("maps failed\n"); return 1;
        }
        CU(cudaMemset(k2, 0xff, (size_t)n * N * 4)); CU(cudaMemset(k3, 0xff, (size_t)n * N * 4));
        auto blas = [&] { cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, dw, CUDA_R_16F, K, de, CUDA_R_16F, K, &zero, k1, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); };
        auto ws = [&] { CU(ws_gemm(maps, n, N, 0, k2, NULL, st)); };
        auto wsd = [&] { wsd_kernel<<<N / WSD_BM, 384, WSD_SMEM, st>>>(tw, te, n, N, k3); };
        blas(); ws(); wsd(); CU(cudaStreamSynchronize(st)); CU(cudaGetLastError());
        float tb = timed(st, blas), tws = timed(st, ws), td = timed(st, wsd);
        CU(cudaGetLastError());
        size_t no = (size_t)n * N;
        float *r1 = (float *)malloc(no * 4), *r2 = (float *)malloc(no * 4), *r3 = (float *)malloc(no * 4);
        CU(cudaMemcpy(r1, k1, no * 4, cudaMemcpyDeviceToHost)); CU(cudaMemcpy(r2, k2, no * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(r3, k3, no * 4, cudaMemcpyDeviceToHost));
        long diff = 0, unwritten = 0; double maxrel = 0;
        for (size_t i = 0; i < no; i++) {
            unwritten += isnan(r3[i]);
            diff += memcmp(&r2[i], &r3[i], 4) != 0;
            double d = fabs((double)r1[i] - r3[i]) / (fabs((double)r1[i]) + 1e-30);
            if (d > maxrel) maxrel = d;
        }
        printf("n=%3d: cuBLAS %6.1f us = %.3fx floor | ws_gemm (prefill kernel) %6.1f us = %.3fx | wsd %6.1f us = %.3fx | "
               "wsd vs ws_gemm bits: %ld of %zu differ; unwritten %ld; max rel vs cuBLAS %.2e\n",
               n, tb * 1e3, tb / floor_ms, tws * 1e3, tws / floor_ms, td * 1e3, td / floor_ms, diff, no, unwritten, maxrel);
        fflush(stdout);
        free(r1); free(r2); free(r3);
    }
    return 0;
}
