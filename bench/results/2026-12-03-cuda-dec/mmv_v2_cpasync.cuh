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
 *  - where SPEC section 7 rounds (values below 2^-126: scales under 3) the
 *    codes are replaced by the rounded values x 2^(127-s), exact in F16;
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
#ifndef MMV_KSPLIT
#define MMV_KSPLIT 2 /* parts of K per output (a divisor of 24 and of MMV_WARPS) */
#endif
#ifndef MMV_STAGES
#define MMV_STAGES 6 /* blocks of 32 inputs of weights in flight per warp (a ring in shared memory) */
#endif
#define MMV_ROWS (16 * MMV_RT)                   /* outputs per warp     */
#define MMV_GROUPS (MMV_WARPS / MMV_KSPLIT)      /* output groups a block */
#define MMV_PART_BLOCKS (K / 32 / MMV_KSPLIT)    /* blocks of 32 per part */
static_assert(MMV_WARPS % MMV_KSPLIT == 0 && (K / 256) % MMV_KSPLIT == 0, "MMV_KSPLIT");
static_assert(MMV_PART_BLOCKS >= MMV_STAGES, "MMV_STAGES");
#define MMV_PRAGMA(x) _Pragma(#x)
#define MMV_UNROLL_N(n) MMV_PRAGMA(unroll n)

/* two E4M3 codes (low byte first) -> two F16 values, exact */
__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned c)
{
    unsigned r;
    unsigned short h = (unsigned short)c;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
    return r;
}

/* 16 bytes global -> shared, asynchronously (cp.async, L2 only: the
 * weights are read once); the groups of a thread complete in order */
__device__ __forceinline__ void cp16(void *smem, const void *gmem)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* wait until at most P of this thread's groups are pending */
template <int P> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(P) : "memory");
}

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
 * NT n-tiles of 8 tokens (n <= 8 NT; tokens past n are zeros and not
 * written).  Block: MMV_GROUPS output groups of MMV_ROWS x MMV_KSPLIT
 * parts, a warp each; part p of group r is warp r * MMV_KSPLIT + p.
 */
template <int NT>
__global__ void __launch_bounds__(MMV_WARPS * 32)
mmv_kernel(const uint16_t *__restrict__ w, const uint8_t *__restrict__ raw, size_t stride,
           const int *d_step, size_t raw_step, int n, int n_out, float *__restrict__ kv, int ldkv)
{
    /* The weights go through a ring of MMV_STAGES blocks of 32 inputs per
     * warp: each lane copies its own 16-byte pieces (rows g, g + 8 of each
     * row tile) and reads back only those, so the lane's cp.async groups
     * alone order it (no barrier).  After the loop the ring holds the
     * parts' sums for part 0. */
    constexpr int RING = MMV_WARPS * MMV_STAGES * MMV_RT * 2 * 32; /* uint4s */
    constexpr int PARTS = (MMV_KSPLIT > 1 ? MMV_WARPS : 1) * MMV_RT * NT * 4 * 32 / 4;
    __shared__ uint4 smem[RING > PARTS ? RING : PARTS];
    pdl_launch_dependents();
    if (d_step)
        raw += (size_t)(*d_step) * raw_step;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int grp = blockIdx.x * MMV_GROUPS + warp / MMV_KSPLIT, p = warp % MMV_KSPLIT;
    const int row0 = grp * MMV_ROWS;
    const bool live = row0 < n_out; /* a warp past the outputs still meets the barrier */
    /* this lane's weight rows (clamped: rows past n_out load row 0, never stored) */
    const uint16_t *wr[MMV_RT][2];
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = row0 + rt * 16 + g + 8 * h;
            wr[rt][h] = w + (size_t)(live && r < n_out ? r : 0) * K + 8 * q;
        }
    uint4 *ring = smem + (size_t)warp * MMV_STAGES * MMV_RT * 2 * 32 + lane; /* [stage][rt][h] x 32 */
    /* this lane's tokens in n-tile nt: B column g (token nt * 8 + g), C
     * columns 2q, 2q+1; none past n */
    const uint8_t *rb = raw + (size_t)g * stride, *rc = raw + (size_t)(2 * q) * stride;
    const size_t step8 = 8 * stride;
    float acc[MMV_RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[rt][nt][i] = 0.0f;
    const int kb0 = p * MMV_PART_BLOCKS;
    /* block kb's weights into its stage (a group, empty past the part) */
    auto fill = [&](int i) {
        if (live && i < MMV_PART_BLOCKS) {
            const size_t wo = (size_t)(kb0 + i) * 32;
            uint4 *st = ring + (size_t)(i % MMV_STAGES) * MMV_RT * 2 * 32;
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    cp16(st + (rt * 2 + h) * 32, wr[rt][h] + wo);
        }
        cp_commit();
    };
    /* block kb's codes and scales for this lane's tokens (registers, one
     * block ahead) */
    uint2 cd[NT];
    unsigned sb[NT], s0[NT], s1[NT];
    auto codes = [&](int i) {
        const int kb = kb0 + (i < MMV_PART_BLOCKS ? i : 0), j = kb >> 3, b = kb & 7;
        const size_t co = (size_t)j * ROW + b * 32 + 8 * q, so = (size_t)j * ROW + 256 + b;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint8_t *tb = rb + nt * step8, *tc = rc + nt * step8;
            bool vb = nt * 8 + g < n, v0 = nt * 8 + 2 * q < n, v1 = nt * 8 + 2 * q + 1 < n;
            cd[nt] = vb ? __ldg((const uint2 *)(tb + co)) : make_uint2(0u, 0u);
            sb[nt] = vb ? __ldg(tb + so) : 3u;
            s0[nt] = v0 ? __ldg(tc + so) : 0u;
            s1[nt] = v1 ? __ldg(tc + stride + so) : 0u;
        }
    };
    if (live) {
#pragma unroll
        for (int i = 0; i < MMV_STAGES - 1; i++)
            fill(i);
        codes(0);
#pragma unroll 1
        for (int i = 0; i < MMV_PART_BLOCKS; i++) {
            cp_wait<MMV_STAGES - 2>(); /* block i's group has landed */
            const uint4 *st = ring + (size_t)(i % MMV_STAGES) * MMV_RT * 2 * 32;
            uint4 a[MMV_RT][2];
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    a[rt][h] = st[(rt * 2 + h) * 32];
            unsigned bb[NT][4];
            float p0[NT], p1[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                codes_f16(cd[nt], sb[nt], bb[nt]); /* zeros past n */
                p0[nt] = e8m0_pow2(s0[nt]);
                p1[nt] = e8m0_pow2(s1[nt]);
            }
            codes(i + 1); /* the next block's, while this one multiplies */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int rt = 0; rt < MMV_RT; rt++) {
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma16816(c, a[rt][0].x, a[rt][1].x, a[rt][0].y, a[rt][1].y, bb[nt][0], bb[nt][1]);
                    mma16816(c, a[rt][0].z, a[rt][1].z, a[rt][0].w, a[rt][1].w, bb[nt][2], bb[nt][3]);
                    acc[rt][nt][0] = fmaf(c[0], p0[nt], acc[rt][nt][0]);
                    acc[rt][nt][1] = fmaf(c[1], p1[nt], acc[rt][nt][1]);
                    acc[rt][nt][2] = fmaf(c[2], p0[nt], acc[rt][nt][2]);
                    acc[rt][nt][3] = fmaf(c[3], p1[nt], acc[rt][nt][3]);
                }
            /* the stage read in the previous round (its values are in
             * that round's results) takes block i + MMV_STAGES - 1 */
            fill(i + MMV_STAGES - 1);
        }
        cp_wait<0>();
    }
    if (MMV_KSPLIT > 1) {
        /* parts 1.. hand their sums to part 0, which adds them in part
         * order; the ring's space: every warp's copies have landed (its
         * own wait), and the barrier orders its reads before these writes */
        float *part = (float *)smem; /* [warp][RT * NT * 4][32] */
        __syncthreads();
        if (p) {
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        part[((size_t)warp * MMV_RT * NT * 4 + (rt * NT + nt) * 4 + i) * 32 + lane] =
                            acc[rt][nt][i];
        }
        __syncthreads();
        if (p)
            return;
#pragma unroll
        for (int pp = 1; pp < MMV_KSPLIT; pp++)
#pragma unroll
            for (int rt = 0; rt < MMV_RT; rt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[rt][nt][i] +=
                            part[((size_t)(warp + pp) * MMV_RT * NT * 4 + (rt * NT + nt) * 4 + i) * 32 + lane];
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

#endif
