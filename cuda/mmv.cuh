/*
 * mmv.cuh - the decode projection (n <= ENGRAM_CUDA_GEMV_MAX tokens) on the
 * tensor cores, one pass over the weights for every token of the call:
 * kv = W e, F16 weights times the decoded rows.
 *
 * Decode reads 2 bytes of weights for every 2 x n flops: at n <= 64 the
 * weights' read time is the floor, and the work is to keep the memory
 * busy.  A warp owns 16 x MMV_RT outputs over a part of K and streams their
 * weights once, 16-byte loads, several blocks of 32 inputs in flight; every
 * token of the call (n-tiles of 8, the mma's n) is multiplied against the
 * same registers.
 *
 * The arithmetic, per output and token, is the same whatever n and
 * wherever the token sits in its tile (a token's bits do not depend on its
 * batch):
 *  - a block of 32 inputs shares one E8M0 scale 2^(s-127) (SPEC section 7),
 *    so the tensor cores take the E4M3 codes themselves, converted to F16
 *    exactly (cvt.rn.f16x2.e4m3x2), and sum the block's 32 exact products
 *    (two mma.m16n8k16, F32 accumulation starting from zero);
 *  - that sum times 2^(s-127) (exact while the result is a normal float) is
 *    added to the output's F32 sum with one FMA, the blocks in input
 *    order: the tensor cores' sums are promoted to F32 every 32 products;
 *  - where SPEC section 7 rounds a value (block scales under 3: below
 *    2^-133, BF16's subnormal step; from 3 up every value is exact in
 *    BF16) the codes are replaced by the rounded values x 2^(127-s), exact
 *    in F16;
 *  - the MMV_KSPLIT parts of K are added in part order at the end.
 * Column j of an mma's result depends on column j of B alone, so a token's
 * sums are those of the same token alone.
 *
 * Operand layout (PTX mma.m16n8k16, row.col): lane (g, q) = (lane / 4,
 * lane % 4) holds A at rows g, g+8 and B at column g.  The 16 k-positions
 * of one mma are mapped to inputs so that each lane's operands are 8
 * consecutive inputs (16 bytes of a weight row, 8 bytes of codes):
 * k-positions 2q, 2q+1 -> inputs 8q, 8q+1 and 2q+8, 2q+9 -> 8q+2, 8q+3 in
 * the first mma of a block, 8q+4..8q+7 in the second, the same map for A
 * and B (a sum does not depend on which k-position carries which product).
 */
#ifndef ENGRAM_CUDA_MMV_CUH
#define ENGRAM_CUDA_MMV_CUH

#include <cuda_fp16.h>

#include "common.cuh"
#include "row_decode.cuh"

#ifndef MMV_WARPS
#define MMV_WARPS 4 /* warps per block */
#endif
#ifndef MMV_RT
#define MMV_RT 2 /* row tiles of 16 outputs per warp */
#endif
#ifndef MMV_MIN_BLOCKS
#define MMV_MIN_BLOCKS 2 /* blocks an SM holds at once, at least (caps the registers) */
#endif
#ifndef MMV_KSPLIT
#define MMV_KSPLIT 2 /* parts of K per output (a divisor of 24 and of MMV_WARPS) */
#endif
#ifndef MMV_UNROLL
#define MMV_UNROLL 4 /* blocks of 32 inputs in flight per warp */
#endif
/* two n-tiles and more: mmv_staged_kernel */
#ifndef MMV_UNROLL_PRE
#define MMV_UNROLL_PRE 2 /* blocks of 32 inputs a round */
#endif
#ifndef MMV_SWARPS
#define MMV_SWARPS 8 /* warps per block */
#endif
#ifndef MMV_SMIN_BLOCKS
#define MMV_SMIN_BLOCKS 2 /* blocks an SM holds at once, at least (caps the registers at 128) */
#endif
#define MMV_ROWS (16 * MMV_RT)                   /* outputs per warp     */
#define MMV_GROUPS (MMV_WARPS / MMV_KSPLIT)      /* output groups a block */
#define MMV_PART_BLOCKS (K / 32 / MMV_KSPLIT)    /* blocks of 32 per part */
static_assert(MMV_PART_BLOCKS % MMV_UNROLL == 0 && MMV_PART_BLOCKS % MMV_UNROLL_PRE == 0, "MMV_UNROLL");
static_assert(MMV_WARPS % MMV_KSPLIT == 0 && (K / 256) % MMV_KSPLIT == 0, "MMV_KSPLIT");

/* d += A B, m16n8k16, F16 operands, F32 accumulation */
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 2^(s-127) for an E8M0 scale s <= 254 (255 never reaches here: rows are
 * checked to decode) */
__device__ __forceinline__ float e8m0_pow2(unsigned s)
{
    return __uint_as_float(s ? s << 23 : 0x00400000u);
}

/* Eight codes of one block (scale s) as four F16 pairs: the codes
 * themselves, or where SPEC section 7 rounds (s < 3), the BF16 values
 * x 2^(127-s) (multiples of 2^-8 up to 448: exact in F16). */
__device__ __forceinline__ void codes_f16(uint2 c, unsigned s, unsigned (&b)[4])
{
    if (s >= 3) {
        b[0] = e4m3x2_f16x2(c.x);
        b[1] = e4m3x2_f16x2(c.x >> 16);
        b[2] = e4m3x2_f16x2(c.y);
        b[3] = e4m3x2_f16x2(c.y >> 16);
        return;
    }
    float up = __uint_as_float((254u - s) << 23);
    unsigned w[2] = {c.x, c.y};
#pragma unroll
    for (int p = 0; p < 4; p++) {
        unsigned pair = w[p >> 1] >> (16 * (p & 1));
        __half2 v = __floats2half2_rn(decode1(pair & 0xffu, (int)s) * up,
                                      decode1((pair >> 8) & 0xffu, (int)s) * up);
        b[p] = *(unsigned *)&v;
    }
}

/*
 * For NT >= 2 n-tiles, the tokens' operands are made once per call rather
 * than by every warp: lane (g, q)'s B fragment of n-tile nt at block kb of
 * 32 inputs (token nt * 8 + g, inputs 8q..8q+7, as codes_f16 makes them)
 * into frag[(kb * NT + nt) * 32 + lane], and the block scales of the
 * lane's C columns (tokens nt * 8 + 2q, + 1; e8m0_pow2, 0 past n) into
 * pw[...]: one coalesced 16-byte and one 8-byte load per n-tile in the
 * projection, the same values.  Grid K / 32 blocks of NT x 32 threads;
 * the projection is its programmatic dependent.
 */
template <int NT>
__global__ void __launch_bounds__(NT * 32)
mmv_prep_kernel(const uint8_t *__restrict__ raw, size_t stride, const int *d_step, size_t raw_step, int n,
                uint4 *__restrict__ frag, float2 *__restrict__ pw)
{
    pdl_launch_dependents();
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    const int kb = blockIdx.x, nt = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int j = kb >> 3, b = kb & 7, tg = nt * 8 + g, t0 = nt * 8 + 2 * q;
    const size_t co = (size_t)j * ROW + b * 32 + 8 * q, so = (size_t)j * ROW + 256 + b;
    unsigned bb[4] = {0u, 0u, 0u, 0u};
    if (tg < n)
        codes_f16(*(const uint2 *)(raw + (size_t)tg * stride + co), raw[(size_t)tg * stride + so], bb);
    float p0 = t0 < n ? e8m0_pow2(raw[(size_t)t0 * stride + so]) : 0.0f;
    float p1 = t0 + 1 < n ? e8m0_pow2(raw[(size_t)(t0 + 1) * stride + so]) : 0.0f;
    size_t o = ((size_t)kb * NT + nt) * 32 + lane;
    frag[o] = make_uint4(bb[0], bb[1], bb[2], bb[3]);
    pw[o] = make_float2(p0, p1);
}

/* This lane's weight rows, for row tiles of 16 from row0 (clamped: rows
 * past n_out, or every row of a warp that is not live, load row 0 and are
 * never stored). */
__device__ __forceinline__ void mmv_rows(const uint16_t *w, int row0, bool live, int n_out,
                                         const uint16_t *(&wr)[MMV_RT][2])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = row0 + rt * 16 + g + 8 * h;
            wr[rt][h] = w + (size_t)(live && r < n_out ? r : 0) * K + 8 * q;
        }
}

/* One block of 32 inputs of one row tile and n-tile, the arithmetic of both
 * kernels: the 32 exact products summed by two mma from zero (a: the
 * weights' A fragments of rows g and g + 8, b: the tokens' B fragment),
 * then promoted into the lane's four sums with the scales p0, p1 of its C
 * columns 2q, 2q + 1. */
__device__ __forceinline__ void mmv_block(float (&acc)[4], const uint4 (&a)[2], uint4 b, float p0, float p1)
{
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16816(c, a[0].x, a[1].x, a[0].y, a[1].y, b.x, b.y);
    mma16816(c, a[0].z, a[1].z, a[0].w, a[1].w, b.z, b.w);
    acc[0] = fmaf(c[0], p0, acc[0]);
    acc[1] = fmaf(c[1], p1, acc[1]);
    acc[2] = fmaf(c[2], p0, acc[2]);
    acc[3] = fmaf(c[3], p1, acc[3]);
}

/*
 * The end of a projection: parts 1.. of each output group hand their sums
 * to part 0 through shared memory (slot(pp): the MMV_RT x NT x 4 x 32
 * floats of part pp >= 1 of the thread's group), which adds them in part
 * order and stores its outputs (rows past n_out and tokens past n are not
 * written).  Every thread of the block calls it (one barrier).
 */
template <int NT, typename Slot>
__device__ __forceinline__ void mmv_finish(float (&acc)[MMV_RT][NT][4], int p, Slot slot, bool live, int row0,
                                           int n, int n_out, float *__restrict__ kv, int ldkv)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    if (MMV_KSPLIT > 1) {
        if (p) {
            float *d = slot(p);
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        d[((rt * NT + nt) * 4 + i) * 32 + lane] = acc[rt][nt][i];
        }
        __syncthreads();
        if (p)
            return;
#pragma unroll
        for (int pp = 1; pp < MMV_KSPLIT; pp++) {
            const float *d = slot(pp);
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[rt][nt][i] += d[((rt * NT + nt) * 4 + i) * 32 + lane];
        }
    }
    if (!live)
        return;
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = row0 + rt * 16 + g + (i >> 1) * 8, t = nt * 8 + 2 * q + (i & 1);
                if (r < n_out && t < n)
                    kv[(size_t)t * ldkv + r] = acc[rt][nt][i];
            }
}

/*
 * One n-tile: up to 8 tokens (tokens past n are zeros and not written),
 * each lane decoding its token's codes itself.  Block: MMV_GROUPS output
 * groups of MMV_ROWS x MMV_KSPLIT parts, a warp each; part p of group r is
 * warp r * MMV_KSPLIT + p.
 */
__global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MIN_BLOCKS)
mmv_kernel(const uint16_t *__restrict__ w, const uint8_t *__restrict__ raw, size_t stride,
           const int *d_step, size_t raw_step, int n, int n_out, float *__restrict__ kv, int ldkv)
{
    /* parts 1.. of each group: [group][part - 1][value][lane] */
    __shared__ float part[MMV_KSPLIT > 1 ? MMV_GROUPS * (MMV_KSPLIT - 1) : 1][MMV_RT * 4][32];
    pdl_launch_dependents();
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int grp = blockIdx.x * MMV_GROUPS + warp / MMV_KSPLIT, p = warp % MMV_KSPLIT;
    const int row0 = grp * MMV_ROWS;
    const bool live = row0 < n_out; /* a warp past the outputs still meets the barrier */
    const uint16_t *wr[MMV_RT][2];
    mmv_rows(w, row0, live, n_out, wr);
    /* this lane's tokens: B column g, C columns 2q, 2q+1; none past n */
    const uint8_t *rb = raw + (size_t)g * stride, *rc = raw + (size_t)(2 * q) * stride;
    float acc[MMV_RT][1][4];
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[rt][0][i] = 0.0f;
    if (live) {
        /* U blocks of 32 inputs a round: their weights and codes loaded
         * first (U x MMV_RT x 32 bytes a lane in flight), then multiplied */
        constexpr int U = MMV_UNROLL;
        const int kb0 = p * MMV_PART_BLOCKS;
#pragma unroll 1
        for (int kb = kb0; kb < kb0 + MMV_PART_BLOCKS; kb += U) {
            uint4 a[U][MMV_RT][2];
            uint2 cd[U];
            unsigned sb[U], s0[U], s1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = (kb + u) >> 3, b = (kb + u) & 7;
                const size_t wo = (size_t)(kb + u) * 32;          /* input offset in a weight row */
                const size_t co = (size_t)j * ROW + b * 32 + 8 * q; /* this lane's codes in a token */
                const size_t so = (size_t)j * ROW + 256 + b;       /* the block's scale */
#pragma unroll
                for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        a[u][rt][h] = __ldg((const uint4 *)(wr[rt][h] + wo));
                bool vb = g < n, v0 = 2 * q < n, v1 = 2 * q + 1 < n;
                cd[u] = vb ? __ldg((const uint2 *)(rb + co)) : make_uint2(0u, 0u);
                sb[u] = vb ? __ldg(rb + so) : 3u;
                s0[u] = v0 ? __ldg(rc + so) : 0u;
                s1[u] = v1 ? __ldg(rc + stride + so) : 0u;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                unsigned bb[4];
                codes_f16(cd[u], sb[u], bb); /* zeros past n */
                float p0 = e8m0_pow2(s0[u]), p1 = e8m0_pow2(s1[u]);
#pragma unroll
                for (int rt = 0; rt < MMV_RT; rt++)
                    mmv_block(acc[rt][0], a[u][rt], make_uint4(bb[0], bb[1], bb[2], bb[3]), p0, p1);
            }
        }
    }
    /* part pp of group r: part[r (MMV_KSPLIT - 1) + pp - 1] */
    mmv_finish<1>(acc, p, [&](int pp) { return &part[(warp / MMV_KSPLIT) * (MMV_KSPLIT - 1) + pp - 1][0][0]; },
                  live, row0, n, n_out, kv, ldkv);
}

/*
 * Two n-tiles or more (9 to 64 tokens): the operands come from
 * mmv_prep_kernel (frag, pw), which this kernel waits for (a programmatic
 * dependent launch) before its first read, and are staged in shared
 * memory: the MMV_SGROUPS warps of a block that share a part of K read the
 * operands of U = MMV_UNROLL_PRE blocks of 32 inputs from there, copied once
 * for all of them (cp.async, two buffers a part: the next round's copy runs
 * under this round's products).  Each warp loads its weights for the round
 * first (a burst), then multiplies every n-tile against them.  The
 * products, their order and the parts' sum are mmv_kernel's: a token's
 * bits are the same alone and among 64.
 * H200 (bench/results/2026-12-03-cuda-dec, runs 6-8): with each warp
 * reading the operands itself (through L1) and 8 warps an SM, 64 tokens
 * took 2.6x the weights' floor and 32 tokens 1.95x; staged, with two
 * blocks of 8 warps an SM (registers capped at 128), 2.3x and 1.55x.  The
 * extra warps made the difference (one block of 8 warps an SM, staged,
 * gained nothing); streaming the weights one block ahead instead of a burst
 * a round was slower everywhere (run 7).
 * Block: MMV_KSPLIT parts x MMV_SGROUPS output groups of MMV_ROWS; part p
 * of group gi is warp p * MMV_SGROUPS + gi.  Dynamic shared memory:
 * mmv_staged_smem(NT) bytes (48 KB at NT = 8), through which the parts'
 * sums also pass at the end.
 */
#define MMV_SGROUPS (MMV_SWARPS / MMV_KSPLIT)
static_assert(MMV_SWARPS % MMV_KSPLIT == 0 && MMV_KSPLIT <= 2, "MMV_SWARPS; one named barrier a part (ids 1, 2)");

/* a part's buffer: U x NT x 32 fragments (16 bytes) then as many scale
 * pairs (8 bytes), in 16-byte units */
#define MMV_SLAB(NT) (MMV_UNROLL_PRE * (NT) * 32)
#define MMV_SBUF(NT) (MMV_SLAB(NT) * 3 / 2)
static constexpr size_t mmv_staged_smem(int nt)
{
    return (size_t)MMV_KSPLIT * 2 * MMV_SBUF(nt) * 16;
}
/* dynamic shared memory only: the staged kernel has no static __shared__
 * (one added would count against the same 48 KB at NT = 8) */
static_assert(mmv_staged_smem(8) <= 48 * 1024, "the staged kernel's buffers fit the default limit");
static_assert((size_t)MMV_SGROUPS * (MMV_KSPLIT - 1) * MMV_RT * 4 * 32 * 4 <= mmv_staged_smem(1),
              "the parts' sums fit in the buffers (both grow with NT)");

__device__ __forceinline__ void mmv_cp16(uint4 *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}

template <int NT>
__global__ void __launch_bounds__(MMV_SWARPS * 32, MMV_SMIN_BLOCKS)
mmv_staged_kernel(const uint16_t *__restrict__ w, int n, int n_out, float *__restrict__ kv, int ldkv,
                  const uint4 *__restrict__ frag, const float2 *__restrict__ pw)
{
    extern __shared__ uint4 mmv_sm[];
    constexpr int U = MMV_UNROLL_PRE, SLAB = MMV_SLAB(NT), SBUF = MMV_SBUF(NT), PT = MMV_SGROUPS * 32;
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int p = warp / MMV_SGROUPS, gi = warp % MMV_SGROUPS, tp = threadIdx.x - p * PT;
    const int row0 = (blockIdx.x * MMV_SGROUPS + gi) * MMV_ROWS;
    /* a warp past the outputs still copies and meets every barrier (it must:
     * a warp that left early would hang its part's named barrier and the
     * block's __syncthreads) */
    const bool live = row0 < n_out;
    const uint16_t *wr[MMV_RT][2];
    mmv_rows(w, row0, live, n_out, wr);
    float acc[MMV_RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[rt][nt][i] = 0.0f;
    uint4 *buf = mmv_sm + (size_t)p * 2 * SBUF;
    const int kb0 = p * MMV_PART_BLOCKS;
    pdl_wait(); /* mmv_prep_kernel's operands */
    /* this part's copy of the operands of blocks [kb, kb + U) into buffer b */
    auto stage = [&](int kb, int b) {
        const uint4 *gf = frag + (size_t)kb * NT * 32, *gp = (const uint4 *)(pw + (size_t)kb * NT * 32);
        uint4 *d = buf + b * SBUF;
        for (int i = tp; i < SBUF; i += PT)
            mmv_cp16(d + i, i < SLAB ? (const void *)(gf + i) : (const void *)(gp + (i - SLAB)));
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    stage(kb0, 0);
#pragma unroll 1
    for (int kb = kb0, r = 0; kb < kb0 + MMV_PART_BLOCKS; kb += U, r ^= 1) {
        uint4 a[U][MMV_RT][2];
        if (live)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        a[u][rt][h] = __ldg((const uint4 *)(wr[rt][h] + (size_t)(kb + u) * 32));
        /* this round's operands are in (each thread's copies, then the
         * part's barrier); every warp of the part is done with the other
         * buffer, which the next round's copy may now fill */
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        if (p == 0) /* immediate ids: a register id reserves all 16 barriers */
            asm volatile("bar.sync 1, %0;\n" ::"n"(PT) : "memory");
        else
            asm volatile("bar.sync 2, %0;\n" ::"n"(PT) : "memory");
        if (kb + U < kb0 + MMV_PART_BLOCKS)
            stage(kb + U, r ^ 1);
        if (!live)
            continue;
        const uint4 *sf = buf + r * SBUF;
        const float2 *sp = (const float2 *)(sf + SLAB);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 f = sf[(u * NT + nt) * 32 + lane];
                float2 pp = sp[(u * NT + nt) * 32 + lane];
#pragma unroll
                for (int rt = 0; rt < MMV_RT; rt++)
                    mmv_block(acc[rt][nt], a[u][rt], f, pp.x, pp.y);
            }
    }
    /* the parts' sums pass through the buffers: part pp of group gi at
     * [pp - 1][gi][value][lane] */
    __syncthreads(); /* every warp is done with the buffers */
    float *sums = (float *)mmv_sm;
    mmv_finish<NT>(acc, p,
                   [&](int pp) { return sums + ((pp - 1) * MMV_SGROUPS + gi) * (MMV_RT * NT * 4 * 32); },
                   live, row0, n, n_out, kv, ldkv);
}

#endif
