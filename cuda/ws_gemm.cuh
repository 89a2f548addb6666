/*
 * ws_gemm.cuh - the projection on the tensor cores with F32 promotion,
 * warp-specialized (included by engram_cuda.cu and gemm_variants.cu; wgmma,
 * TMA and setmaxnreg: sm_90a machine code): ws_gemm_kernel for n > 64
 * tokens (below), wsd_kernel for n <= 64 (further down: the same sums in
 * the decode's shape, and its wide tokens through gemv.cuh's sums).
 *
 * kv[t][o] = sum_i e16[t][i] * w[o][i] for t < n, o < N, i < K = 6144, both
 * operands F16, the tokens row-major, the weights in swizzled k-tiles of 64
 * inputs (ws_wmap).  A CTA computes tiles of 128 tokens x
 * WS_BN (176) outputs, one after another: the grid is what the device holds
 * at once and each cluster takes its next tile (or pair of tiles) from a
 * ticket at run time (the order that was blockIdx's, so the CTAs at work
 * at once share a few weights tiles; a static order lost 15% at 9 and 300
 * tokens, where the last tiles fell to clusters that were not the first
 * to finish).  Persistent with BN 176 against a CTA per tile with BN 192:
 * 2048 tokens 0.903-0.909 ms against 0.938-1.008, 1024 0.456-0.459
 * against 0.493-0.494, 512 0.259-0.260 against 0.280, 300 and 9 alike
 * (H200, gemm_variants, bench/results/2026-12-04-cuda-dec/run34).  It has
 * three warpgroups:
 *  - the producer (one thread, 40 registers after setmaxnreg) streams
 *    k-tiles of 64 through a WS_STAGES-deep ring in shared memory with the
 *    tensor memory accelerator: the tokens' tile by itself, the weights'
 *    tile, where the token tiles pair up, shared with the other CTA of its
 *    cluster (each CTA loads half and multicasts it to both, so the weights
 *    cross from L2 once per pair).
 *    The weights' boxes are copied as they lie (ws_wmap, below: a box of
 *    k-tile kt is one run of bytes, already in the swizzle's order; run 77:
 *    plain bulk copies of those runs instead of the map, 1.4-1.5% slower, not
 *    kept, run77/ws-gemm-bulk.diff).  Token rows past n are zero-filled by the copy engine; a
 *    weights box past N takes the next k-tile's first rows, which meet only
 *    outputs past N (never stored), and past the last k-tile zeros.  Each stage has a
 *    "full" barrier (the copies' bytes) and an "empty" one (every consumer
 *    warp of both CTAs done reading it);
 *  - two consumers (232 registers), 64 tokens each: per k-tile four
 *    wgmma.m64nNk16 into a partial sum that the tensor cores accumulate over
 *    WS_PROM tiles (256 products; its first wgmma with scale-d = 0), which is
 *    then added to the running F32 sums with ordinary F32 adds (rounded to
 *    nearest): the tensor cores' own accumulation, which rounds less
 *    carefully than F32 FMAs, never spans more than 256 products (DeepSeek's
 *    DeepGEMM promotes FP8 sums likewise, every 128).  One consumer's adds
 *    overlap the other's wgmma.
 * The sums and their order are those of the kernel this one replaced
 * (tc_gemm.cuh until session 6: every thread loading with cp.async, no
 * warp specialization; 1.24-1.36 ms for 2048 tokens on the H200, this one
 * 0.93-0.99): the same bits on every output of every shape measured.
 * Output: F32 kv, or (for the gate) BF16 kv times 2^kshift[t] rounded once
 * to nearest, as the gate rounds them.
 */
#ifndef ENGRAM_CUDA_WS_GEMM_CUH
#define ENGRAM_CUDA_WS_GEMM_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <string.h>

#include "common.cuh"
#include "host_err.cuh" /* quiet(): the set-up's failed calls clear their own errors, never a caller's */
#include "gemv.cuh" /* gemv_rows: wsd_kernel's wide tokens */

#define WS_BM 128
#ifndef WS_BN
#define WS_BN 176
#endif
#ifndef WS_STAGES
#define WS_STAGES 5
#endif
#define WS_BK 64
#ifndef WS_PROM
#define WS_PROM 4 /* k-tiles summed by the tensor cores between promotions */
#endif
#define WS_THREADS 384
#define WS_ACC (WS_BN / 2) /* accumulator registers per consumer thread */
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BN * WS_BK * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)
#define WS_SMEM (WS_STAGES * WS_STAGE_BYTES + 1024)
static_assert(K % (WS_BK * WS_PROM) == 0, "K holds whole promotion groups");
static_assert(WS_BN % 16 == 0, "each CTA's half of the weights tile is whole swizzle atoms");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WS_SM90A 1
#endif

enum { WS_F32 = 0, WS_BF16 = 1 };

__device__ __forceinline__ uint64_t ws_desc(uint32_t saddr)
{
    uint64_t d = (uint64_t)((saddr & 0x3FFFFu) >> 4);
    d |= (uint64_t)1 << 16;           /* leading byte offset (unused with the swizzle) */
    d |= (uint64_t)(1024 >> 4) << 32; /* stride byte offset: 8 rows of 128 bytes */
    d |= (uint64_t)1 << 62;           /* 128-byte swizzle */
    return d;
}

__device__ __forceinline__ void ws_wgmma(float *d, uint64_t da, uint64_t db, int scale_d)
{
#ifdef WS_SM90A
#if WS_BN == 128
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
#elif WS_BN == 176
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
                 : "l"(da), "l"(db), "r"(scale_d));
#elif WS_BN == 192
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
#else
#error "WS_BN: 128, 176 or 192"
#endif
#endif
}

/* keeps the compiler from moving reads of r (NACC floats) across the waits
 * before it */
template <int NACC = WS_ACC>
__device__ __forceinline__ void ws_fence(float *r)
{
#pragma unroll
    for (int i = 0; i < NACC; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ void ws_bar_init(uint32_t b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(count));
}

__device__ __forceinline__ void ws_bar_expect(uint32_t b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes)
                 : "memory");
}

/* until the phase of parity `parity` of barrier b has completed */
__device__ __forceinline__ void ws_bar_wait(uint32_t b, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWS_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WS_WAIT;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}

/* one arrival on barrier b (an address in this CTA), in this CTA (cl = 1)
 * or in each CTA of the cluster of 2, with the default (CTA-scope release)
 * semantics: with a cluster-scope release each consumer warp waited, tile
 * by tile, for its wgmma in flight (H200, 2048 tokens: 1.47-1.73 ms for the
 * projection instead of 0.93-0.99) */
__device__ __forceinline__ void ws_bar_arrive(uint32_t b, int cl)
{
    if (cl == 1) {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
        return;
    }
    for (uint32_t cta = 0; cta < 2; cta++)
        asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                     "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(b),
                     "r"(cta)
                     : "memory");
}

__device__ __forceinline__ void ws_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::
                     : "memory");
}

/* the box at (c0, c1) of map into dst, its bytes counted on barrier bar;
 * with mask, into the same offsets of each CTA of the cluster in mask */
__device__ __forceinline__ void ws_tma(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}

/* n bytes (a multiple of 16) at src (global, 16-byte aligned) into dst,
 * counted on barrier bar: a plain bulk copy (no tensor map) of bytes read
 * once a call (the decode's weights: 314.6 MB at W = 5120 against an H100's
 * 50 MB of L2, gone from it before the next call), with the L2 policy
 * evict_first: they leave L2 before what the call reads again (the
 * tokens' operands, which every CTA reads) and what the caller's next
 * kernels read (run 75, one token: 115.2-115.5 us with the policy,
 * 115.7-116.9 without, the tensor map's boxes 116.6-116.8; through those
 * boxes the policy alone gave one token nothing, run 76) */
__device__ __forceinline__ void ws_bulk_once(uint32_t dst, const void *src, uint32_t n, uint32_t bar)
{
    asm volatile("{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
                 "pol;\n}\n" ::"r"(dst),
                 "l"((uint64_t)__cvta_generic_to_global(src)), "r"(n), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void ws_tma_mc(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1,
                                          uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
                 : "memory");
}

/* the units of n tokens x N outputs in clusters of cl CTAs (the kernel's
 * end of work, the host's grid) */
__host__ __device__ __forceinline__ int ws_units(int n, int N, int cl)
{
    return (n + WS_BM - 1) / WS_BM / cl * ((N + WS_BN - 1) / WS_BN);
}

/* unit u's token tile (m0) and weights tile (n0) for the CTA of rank `rank`
 * in its cluster of cl: a unit is cl consecutive token tiles of one weights
 * tile, so the two CTAs of a cluster share the weights; units run token
 * tiles first, so the CTAs at work at once share a few weights tiles
 * (read once from memory, then from L2) and every token tile */
__device__ __forceinline__ void ws_tile(int u, int mb, int cl, int rank, int *m0, int *n0)
{
    int mu = mb / cl;
    *m0 = ((u % mu) * cl + rank) * WS_BM;
    *n0 = (u / mu) * WS_BN;
}

/* until the phase of parity `parity` of barrier b has completed, with the
 * cluster's writes released before its arrival seen (ws_unit_post's) */
__device__ __forceinline__ void ws_bar_wait_cl(uint32_t b, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWS_WAITC:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WS_WAITC;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}

/* unit u into slot (a shared int) of each CTA of the cluster of cl, then
 * one arrival on each one's barrier b, released at cluster scope */
__device__ __forceinline__ void ws_unit_post(uint32_t slot, uint32_t b, int u, int cl)
{
    for (uint32_t cta = 0; cta < (uint32_t)cl; cta++)
        asm volatile("{\n.reg .b32 ra, rb;\nmapa.shared::cluster.u32 ra, %0, %3;\n"
                     "mapa.shared::cluster.u32 rb, %1, %3;\n"
                     "st.shared::cluster.u32 [ra], %2;\n"
                     "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [rb];\n}\n" ::"r"(slot),
                     "r"(b), "r"(u), "r"(cta)
                     : "memory");
}

/* the i-th unit of this CTA's cluster (ws_unit_post's), once posted */
__device__ __forceinline__ int ws_unit_get(uint32_t slot, uint32_t b, int i)
{
    int u;
    ws_bar_wait_cl(b + 8 * (i & 1), (i >> 1) & 1);
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(u) : "r"(slot + 4 * (i & 1)) : "memory");
    return u;
}

/* tb: the weights in boxes of WS_BN / cl rows; launched in clusters of cl
 * (1, or 2 when the token tiles are even in number).  Persistent: each
 * cluster takes units from *next (0 at launch: ws_gemm's caller zeroes it) until
 * they run out, its first CTA's producer taking the ticket and posting it
 * to the cluster's consumers and other producer (two slots: a slot is
 * posted again two units later, when every reader has long read it, since
 * a unit is more than the WS_STAGES tiles the producers run ahead); the
 * producers run into the next unit's tiles while the consumers store the
 * last one's sums.  Any grid size gives the same outputs (ws_gemm sizes it
 * to the clusters the device holds at once). */
static_assert(K / WS_BK > WS_STAGES, "a unit is more tiles than the ring holds");
template <int OUT>
__global__ void __launch_bounds__(WS_THREADS, 1)
ws_gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb, int n,
               int N, void *__restrict__ out, const int *__restrict__ kshift, int cl, int *__restrict__ next)
{
#ifdef WS_SM90A
    EG_STAMP(1);
    extern __shared__ uint8_t ws_smem_raw[];
    __shared__ __align__(8) uint64_t full[WS_STAGES], empty[WS_STAGES], ufull[2];
    __shared__ int uslot[2];
    uint32_t sbase = (uint32_t)__cvta_generic_to_shared(ws_smem_raw);
    sbase = (sbase + 1023) & ~1023u; /* the swizzle's atoms are 1024-byte aligned */
    uint32_t bfull = (uint32_t)__cvta_generic_to_shared(full),
             bempty = (uint32_t)__cvta_generic_to_shared(empty),
             bunit = (uint32_t)__cvta_generic_to_shared(ufull), sslot = (uint32_t)__cvta_generic_to_shared(uslot);
    const int KT = K / WS_BK, rank = blockIdx.x % cl, mb = (n + WS_BM - 1) / WS_BM;
    const int units = ws_units(n, N, cl);
    int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WS_STAGES; s++) {
            ws_bar_init(bfull + 8 * s, 1);
            ws_bar_init(bempty + 8 * s, cl * 8); /* each consumer warp of the cluster */
        }
        ws_bar_init(bunit, 1);
        ws_bar_init(bunit + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    ws_cluster_sync(); /* the barriers exist before any CTA of the cluster uses them */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int q = 0; /* k-tiles loaded so far: stage q % WS_STAGES, its use q / WS_STAGES */
            for (int ui = 0;; ui++) {
                int u;
                if (rank == 0) {
                    u = atomicAdd(next, 1);
                    ws_unit_post(sslot + 4 * (ui & 1), bunit + 8 * (ui & 1), u, cl);
                } else {
                    u = ws_unit_get(sslot, bunit, ui);
                }
                if (u >= units)
                    break;
                int m0, n0;
                ws_tile(u, mb, cl, rank, &m0, &n0);
                for (int kt = 0; kt < KT; kt++, q++) {
                    int s = q % WS_STAGES;
                    uint32_t sa = sbase + s * WS_STAGE_BYTES, sb = sa + WS_A_BYTES;
                    /* the stage's previous tile read by both CTAs' consumers (the
                     * first WS_STAGES waits pass: that phase is "complete") */
                    ws_bar_wait(bempty + 8 * s, ((q / WS_STAGES) & 1) ^ 1);
                    ws_bar_expect(bfull + 8 * s, WS_STAGE_BYTES);
                    ws_tma(sa, &ta, bfull + 8 * s, kt * WS_BK, m0);
                    if (cl == 1)
                        ws_tma(sb, &tb, bfull + 8 * s, 0, kt * N + n0);
                    else /* this CTA's half, into both */
                        ws_tma_mc(sb + rank * (WS_BN / 2) * 128, &tb, bfull + 8 * s, 0,
                                  kt * N + n0 + rank * (WS_BN / 2), (uint16_t)3);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, lane = threadIdx.x & 31;
        int q0 = 0; /* k-tiles consumed before this unit */
        for (int ui = 0;; ui++, q0 += KT) {
            int u = ws_unit_get(sslot, bunit, ui);
            if (u >= units)
                break;
            int m0, n0;
            ws_tile(u, mb, cl, rank, &m0, &n0);
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
                    if (j > 0) { /* tile q - 1 is read: its stage goes back */
                        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                        __syncwarp();
                        if (lane == 0)
                            ws_bar_arrive(bempty + 8 * ((q - 1) % WS_STAGES), cl);
                    }
                }
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                __syncwarp();
                if (lane == 0)
                    ws_bar_arrive(bempty + 8 * ((q0 + g * WS_PROM + WS_PROM - 1) % WS_STAGES), cl);
                ws_fence(p);
#pragma unroll
                for (int i = 0; i < WS_ACC; i++)
                    acc[i] += p[i];
            }
            /* D fragment i: row 16 warp + lane/4 + 8 ((i/2)%2), column 8 (i/4) + 2 (lane%4) + i%2 */
            int warp = (threadIdx.x >> 5) & 3;
            int r0 = m0 + cw * 64 + warp * 16 + (lane >> 2);
            /* pairs as one store where every pair is aligned: N even, out too */
            int pairs = !(N & 1) && !((uintptr_t)out & 7);
#pragma unroll
            for (int i = 0; i < WS_ACC; i += 2) {
                int t = r0 + 8 * ((i >> 1) & 1), o = n0 + 8 * (i >> 2) + 2 * (lane & 3);
                if (t >= n || o >= N)
                    continue;
                if (OUT == WS_F32) {
                    float *kv = (float *)out + (size_t)t * N + o;
                    if (pairs) {
                        *(float2 *)kv = make_float2(acc[i], acc[i + 1]);
                    } else {
                        kv[0] = acc[i];
                        if (o + 1 < N)
                            kv[1] = acc[i + 1];
                    }
                } else {
                    float sc = __int_as_float((kshift[t] + 127) << 23); /* 2^k, |k| <= 126 */
                    unsigned lo = ws_bf16_bits(acc[i] * sc), hi = ws_bf16_bits(acc[i + 1] * sc);
                    unsigned short *kv = (unsigned short *)out + (size_t)t * N + o;
                    if (pairs) {
                        *(unsigned *)kv = lo | hi << 16;
                    } else {
                        kv[0] = (unsigned short)lo;
                        if (o + 1 < N)
                            kv[1] = (unsigned short)hi;
                    }
                }
            }
        }
    }
    if (cl > 1)
        ws_cluster_sync(); /* no CTA leaves while the other may still arrive on its barriers */
#endif
}

/* ------------------------------------------------- the decode shape */

/*
 * wsd_kernel: the same sums for n <= 64 tokens (ENGRAM_CUDA_GEMV_MAX), in
 * the shape of cuBLAS's own kernels for these shapes (nvjet_sm90_hss_
 * 256xB_64x5, bench/results/2026-12-03-cuda-dec/run24): a CTA owns
 * WSD_BM = 256 outputs over the whole of K (100 CTAs at W = 5120, one
 * wave), or for token boxes up to WSD_HALF_NB 128 outputs, two CTAs an SM
 * (200 CTAs at W = 5120 over all 132 SMs of an H200 where 100 left 32
 * idle: one token 1.210-1.250x the floor against 1.225-1.266x, 2-32 tokens
 * 0.01-0.04x less in four rounds of five; at NB = 64 0.1x more; runs 43
 * and 45);
 * the weights are wgmma's A straight from shared memory (a CTA's
 * outputs of a k-tile, 256 or 128 x 64, are one run of bytes of the
 * k-tiled weights already in the 128-byte swizzle's order, ws_wmap: one
 * plain bulk copy, no tensor map, with the L2 policy evict_first,
 * ws_bulk_once; run 45's probe of the producer's ring alone, H200: plain
 * bulk copies 1.023-1.034x half a copy of the same bytes, the tensor map's
 * boxes 1.049-1.079x; runs 75-77, three H100s: one token 1.1-2.1 us
 * faster than the boxes in all 9 pairs, 32-64 tokens 2.8-13.3 us in all
 * 45 (2.8-6.7 but for one slow round of the boxes); the last CTA's copy is short where N is
 * not a multiple of BM, the rest of its stage left as it was: outputs past
 * N, never stored), the tokens B (one box of NB x 64, NB the
 * call's n rounded up to 8, 16, 32 or 64; columns past n hold whatever e16
 * holds there and are not stored: a column of the result depends on its
 * own column of B alone).  The producer streams wsd_shape<NB>::stages
 * stages of 32 KB of weights and NB x 128 bytes of tokens (6 where they
 * fit, 5 at NB = 64: the narrow boxes took 1.27-1.28x the floor to
 * 1.23-1.25x at one token, run 39; half of that in the CTAs of 128); a
 * consumer warpgroup per 128 outputs (two m64nNBk16 a k16 step into one
 * partial), promoted to F32 every WS_PROM
 * k-tiles with ordinary F32 adds as ws_gemm_kernel promotes: the same
 * products in the same k16 groups and the same order of adds, so the same
 * bits as ws_gemm_kernel, A and B swapped (run 25: every output of n = 1,
 * 8, 16, 32, 64 tokens).  A token's kv is then the same whatever the number
 * of tokens of its call.
 * A programmatic dependent of decode16_kernel: the first stages' tiles
 * of weights are asked for before it waits (griddepcontrol.wait) for the
 * tokens' rows; it lets its own dependent, the apply's gate, be scheduled
 * at once.  The tokens decode16_kernel flagged as too wide for F16 (flag[t]):
 * their columns of the result are not stored; the CTA's consumer warps
 * then give their outputs the GEMV's sums (gemv_rows, as gemv_list_kernel
 * in the prefill: the same bits), unscaled (k = 0), from the raw rows.
 * Output: F32 kv x 2^-k, as ws_gemm's F32 output (the gate puts 2^k back),
 * or x 1 where kshift is given (kv x 2^kshift[t]: engram_cuda_project's,
 * as scale_kernel would give it).
 */
#define WSD_BM 256
#define WSD_BN 64 /* the widest token box */
#define WSD_SMEM_MAX (227 * 1024) /* the opt-in limit of compute capability 9.0 */
#define WSD_SMEM_SM (228 * 1024)  /* an SM's, of which each CTA's 1 KB the system's */
#ifndef WSD_HALF_NB
#define WSD_HALF_NB 32 /* the widest token box that takes CTAs of 128 outputs, two an SM (0: none; run 43) */
#endif
static_assert(ENGRAM_CUDA_GEMV_MAX <= WSD_BN && WSD_BN <= 64, "a call's tokens are one box, their flags one word");

/* The shape of wsd_kernel<NB>: a box of NB tokens (8, 16, 32 or 64: the
 * call's n rounded up), as many stages of weights and tokens as the shared
 * memory holds (6, 6, 5 in CTAs of 128; 5 at NB = 64 in CTAs of 256),
 * unless WSD_STAGES fixes it for every NB (at
 * most 5: more does not fit at NB = 64, which the static_assert refuses). */
template <int NB> struct wsd_shape {
    static constexpr int bm = NB <= WSD_HALF_NB ? 128 : WSD_BM; /* outputs a CTA */
    static constexpr int per_sm = bm == WSD_BM ? 1 : 2;         /* CTAs an SM */
    static constexpr int threads = 128 + bm;                    /* the producer's warpgroup, a consumer per 128 */
    static constexpr int a_bytes = bm * WS_BK * 2;
    static constexpr int b_bytes = NB * WS_BK * 2;
    static constexpr int stage_bytes = a_bytes + b_bytes;
    static constexpr int budget = per_sm == 1 ? WSD_SMEM_MAX : WSD_SMEM_SM / 2 - 1024;
#ifdef WSD_STAGES
    static constexpr int stages = WSD_STAGES;
#else
    static constexpr int stages = (budget - 2048) / stage_bytes;
#endif
    static constexpr int smem = stages * stage_bytes + 1024;
    static_assert(stage_bytes % 1024 == 0, "every box on a swizzle atom");
    static_assert(smem <= budget - 1024, "the barriers fit beside the stages");
};

/* one m64nNBk16 into d (NB / 2 floats a thread) */
template <int NB> __device__ __forceinline__ void wsd_wgmma(float *d, uint64_t da, uint64_t db, int scale_d)
{
#ifdef WS_SM90A
    if constexpr (NB == 8)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "l"(da), "l"(db), "r"(scale_d));
    else if constexpr (NB == 16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "l"(da), "l"(db), "r"(scale_d));
    else if constexpr (NB == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "l"(da), "l"(db), "r"(scale_d));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(scale_d));
#endif
}

/*
 * The apply's gate sums in wsd_kernel's epilogue (where the gate takes
 * them: gate_kernel's PRE path, W a multiple of 128, engram_cuda.cu's
 * gate_parts; boxes up to WSD_PARTS_NB tokens): the gate's latency after
 * its wait for the projection was kv's loads, the sums' trees and the
 * cluster's exchange (5.4 us of run 60's 14 above the floor at one token);
 * here each consumer warpgroup adds them over its 128 outputs as soon as it
 * has them.  Per token t and chunk c of 128 outputs (inside one stream:
 * W % 128 == 0), part[t][c] = {sum x q k, sum k k} for a chunk of k
 * (outputs below S W), or {1 if every value is below 2^126 in magnitude
 * (the gate's bound), else 0, 0} for a chunk of v, where k and v are kv x
 * 2^kshift[t] rounded to BF16 as the gate rounds them and x q is the
 * gate's product.  The order: each thread its four outputs of the token
 * (h, then b: output 64 h + 16 warp + lane / 4 + 8 b of the chunk), then
 * xor trees over lane / 4 (4, 8, 16), then the four warps ((0 + 1) + (2 +
 * 3)): the same for every box NB and every n, so the gate's bits of a
 * token do not depend on its call's size.  The wide tokens (their kv from
 * the GEMV, after the first pass) take the same order from kv read back;
 * the gate makes the same sums itself (gate.cuh's gate_chunk_tree) for the
 * widest box, whose 64 x q beside acc cost its epilogue 7-10 us (runs
 * 63-65: loaded after the main loop, or through shared memory), and for
 * the projections without wsd_kernel.
 */
struct wsd_gate {
    float *part;       /* [n][N / 128][2]; NULL: no sums (engram_cuda_project, other shapes) */
    const void *resid; /* the call's residual [n][S][W], BF16 or F32 */
    const float *wq;   /* [S][W] */
    const int *d_step; /* the residual then at + *d_step x resid_step bytes */
    size_t resid_step;
    const int *kshift; /* decode16_kernel's, read after its wait */
    int bf16, SW;      /* S x W: the outputs of k */
};
#ifndef WSD_PARTS_NB
#define WSD_PARTS_NB 32 /* the widest box whose epilogue makes the gate's sums (x q before the main loop) */
#endif
/* the host asks for the sums by n <= WSD_PARTS_NB, the kernel makes them by
 * its box NB <= WSD_PARTS_NB: the same tokens only where it is a box */
static_assert(WSD_PARTS_NB == 0 || WSD_PARTS_NB == 8 || WSD_PARTS_NB == 16 || WSD_PARTS_NB == 32,
              "WSD_PARTS_NB: a token box (0, 8, 16 or 32; 64's x q do not fit in registers)");

/* the call's residual (at its step) */
__device__ __forceinline__ const char *wsd_resid(const wsd_gate &g)
{
    return (const char *)g.resid + (g.d_step ? (size_t)*g.d_step * g.resid_step : 0);
}

/* the gate's product x q of token t at output o of k (0 outside k: o >=
 * SW) from the residual x ([t][SW], BF16 or F32) and the norms wq (the
 * epilogue's, wsd_xq, and gate.cuh's gate_chunk_xq) */
__device__ __forceinline__ float wsd_xq_at(const char *x, int bf16, const float *wq, int SW, int t, int o)
{
    return o < SW ? load_x(x, bf16, t * SW + o) * wq[o] : 0.0f;
}

/* x q of token t at output o of the residual x (wsd_resid) */
__device__ __forceinline__ float wsd_xq(const wsd_gate &g, const char *x, int t, int o)
{
    return wsd_xq_at(x, g.bf16, g.wq, g.SW, t, o);
}

/* The output of the chunk at ob that thread (warp, quad = lane / 4) of a
 * consumer warpgroup holds in its D fragments at half h, row b: m64nNk16's
 * layout, and the order of the gate's chunk sums (wsd_gate_parts; gate.cuh's
 * gate_chunk_xq takes lane L as warp L / 8, quad L % 8) */
__device__ __forceinline__ int wsd_out(int ob, int warp, int quad, int h, int b)
{
    return ob + h * 64 + warp * 16 + quad + 8 * b;
}

/* x q of this thread's outputs of the tokens it holds in wsd_kernel's D
 * fragments (0 past n or outside k) */
template <int NB>
__device__ __forceinline__ void wsd_load_xq(const wsd_gate &g, int n, int ob, int warp, int lane, float *xq)
{
    const char *x = wsd_resid(g);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < NB / 2; i++) {
            const int o = wsd_out(ob, warp, lane >> 2, h, (i >> 1) & 1), t = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
            xq[h * NB / 2 + i] = t < n ? wsd_xq(g, x, t, o) : 0.0f;
        }
}

/* one token's sums at this thread from its four outputs' kv (r) and x q,
 * in the order above (then over the lanes: wsd_part4, wsd_part_warp) */
__device__ __forceinline__ void wsd_part_own(const float *r, const float *xq, int ks, float &d, float &kk, int &ok)
{
    d = 0.0f, kk = 0.0f, ok = 1;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float k = bf16r(pow2scale(r[j], ks));
        d = fmaf(xq[j], k, d);
        kk = fmaf(k, k, kk);
        ok &= fabsf(k) < 0x1p126f;
    }
}

/* wsd_part_own, then over the lanes of its quad's other seven (the same
 * lane & 3): a warp's sums in every lane */
__device__ __forceinline__ void wsd_part4(const float *r, const float *xq, int ks, float &d, float &kk, int &ok)
{
    wsd_part_own(r, xq, ks, d, kk, ok);
#pragma unroll
    for (int off = 4; off <= 16; off <<= 1) {
        d += __shfl_xor_sync(0xffffffffu, d, off);
        kk += __shfl_xor_sync(0xffffffffu, kk, off);
        ok &= __shfl_xor_sync(0xffffffffu, ok, off);
    }
}

/* the warpgroup's barrier (named barrier 1 + cw, its 128 threads; ids
 * as immediates, so the kernel holds four barriers, not sixteen) */
__device__ __forceinline__ void wsd_wg_sync(int cw)
{
    if (cw == 0)
        asm volatile("bar.sync 1, 128;" ::: "memory");
    else
        asm volatile("bar.sync 2, 128;" ::: "memory");
}

/* the four warps' sums of token t (red[warp][r]) into part[t][ch] */
template <int NB>
__device__ __forceinline__ void wsd_part_store(const wsd_gate &g, float (*red)[NB][2], int r, int t, bool kch,
                                               int ch, int nch)
{
    float *p = g.part + ((size_t)t * nch + ch) * 2;
    if (kch) {
        p[0] = (red[0][r][0] + red[1][r][0]) + (red[2][r][0] + red[3][r][0]);
        p[1] = (red[0][r][1] + red[1][r][1]) + (red[2][r][1] + red[3][r][1]);
    } else {
        p[0] = red[0][r][0] != 0.0f && red[1][r][0] != 0.0f && red[2][r][0] != 0.0f && red[3][r][0] != 0.0f
                   ? 1.0f
                   : 0.0f;
        p[1] = 0.0f;
    }
}

/* kshift of the tokens this thread holds (wsd_gate_parts' ksv), loaded
 * together (with the flags: one latency, not one a token) */
template <int NB>
__device__ __forceinline__ void wsd_load_ks(const wsd_gate &g, int n, int lane, int *ksv)
{
#pragma unroll
    for (int i = 0; i < NB / 4; i++) {
        const int t = 8 * (i >> 1) + 2 * (lane & 3) + (i & 1);
        ksv[i] = t < n ? g.kshift[t] : 0;
    }
}

/* wsd_kernel's sums for the gate from its D fragments (acc), every token
 * but the wide ones (wm), by the warpgroup cw of the chunk at output ob */
template <int NB>
__device__ __forceinline__ void wsd_gate_parts(const wsd_gate &g, int n, int N, int ob, int cw, int warp,
                                               int lane, const float *acc, const float *xq, const int *ksv,
                                               uint64_t wm, float (*red)[NB][2])
{
    const bool kch = ob < g.SW;
#pragma unroll
    for (int gi = 0; gi < NB / 8; gi++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = 8 * gi + 2 * (lane & 3) + e;
            const int ks = ksv[2 * gi + e];
            float r[4], x4[4], d, kk;
            int ok;
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    r[2 * h + b] = acc[h * NB / 2 + 4 * gi + 2 * b + e];
                    x4[2 * h + b] = xq[h * NB / 2 + 4 * gi + 2 * b + e];
                }
            wsd_part4(r, x4, ks, d, kk, ok);
            if (lane < 4) {
                red[warp][t][0] = kch ? d : (float)ok;
                red[warp][t][1] = kk;
            }
        }
    wsd_wg_sync(cw);
    const int t = threadIdx.x & 127;
    if (t < n && !((wm >> t) & 1))
        wsd_part_store<NB>(g, red, t, t, kch, ob / 128, N / 128);
}

/* one token's sums at this thread (every lane as the holder of its
 * outputs: the lanes of a quad alike) from its F32 kv in global memory
 * (kvt, x 2^ks) */
__device__ __forceinline__ void wsd_token_part(const wsd_gate &g, int ob, int warp, int lane, const float *kvt,
                                               int t, int ks, float &d, float &kk, int &ok)
{
    const char *x = wsd_resid(g);
    float r[4], x4[4];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int o = wsd_out(ob, warp, lane >> 2, h, b);
            r[2 * h + b] = kvt[o];
            x4[2 * h + b] = wsd_xq(g, x, t, o);
        }
    wsd_part4(r, x4, ks, d, kk, ok);
}

/* the same for the wide tokens (wm), after the CTA's GEMV wrote their kv */
template <int NB>
__device__ __forceinline__ void wsd_gate_parts_wide(const wsd_gate &g, int N, int ob, int cw, int warp, int lane,
                                                    const float *kv, uint64_t wm, float (*red)[NB][2])
{
    const bool kch = ob < g.SW;
    for (uint64_t m = wm; m; m &= m - 1) {
        const int t = __ffsll((long long)m) - 1;
        float d, kk;
        int ok;
        wsd_token_part(g, ob, warp, lane, kv + (size_t)t * N, t, g.kshift[t], d, kk, ok);
        if (lane == 0) { /* red[.][t]: this token's alone */
            red[warp][t][0] = kch ? d : (float)ok;
            red[warp][t][1] = kk;
        }
        wsd_wg_sync(cw);
        if ((threadIdx.x & 127) == t)
            wsd_part_store<NB>(g, red, t, t, kch, ob / 128, N / 128);
    }
}


template <int NB>
__global__ void __launch_bounds__(wsd_shape<NB>::threads, wsd_shape<NB>::per_sm)
wsd_kernel(const __grid_constant__ CUtensorMap te, int n, int N,
           float *__restrict__ kv, const uint16_t *__restrict__ w, const uint8_t *raw, size_t stride,
           const int *d_step, size_t raw_step, const int *flag, const int *kshift, const wsd_gate gg)
{
#ifdef WS_SM90A
    EG_STAMP(5);
    /* the apply's gate (kshift NULL) may be scheduled at once: its blocks
     * load the residual meanwhile; not engram_cuda_project's caller's
     * kernels, which might write the rows this kernel reads to its end */
    if (!kshift)
        pdl_launch_dependents();
    typedef wsd_shape<NB> S;
    constexpr int STAGES = S::stages, STAGE_BYTES = S::stage_bytes, NACC = NB, BM = S::bm,
                  A_BYTES = S::a_bytes, CWARPS = BM / 32;
    extern __shared__ uint8_t ws_smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    uint32_t sbase = ((uint32_t)__cvta_generic_to_shared(ws_smem_raw) + 1023) & ~1023u;
    uint32_t bfull = (uint32_t)__cvta_generic_to_shared(full),
             bempty = (uint32_t)__cvta_generic_to_shared(empty);
    const int n0 = blockIdx.x * BM, KT = K / WS_BK, wg = threadIdx.x >> 7;
    static_assert(K / WS_BK >= STAGES, "the first stages are all filled before the wait");
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            ws_bar_init(bfull + 8 * s, 1);
            ws_bar_init(bempty + 8 * s, CWARPS); /* each consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        if constexpr (S::per_sm == 1) /* two an SM: 128 registers a thread from the start */
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            /* the weights do not depend on the tokens: the first stages'
             * tiles go out before the wait for decode16_kernel.  A tile of
             * this CTA's outputs is wb contiguous bytes of the k-tiled
             * weights (ws_wmap), copied as they lie (the last CTA's may
             * be short of BM outputs: the rest of its stage is left as it
             * was, met only by outputs past N, never stored) */
            const uint32_t wb = (uint32_t)(N - n0 < BM ? N - n0 : BM) * 128, tx = wb + STAGE_BYTES - A_BYTES;
            for (int kt = 0; kt < STAGES; kt++) {
                uint32_t sa = sbase + kt * STAGE_BYTES;
                ws_bar_expect(bfull + 8 * kt, tx);
                ws_bulk_once(sa, w + wt_index(n0, kt * WS_BK, N), wb, bfull + 8 * kt);
            }
            asm volatile("griddepcontrol.wait;\n" ::: "memory");
            for (int kt = 0; kt < STAGES; kt++)
                ws_tma(sbase + kt * STAGE_BYTES + A_BYTES, &te, bfull + 8 * kt, kt * WS_BK, 0);
            for (int kt = STAGES; kt < KT; kt++) {
                int s = kt % STAGES;
                uint32_t sa = sbase + s * STAGE_BYTES;
                ws_bar_wait(bempty + 8 * s, ((kt / STAGES) & 1) ^ 1);
                ws_bar_expect(bfull + 8 * s, tx);
                ws_bulk_once(sa, w + wt_index(n0, kt * WS_BK, N), wb, bfull + 8 * s);
                ws_tma(sa + A_BYTES, &te, bfull + 8 * s, kt * WS_BK, 0);
            }
        }
    } else {
        if constexpr (S::per_sm == 1)
            asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        /* the gate's sums (g.part): this warpgroup's chunk of 128 outputs
         * at ob, if inside N (the last CTA of 256 outputs may have half) */
        const int ob = n0 + cw * 128;
        const bool gp = NB <= WSD_PARTS_NB && gg.part && ob < N;
        __shared__ float red[BM / 128][4][NB][2];
        float acc[NACC], p[NACC], xq[NACC];
#pragma unroll
        for (int i = 0; i < NACC; i++)
            acc[i] = p[i] = 0.0f;
        if (gp)
            wsd_load_xq<NB>(gg, n, ob, warp, lane, xq);
        for (int g = 0; g < KT / WS_PROM; g++) {
#pragma unroll
            for (int j = 0; j < WS_PROM; j++) {
                int kt = g * WS_PROM + j, s = kt % STAGES;
                ws_bar_wait(bfull + 8 * s, (kt / STAGES) & 1);
                uint32_t sa = sbase + s * STAGE_BYTES + cw * 128 * 128,
                         sb = sbase + s * STAGE_BYTES + A_BYTES;
                if (j == 0)
                    ws_fence<NACC>(p);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < WS_BK / 16; kk++) {
                    wsd_wgmma<NB>(p, ws_desc(sa + kk * 32), ws_desc(sb + kk * 32), j > 0 || kk > 0);
                    wsd_wgmma<NB>(p + NB / 2, ws_desc(sa + 64 * 128 + kk * 32), ws_desc(sb + kk * 32),
                                  j > 0 || kk > 0);
                }
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                if (j > 0) { /* tile kt - 1 is read: its stage goes back */
                    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                    __syncwarp();
                    if (lane == 0)
                        ws_bar_arrive(bempty + 8 * ((kt - 1) % STAGES), 1);
                }
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0)
                ws_bar_arrive(bempty + 8 * ((g * WS_PROM + WS_PROM - 1) % STAGES), 1);
            ws_fence<NACC>(p);
#pragma unroll
            for (int i = 0; i < NACC; i++)
                acc[i] += p[i];
        }
        /* decode16_kernel's flags and shifts (only the producer thread has
         * waited for it so far) */
        pdl_wait();
        int ksv[NB / 4];
        if (gp)
            wsd_load_ks<NB>(gg, n, lane, ksv);
        const uint64_t wm = __ballot_sync(0xffffffffu, lane < n && flag[lane]) |
                            (uint64_t)__ballot_sync(0xffffffffu, lane + 32 < n && flag[lane + 32]) << 32;
        /* D fragment i of m64 half h: output 16 warp + lane/4 + 8 ((i/2)%2),
         * token 8 (i/4) + 2 (lane%4) + i%2 */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < NB / 2; i++) {
                int o = wsd_out(ob, warp, lane >> 2, h, (i >> 1) & 1);
                int t = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
                if (t < n && o < N && !((wm >> t) & 1))
                    kv[(size_t)t * N + o] =
                        kshift ? pow2scale(acc[h * NB / 2 + i], kshift[t]) : acc[h * NB / 2 + i];
            }
        if constexpr (NB <= WSD_PARTS_NB)
            if (gp)
                wsd_gate_parts<NB>(gg, n, N, ob, cw, warp, lane, acc, xq, ksv, wm, red[cw]);
        /* the wide tokens (none in trained tables; each costs this CTA a
         * pass over its weights on its consumer warps, where the prefill's
         * gemv_list_kernel has the whole GPU: ~0.9 ms a call with one on
         * the H200 with CTAs of 256 outputs, against ~0.3, bench_cuda's
         * BENCH_CUDA_WIDE): the consumer warps take the CTA's outputs
         * GEMV_ROWS at a time */
        if (wm && d_step)
            raw += (size_t)(*d_step) * raw_step;
        for (uint64_t m = wm; m; m &= m - 1) {
            const int t = __ffsll((long long)m) - 1;
            for (int o0 = n0 + (cw * 4 + warp) * GEMV_ROWS; o0 < n0 + BM && o0 < N; o0 += CWARPS * GEMV_ROWS) {
                float s[GEMV_ROWS];
                gemv_rows(w, 1 /* k-tiles: wsd_kernel runs only there */, raw + (size_t)t * stride, o0, N, lane,
                          s);
                for (int rw = 0; rw < GEMV_ROWS; rw++)
                    if (lane == 0 && o0 + rw < N)
                        kv[(size_t)t * N + o0 + rw] = kshift ? pow2scale(s[rw], kshift[t]) : s[rw];
            }
        }
        if (NB <= WSD_PARTS_NB && wm && gg.part) {
            /* every consumer warp's GEMV rows are written (named barrier 3,
             * the BM consumer threads), then their sums */
            asm volatile("bar.sync 3, %0;" ::"n"(BM) : "memory");
            if (gp)
                wsd_gate_parts_wide<NB>(gg, N, ob, cw, warp, lane, kv, wm, red[cw]);
        }
    }
#endif
}

/* ---------------------------------------------------------------- host */

typedef CUresult (*ws_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                 CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);

/* The copy engine's view of `rows` rows of `cols` F16 values at p (a row
 * every cols x 2 bytes), in boxes of box_rows x 64, laid out in shared
 * memory with the 128-byte swizzle (swz) or as they lie.  0, or -1 when
 * the driver has no cuTensorMapEncodeTiled or refuses the map. */
static int ws_map2(CUtensorMap *m, const void *p, unsigned rows, unsigned cols, unsigned box_rows, int swz)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (!quiet(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q)) ||
        q != cudaDriverEntryPointSuccess || !fn)
        return -1;
    cuuint64_t dims[2] = {(cuuint64_t)cols, rows}, strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {WS_BK, box_rows}, es[2] = {1, 1};
    CUresult r = ((ws_encode_fn)fn)(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)p, dims, strides, box, es,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    swz ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* rows of K F16 values (the tokens' e16) in boxes of box_rows x 64, swizzled */
static int ws_map(CUtensorMap *m, const void *p, unsigned rows, unsigned box_rows)
{
    return ws_map2(m, p, rows, K, box_rows, 1);
}

/*
 * The weights as the wgmma kernels read them: N x K F16 in k-tiles of 64
 * inputs, [K / 64][N][64], each output's 128 bytes of a tile in the order
 * of the 128-byte swizzle (wt_index, common.cuh: ws_tile_weights writes
 * them, the GEMVs read them through w8_at).  Seen as K / 64 x N rows of 64 values: the box of R outputs from
 * n0 (a multiple of 8) of k-tile kt is the rows kt N + n0 .. + R - 1, R x
 * 128 contiguous bytes, copied as they lie into shared memory (1024-byte
 * aligned) where they are what the 128-byte swizzle would have made of the
 * row-major tile.  A box past N takes the next k-tile's first rows (past
 * the last k-tile, zeros): they meet only outputs past N, never stored.
 * Row-major, each output's 128 bytes of a tile lay K x 2 bytes from the
 * next (the k-tiles through the swizzling map alone were no faster, run
 * 45's wip-kt.diff; the plain bulk copies they allow are wsd_kernel's).
 */
static int ws_wmap(CUtensorMap *m, const void *w, unsigned N, unsigned box_rows)
{
    return ws_map2(m, w, (K / WS_BK) * N, WS_BK, box_rows, 0);
}

/* dw (device, N x K F16) = hw (host, row-major [N][K]) in ws_wmap's
 * layout (wt_index), through t, the caller's host buffer of one k-tile (N
 * x 128 bytes), one copy a k-tile.  The first copy's error, or
 * cudaSuccess. */
static cudaError_t ws_tile_weights(uint16_t *dw, const uint16_t *hw, unsigned N, uint16_t *t)
{
    cudaError_t e = cudaSuccess;
    for (int kt = 0; kt < K / WS_BK && e == cudaSuccess; kt++) {
        const size_t base = wt_index(0, kt * WS_BK, (int)N); /* the k-tile's first value */
        for (int o = 0; o < (int)N; o++)
            for (int i0 = kt * WS_BK; i0 < (kt + 1) * WS_BK; i0 += 8)
                memcpy(t + (wt_index(o, i0, (int)N) - base), hw + (size_t)o * K + i0, 16);
        e = cudaMemcpy(dw + base, t, (size_t)N * WS_BK * 2, cudaMemcpyHostToDevice);
    }
    return e;
}

/* The maps of a projection: m[0] tokens e16 (rows_e rows), the k-tiled
 * weights w (N outputs) in whole tiles m[1] and in halves m[2]. */
static int ws_maps(CUtensorMap m[3], const void *e16, unsigned rows_e, const void *w, unsigned N)
{
    if (ws_map(&m[0], e16, rows_e, WS_BM) < 0 || ws_wmap(&m[1], w, N, WS_BN) < 0 ||
        ws_wmap(&m[2], w, N, WS_BN / 2) < 0)
        return -1;
    return 0;
}

/* The decode kernel's maps (its weights come by plain bulk copies): m[j]
 * tokens e16 (rows_e rows) in boxes of 8 << j (j < 4: wsd_kernel<8>,
 * <16>, <32>, <64>). */
#define WSD_NMAPS 4
static int wsd_maps(CUtensorMap m[WSD_NMAPS], const void *e16, unsigned rows_e)
{
    for (int j = 0; j < WSD_NMAPS; j++)
        if (ws_map(&m[j], e16, rows_e, 8u << j) < 0)
            return -1;
    return 0;
}

__global__ void ws_probe_kernel(int *out)
{
#ifdef WS_SM90A
    *out = 1;
#else
    *out = 0;
#endif
}

/* wsd_kernel<NB>'s shared memory (whether the runtime took it), and the
 * preference for all of an SM's L1 as shared memory, so that two CTAs of
 * 128 outputs fit (a hint: refused, it costs speed, not the path) */
template <int NB> static bool wsd_setup()
{
    (void)quiet(cudaFuncSetAttribute(wsd_kernel<NB>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    return quiet(
        cudaFuncSetAttribute(wsd_kernel<NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, wsd_shape<NB>::smem));
}

/* Raises the kernels' shared-memory limit: 0, or -1. */
static int ws_setup(void)
{
    bool ok = quiet(cudaFuncSetAttribute(ws_gemm_kernel<WS_F32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            WS_SMEM)) &&
              quiet(cudaFuncSetAttribute(ws_gemm_kernel<WS_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            WS_SMEM)) &&
              wsd_setup<8>() && wsd_setup<16>() && wsd_setup<32>() && wsd_setup<64>();
    return ok ? 0 : -1;
}

/* The launch of ws_gemm_kernel in clusters of cl CTAs on the grid of
 * `ctas`, with at[1] its attribute. */
static cudaLaunchConfig_t ws_cfg(int cl, int ctas, cudaStream_t st, cudaLaunchAttribute at[1])
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(WS_THREADS);
    cfg.dynamicSmemBytes = WS_SMEM;
    cfg.stream = st;
    at[0] = cudaLaunchAttribute{};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* fit[cl - 1]: the clusters of cl = 1, 2 CTAs of ws_gemm_kernel that the
 * current device runs at once (after ws_setup), or 0 where the runtime
 * cannot say (ws_gemm then launches a cluster per unit). */
static void ws_fit(int fit[2])
{
    for (int cl = 1; cl <= 2; cl++) {
        cudaLaunchAttribute at[1];
        cudaLaunchConfig_t cfg = ws_cfg(cl, cl, 0, at);
        int k = 0;
        if (!quiet(cudaOccupancyMaxActiveClusters(&k, (void *)ws_gemm_kernel<WS_BF16>, &cfg)) || k < 0)
            k = 0;
        fit[cl - 1] = k;
    }
}

/* kv (n x N) = e16 x w^T through maps made by ws_maps (e16 with at least n
 * rows); out F32, or BF16 scaled by 2^kshift[t] (out_bf16); *next (device)
 * 0 in the stream's order before the call, the kernel's ticket of units.  Pairs of CTAs
 * share the weights where the token tiles pair up (n = 2048: 0.94 ms against
 * 0.98 on the H200), single CTAs otherwise (n = 300: 0.22 ms against 0.26
 * with a CTA of padding in every cluster).  A grid of fit[cl - 1] clusters
 * (ws_fit), each taking units of cl tiles until none is left; fewer where
 * there are fewer units, a cluster per unit where fit is 0.  The launch's
 * error, or 0. */
static cudaError_t ws_gemm(const CUtensorMap m[3], const int fit[2], int n, int N, int out_bf16, void *out,
                           const int *kshift, int *next, cudaStream_t st)
{
    int mb = (n + WS_BM - 1) / WS_BM, cl = mb % 2 ? 1 : 2;
    int units = ws_units(n, N, cl), f = fit[cl - 1];
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = ws_cfg(cl, cl * (f > 0 && f < units ? f : units), st, at);
    const CUtensorMap &tb = m[cl == 1 ? 1 : 2];
    if (out_bf16)
        return cudaLaunchKernelEx(&cfg, ws_gemm_kernel<WS_BF16>, m[0], tb, n, N, out, kshift, cl, next);
    return cudaLaunchKernelEx(&cfg, ws_gemm_kernel<WS_F32>, m[0], tb, n, N, out, kshift, cl, next);
}

/* 1 if the code this device runs has the wgmma kernel (sm_90a machine code;
 * the PTX JIT-compiled for other devices has not) and its shared-memory
 * limit is raised, with fit filled (ws_fit); 0 otherwise (then the cuBLAS
 * GEMM is used).  Runs a probe
 * kernel that writes d (a device int) and waits: call at set-up, not during
 * graph capture. */
static int ws_probe(int *d, int fit[2])
{
    int h = 0;
    void *args[] = {&d};
    int ok = quiet(cudaLaunchKernel((const void *)ws_probe_kernel, dim3(1), dim3(1), args, 0, 0)) &&
             quiet(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost)) && h == 1 && ws_setup() == 0;
    fit[0] = fit[1] = 0;
    if (ok)
        ws_fit(fit);
    return ok;
}

#endif
