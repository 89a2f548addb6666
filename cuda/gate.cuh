/*
 * gate.cuh - the gate and update (SPEC.md section 8), fused, from kv:
 * the three sums of every stream in a fixed order, the gates, a check of
 * the outputs (by bounds, or of every one), then the update; a token is
 * written whole or not at all (a non-finite one is recorded in the layer's
 * status), masked tokens are not touched.
 *  - gate_kernel<PRE>: n <= 64, one token per cluster of 8 blocks, sums
 *    exchanged through distributed shared memory, launched as a
 *    programmatic dependent of the decode projection (PRE: the model's
 *    shapes, S <= 4 and W <= 8 GATE_PRE GATE_THREADS = 6144);
 *  - gate_block_kernel: n > 64, one block per token.
 * Both are kept small: at B = 1 the cluster kernel took 24 us (ncu) with
 * inlined ldexpf and integer divisions in its unrolled loops, 12 us without
 * them (our guess: instruction fetch on 8 cold SMs).
 */
#ifndef ENGRAM_CUDA_GATE_CUH
#define ENGRAM_CUDA_GATE_CUH

#include <cooperative_groups.h>

#include "common.cuh"

namespace cg = cooperative_groups;

#define GATE_THREADS 256

/* SPEC.md section 8's gate from a stream's three sums (D = sum x w k,
 * Sxx = sum x^2, Skk = sum k^2) at width W; NaN when a sum is not finite
 * (the token is then left untouched).  Both gate kernels call it. */
__device__ __forceinline__ float gate_of(float D, float Sxx, float Skk, int W)
{
    const float wf = (float)W, eps = 1e-6f;
    float dd = D * (1.0f / sqrtf(Sxx / wf + eps)) * (1.0f / sqrtf(Skk / wf + eps)) * (1.0f / sqrtf(wf));
    float z = copysignf(sqrtf(fmaxf(fabsf(dd), 1e-6f)), dd);
    float g = 1.0f / (1.0f + expf(-z));
    return isfinite(D) && isfinite(Sxx) && isfinite(Skk) ? g : __int_as_float(0x7fc00000);
}

/*
 * Gate and update, one token per cluster of GATE_CTAS blocks (Hopper
 * thread-block clusters; at B = 1 one block on one SM was issue-bound).
 * Block r of a cluster takes the columns [r w, (r+1) w) of every stream,
 * w = ceil(W / GATE_CTAS).  Streams go four at a time: each thread keeps the
 * three partial sums (x.q k, x.x, k.k) of each, the 12 are added by
 * xor-shuffle trees within warps and across the warps in warp 0; every
 * block then adds the blocks' sums in rank order through distributed shared
 * memory (the same order, so the same gates, in every block).  Outputs are
 * computed once into registers (PRE: GATE_PRE columns of every stream a
 * thread; otherwise twice, to check them and to write them), checked, and
 * written only if no block of the token found one non-finite: the token is
 * written whole or not at all.  Masked tokens: untouched.  Launched as a
 * programmatic dependent of the decode projection: PRE, x and q loaded (and
 * x.x summed) before the wait for kv, v with k after it.  The blocks'
 * verdicts travel with their sums (PRE): if every x and scaled v of the
 * token is below 2^126 in magnitude and the gates are finite, every output
 * is finite (|x + g v| < 2^127, 0 <= g <= 1) and the blocks write without a
 * second exchange; otherwise the check above.  Where the sums come in
 * chunks (gpart, W a multiple of 128: gate_with_parts below) the order is
 * another: x.x and the x bounds are exchanged before the wait, the other
 * sums and the v bounds are the chunks' (made by the projection, or by
 * the cluster after the wait), added in the same order in every block.
 */
#define GATE_CTAS 8

/* The cluster's verdict on a token: 1 if a thread of any of its GATE_CTAS
 * blocks found a non-finite output (bad: this thread's), after which the
 * token is recorded in status (the lowest index wins) and none of its
 * blocks may write it.  Every thread of every block calls it. */
__device__ __forceinline__ int cluster_any_bad(cg::cluster_group &cl, int *sbad, int bad, int rank,
                                               int *status, int token)
{
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0)
        *sbad = bad;
    cl.sync(); /* every block's verdict is in its shared memory */
    int any = 0;
    for (int r = 0; r < GATE_CTAS; r++)
        any |= *cl.map_shared_rank(sbad, r);
    cl.sync(); /* nobody reads another block's shared memory after this */
    if (any && rank == 0 && threadIdx.x == 0)
        atomicMin(status, token);
    return any;
}
#define GATE_GROUP 4
#ifndef GATE_PRE
#define GATE_PRE 3 /* columns per thread loaded before the wait for kv */
#endif

/* gate_kernel's phases, one function each, inlined into it (its column
 * loop stays in the kernel, unrolled by 2: inside a helper it compiled to
 * other instructions).  A block's share of a token: the columns
 * [lo, lo + cols) of each of the S streams of its residual xt (BF16 or
 * F32); kvt: the token's kv, v its values. */

/* 1 if this thread's column j of a block's share, lo + threadIdx.x +
 * j GATE_THREADS, is inside the share [lo, lo + cols) */
__device__ __forceinline__ bool gate_col_in(int j, int cols)
{
    return (int)threadIdx.x + j * GATE_THREADS < cols;
}

/* gate_kernel<true>'s elements (S <= GATE_GROUP, up to GATE_PRE columns
 * per thread: W <= 6144): x[j][s] and q[j][s] of stream s at column
 * lo + threadIdx.x + j GATE_THREADS (zeros outside the block's share),
 * which the projection does not write, loaded before the wait for kv, and
 * x.x summed in gate_sums_column's order (the same bits).  x is also the
 * update's: kept in registers until the write. */
__device__ __forceinline__ void gate_pre_load(const char *xt, int bf16, const float *wq, int W, int S, int lo,
                                              int cols, float (*x)[GATE_GROUP], float (*q)[GATE_GROUP],
                                              float *xx)
{
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++) {
        int i = lo + threadIdx.x + j * GATE_THREADS;
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++) {
            bool in = s < S && gate_col_in(j, cols);
            x[j][s] = in ? load_x(xt, bf16, s * W + i) : 0.0f;
            q[j][s] = in ? wq[(size_t)s * W + i] : 0.0f;
        }
    }
#pragma unroll
    for (int s = 0; s < GATE_GROUP; s++)
        xx[s] = 0.0f;
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++)
            if (s < S && gate_col_in(j, cols))
                xx[s] = fmaf(x[j][s], x[j][s], xx[s]);
}

/* This thread's partial sums of streams 0 .. GATE_GROUP - 1 (with pre:
 * S <= GATE_GROUP, one group) into p[3 s + j], j = 0 x.q k, 1 x.x, 2 k.k
 * (k: kv x 2^ks rounded to BF16), column by column, from what
 * gate_pre_load kept (x.x already summed). */
__device__ __forceinline__ void gate_sums_pre(float *p, const float *kvt, int ks, int W, int S, int lo,
                                              int cols, float (*px)[GATE_GROUP], float (*pq)[GATE_GROUP],
                                              const float *pxx)
{
    float kr[GATE_PRE][GATE_GROUP];
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++) /* every load first: one latency */
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++) {
            int i = lo + threadIdx.x + j * GATE_THREADS;
            kr[j][s] = s < S && gate_col_in(j, cols) ? kvt[(size_t)s * W + i] : 0.0f;
        }
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++)
            if (s < S && gate_col_in(j, cols)) {
                float k = bf16r(pow2scale(kr[j][s], ks));
                p[3 * s] = fmaf(px[j][s] * pq[j][s], k, p[3 * s]);
                p[3 * s + 2] = fmaf(k, k, p[3 * s + 2]);
            }
#pragma unroll
    for (int s = 0; s < GATE_GROUP; s++)
        p[3 * s + 1] = pxx[s];
}

/* This thread's partial sums as gate_sums_pre's, at column i, for the ns
 * streams from s0 on (any S), everything loaded here. */
__device__ __forceinline__ void gate_sums_column(float *p, int i, int s0, int ns, const char *xt, int bf16,
                                                 const float *wq, const float *kvt, int ks, int W)
{
    float xv[GATE_GROUP], qv[GATE_GROUP], kr[GATE_GROUP];
#pragma unroll
    for (int s = 0; s < GATE_GROUP; s++) /* every load first: one latency */
        if (s < ns) {
            size_t o = (size_t)(s0 + s) * W + i;
            xv[s] = load_x(xt, bf16, (int)o);
            qv[s] = wq[o];
            kr[s] = kvt[o];
        }
#pragma unroll
    for (int s = 0; s < GATE_GROUP; s++)
        if (s < ns) {
            float xi = xv[s], k = bf16r(pow2scale(kr[s], ks));
            p[3 * s] = fmaf(xi * qv[s], k, p[3 * s]);
            p[3 * s + 1] = fmaf(xi, xi, p[3 * s + 1]);
            p[3 * s + 2] = fmaf(k, k, p[3 * s + 2]);
        }
}

/* The block's sums of the group: p added by xor-shuffle trees within warps,
 * the warps' sums (through sh) by one in warp 0, into part[3 s0 ..]. */
__device__ __forceinline__ void gate_block_sums(float *p, float (*sh)[3 * GATE_GROUP], float *part, int s0,
                                                int S, int warp, int lane)
{
#pragma unroll
    for (int q = 0; q < 3 * GATE_GROUP; q++)
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1)
            p[q] += __shfl_xor_sync(0xffffffffu, p[q], off);
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < 3 * GATE_GROUP; q++)
            sh[warp][q] = p[q];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int q = 0; q < 3 * GATE_GROUP; q++) {
            float u = lane < GATE_THREADS / 32 ? sh[lane][q] : 0.0f;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                u += __shfl_xor_sync(0xffffffffu, u, off);
            if (lane == q && 3 * s0 + q < 3 * S)
                part[3 * s0 + q] = u;
        }
    }
    __syncthreads();
}

/* The cluster's gates, the same in every block: each block's sums (part)
 * and verdict (ok, this thread's: every kept x and v below 2^126) go
 * through distributed shared memory (sok); tot: the blocks' sums added in
 * rank order, allok: every block's verdict, gs: the S gates.  The cluster
 * barrier is arrived at here and waited on before the block exits. */
__device__ __forceinline__ void gate_exchange(cg::cluster_group &cl, int ok, float *part, int *sok,
                                              int *allok, float *tot, float *gs, int W, int S)
{
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0)
        *sok = ok;
    cl.sync(); /* every block's sums and verdict are in its shared memory */
    if (threadIdx.x < 3 * S) {
        float u = 0.0f;
        for (int r = 0; r < GATE_CTAS; r++)
            u += *cl.map_shared_rank(&part[threadIdx.x], r);
        tot[threadIdx.x] = u;
    } else if (threadIdx.x == 32 * ((3 * S + 31) / 32)) { /* the first warp past the sums' */
        int a = 1;
        for (int r = 0; r < GATE_CTAS; r++)
            a &= *cl.map_shared_rank(sok, r);
        *allok = a;
    }
    /* done with the other blocks' shared memory: none may exit before all
     * have arrived here (waited for below, on every path) */
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();
    if (threadIdx.x < S)
        gs[threadIdx.x] = gate_of(tot[3 * threadIdx.x], tot[3 * threadIdx.x + 1], tot[3 * threadIdx.x + 2], W);
    __syncthreads();
}

/* gate_kernel<false>'s update: each output computed twice, x and v read
 * again, to check it and then to write it. */
__device__ __forceinline__ void gate_write_strided(cg::cluster_group &cl, char *xt, int bf16, const float *v,
                                                   int ks, int W, int lo, int cols, int total,
                                                   const float *gs, int *sbad, int rank, int *status,
                                                   int token_base, int t)
{
    int bad = 0;
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    for (int e = threadIdx.x; e < total; e += GATE_THREADS) {
        int se = e / cols, ie = lo + e - se * cols;
        bad |= !isfinite(bf16r(fmaf(gs[se], bf16r(pow2scale(v[ie], ks)), load_x(xt, bf16, se * W + ie))));
    }
    if (cluster_any_bad(cl, sbad, bad, rank, status, token_base + t))
        return;
    for (int e = threadIdx.x; e < total; e += GATE_THREADS) {
        int se = e / cols, ie = lo + e - se * cols;
        float yy = bf16r(fmaf(gs[se], bf16r(pow2scale(v[ie], ks)), load_x(xt, bf16, se * W + ie)));
        if (bf16)
            ((unsigned short *)xt)[se * W + ie] = (unsigned short)(__float_as_uint(yy) >> 16);
        else
            ((float *)xt)[se * W + ie] = yy;
    }
}

/* gate_kernel<true>'s update: y = x + g v of its kept elements (x: x[j][s],
 * v: vs[j], the column's scaled value), written at once when safe (finite
 * by the bounds: the other blocks are waited for only before leaving), else
 * after the cluster's verdict (cluster_any_bad), and not at all if a block
 * found one non-finite. */
__device__ __forceinline__ void gate_write_pre(cg::cluster_group &cl, int safe, char *xt, int bf16, int W,
                                               int S, int lo, int cols, float (*x)[GATE_GROUP],
                                               const float *vs, const float *gs, int *sbad, int rank,
                                               int *status, int token_base, int t)
{
    int bad = 0;
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++)
            if (s < S && gate_col_in(j, cols)) {
                x[j][s] = bf16r(fmaf(gs[s], vs[j], x[j][s]));
                bad |= !isfinite(x[j][s]);
            }
    if (!safe) {
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        if (cluster_any_bad(cl, sbad, bad, rank, status, token_base + t))
            return;
    }
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
#pragma unroll
        for (int s = 0; s < GATE_GROUP; s++) {
            int i = lo + threadIdx.x + j * GATE_THREADS;
            if (s < S && gate_col_in(j, cols)) {
                if (bf16)
                    ((unsigned short *)xt)[s * W + i] = (unsigned short)(__float_as_uint(x[j][s]) >> 16);
                else
                    ((float *)xt)[s * W + i] = x[j][s];
            }
        }
    if (safe)
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* One chunk's sums (ws_gemm.cuh's wsd_gate order) by one warp, lane L as
 * the thread (warp L / 8, quad L % 8) of wsd_kernel's D fragments: its four
 * outputs o_m = wsd_out(ob, L / 8, L % 8, m / 2, m % 2) of the chunk at ob
 * (gate_chunk_o), whose x q (gate_chunk_xq: from the residual xt and the
 * norms wq, 0 outside k) and F32 kv (r, x 2^-ks) are added as wsd_part_own
 * does, then an xor tree over the lanes (1, 2, 4: the quads; 8, 16: the
 * warps, (0 + 1) + (2 + 3)): wsd_gate_parts' bits, in every lane
 * (gate_chunk_tree). */
__device__ __forceinline__ int gate_chunk_o(int ob, int lane, int m)
{
    return wsd_out(ob, lane >> 3, lane & 7, m >> 1, m & 1);
}

__device__ __forceinline__ void gate_chunk_xq(int ob, int lane, const char *xt, int bf16, const float *wq, int SW,
                                              float *x4)
{
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int o = gate_chunk_o(ob, lane, m);
        x4[m] = wsd_xq_at(xt, bf16, wq, SW, 0, o);
    }
}

__device__ __forceinline__ void gate_chunk_tree(const float *r, const float *x4, int ks, float &d, float &kk,
                                                int &ok)
{
    wsd_part_own(r, x4, ks, d, kk, ok);
#pragma unroll
    for (int off = 1; off <= 16; off <<= 1) {
        d += __shfl_xor_sync(0xffffffffu, d, off);
        kk += __shfl_xor_sync(0xffffffffu, kk, off);
        ok &= __shfl_xor_sync(0xffffffffu, ok, off);
    }
}

/* gate_kernel<true> with wsd_kernel's sums (ws_gemm.cuh's wsd_gate; gpart
 * [n][N / 128][2], W a multiple of 128), or self: the same sums made here
 * first (gate_chunk_xq before the wait, kv and gate_chunk_tree after it;
 * the other projections, and wsd_kernel's widest box, where they cost more
 * in its epilogue than here: runs 63-65): x.x and the x bounds exchanged
 * through the cluster before the wait for the projection, as x.x is today
 * (the same bits), so that after it a block loads only the token's chunk
 * sums (a warp a stream: chunk c and c + 32 of each lane added, then an
 * xor tree; the same in every block) and its columns' v, and writes.  The
 * cluster is waited on again only where a bound fails (cluster_any_bad). */
__device__ __forceinline__ void gate_with_parts(cg::cluster_group &cl, float *gpart, int self, const float *wq,
                                                int t, const float *kvt,
                                                const int *kshift, char *xt, int bf16, int W, int S, int lo,
                                                int cols, float (*x)[GATE_GROUP], const float *xx,
                                                float (*sh)[3 * GATE_GROUP], float *part, int *sok, int *allok,
                                                float *tot, float *gs, int *sbad, int rank, int *status,
                                                int token_base, int warp, int lane)
{
    float p[3 * GATE_GROUP];
#pragma unroll
    for (int k = 0; k < GATE_GROUP; k++)
        p[3 * k] = 0.0f, p[3 * k + 1] = xx[k], p[3 * k + 2] = 0.0f;
    gate_block_sums(p, sh, part, 0, S, warp, lane);
    int ok = 1;
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
        if (gate_col_in(j, cols))
#pragma unroll
            for (int s = 0; s < GATE_GROUP; s++)
                ok &= s >= S || fabsf(x[j][s]) < 0x1p126f;
    /* self: the cluster's 64 warps make the token's chunk sums, chunk c0 +
     * i STEP by warp c0; their x q (the residual's and the norms', not the
     * projection's) loaded before the wait, kv after it, all at once */
    constexpr int MAXC = 4, STEP = GATE_CTAS * (GATE_THREADS / 32);
    static_assert((GATE_GROUP + 1) * (GATE_PRE * GATE_THREADS * GATE_CTAS / 128) <= MAXC * STEP,
                  "(S + 1) W / 128 chunks for PRE's S and W");
    const int nc = W / 128, nch = (S + 1) * nc, SW = S * W, c0 = rank * (GATE_THREADS / 32) + warp;
    float xq[MAXC][4];
    if (self)
#pragma unroll
        for (int i = 0; i < MAXC; i++)
            if (c0 + i * STEP < nch)
                gate_chunk_xq((c0 + i * STEP) * 128, lane, xt, bf16, wq, SW, xq[i]);
    gate_exchange(cl, ok, part, sok, allok, tot, gs, W, S); /* tot[3 s + 1]: x.x */
    pdl_wait(); /* kv and the sums: the projection's */
    EG_MARK(7);
    const int ks = kshift ? kshift[t] : 0;
    if (self) {
        /* into gpart; the exchange's barrier completed, then another:
         * every block's sums written (release, acquire: read below
         * through L2) */
        float r[MAXC][4];
#pragma unroll
        for (int i = 0; i < MAXC; i++)
            if (c0 + i * STEP < nch)
#pragma unroll
                for (int m = 0; m < 4; m++)
                    r[i][m] = kvt[gate_chunk_o((c0 + i * STEP) * 128, lane, m)];
#pragma unroll
        for (int i = 0; i < MAXC; i++) {
            const int ch = c0 + i * STEP;
            if (ch >= nch)
                break;
            float d, kk;
            int ok;
            gate_chunk_tree(r[i], xq[i], ks, d, kk, ok);
            if (lane == 0) {
                float *p = gpart + ((size_t)t * nch + ch) * 2;
                p[0] = ch * 128 < SW ? d : (float)ok;
                p[1] = ch * 128 < SW ? kk : 0.0f;
            }
        }
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        asm volatile("barrier.cluster.arrive.aligned;" ::: "memory"); /* waited on in gate_write_pre */
    }
    const float *v = kvt + (size_t)S * W;
    float vs[GATE_PRE];
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++) {
        int i = lo + threadIdx.x + j * GATE_THREADS;
        vs[j] = gate_col_in(j, cols) ? v[i] : 0.0f;
    }
    __shared__ int vok;
    const float *pt = gpart + (size_t)t * (S + 1) * nc * 2;
    if (warp <= S) {
        const float2 *q = (const float2 *)(pt + (size_t)warp * nc * 2);
        float2 a = lane < nc ? __ldcg(q + lane) : make_float2(0.0f, 0.0f),
               b = lane + 32 < nc ? __ldcg(q + lane + 32) : make_float2(0.0f, 0.0f);
        if (warp < S) {
            float d = a.x + b.x, kk = a.y + b.y;
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) {
                d += __shfl_xor_sync(0xffffffffu, d, off);
                kk += __shfl_xor_sync(0xffffffffu, kk, off);
            }
            if (lane == 0)
                gs[warp] = gate_of(d, tot[3 * warp + 1], kk, W);
        } else { /* v's chunks: every value within the bound */
            int good = __all_sync(0xffffffffu, (lane >= nc || a.x != 0.0f) && (lane + 32 >= nc || b.x != 0.0f));
            if (lane == 0)
                vok = good;
        }
    }
    __syncthreads();
    EG_MARK(8);
    int safe = *allok && vok; /* the cluster's: every block takes the same branch */
    for (int s = 0; s < S; s++)
        safe &= isfinite(gs[s]);
#pragma unroll
    for (int j = 0; j < GATE_PRE; j++)
        vs[j] = bf16r(pow2scale(vs[j], ks));
    EG_MARK(9);
    gate_write_pre(cl, safe, xt, bf16, W, S, lo, cols, x, vs, gs, sbad, rank, status, token_base, t);
    EG_MARK(10);
}

/* PRE (gate_pre(W, S): S <= GATE_GROUP and W <= 8 GATE_PRE GATE_THREADS,
 * the model's 4 x 5120): each thread's elements sit at GATE_PRE columns of
 * every stream, x and q loaded before the wait for kv and x kept for the
 * update, the column's v loaded once for its S elements: 3 blocks an SM
 * (GATE_PRE_MINB; no spills), so that 32 tokens' 256 blocks are one wave
 * (kept stream-major, as before, they took 128 registers, 2 blocks an SM,
 * and the gate of 16 to 64 tokens grew by 0.3 us a token).  Otherwise
 * (W > 6144 or S > 4: no model we know) every element is read twice.  The
 * sums and outputs are the same bits either way (without gpart: with it
 * the sums are the chunks', PRE only). */
#ifndef GATE_PRE_MINB
#define GATE_PRE_MINB 3
#endif
static inline int gate_pre(int W, int S)
{
    return S <= GATE_GROUP && (W + GATE_CTAS - 1) / GATE_CTAS <= GATE_PRE * GATE_THREADS;
}

template <bool PRE>
__global__ void __cluster_dims__(GATE_CTAS, 1, 1) __launch_bounds__(GATE_THREADS, PRE ? GATE_PRE_MINB : 1)
gate_kernel(const float *__restrict__ kv, int ldkv, const float *__restrict__ wq, void *resid,
            int bf16, const uint8_t *mask, int W, int S, int *status, int token_base,
            const int *d_step, size_t resid_step, const int *kshift, float *gpart, int self)
{
    EG_STAMP(6);
    cg::cluster_group cl = cg::this_cluster();
    const int t = blockIdx.x / GATE_CTAS, rank = (int)cl.block_rank();
    if (mask && !mask[t]) {
        /* the whole cluster; not before the projection has finished, so
         * that no grid of this call outlives the gate's (the next call's
         * kernels reuse the workspace, and wsd_kernel reads the rows, the
         * step index and decode16_kernel's flags until its end) */
        pdl_wait();
        return;
    }
    if (d_step)
        resid = (char *)resid + (size_t)(*d_step) * resid_step;
    __shared__ float sh[GATE_THREADS / 32][3 * GATE_GROUP];
    __shared__ float part[3 * ENGRAM_MAX_STREAMS]; /* this block's sums  */
    __shared__ float gs[ENGRAM_MAX_STREAMS];
    __shared__ int sbad, sok, allok;
    __shared__ float tot[3 * ENGRAM_MAX_STREAMS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int span = (W + GATE_CTAS - 1) / GATE_CTAS, lo = min(W, rank * span),
              cols = min(W, lo + span) - lo;
    const float *kvt = kv + (size_t)t * ldkv, *v = kvt + (size_t)S * W;
    size_t es = bf16 ? 2 : 4;
    char *xt = (char *)resid + (size_t)t * S * W * es;
    if constexpr (PRE) {
        float x[GATE_PRE][GATE_GROUP], q[GATE_PRE][GATE_GROUP], xx[GATE_GROUP];
        gate_pre_load(xt, bf16, wq, W, S, lo, cols, x, q, xx);
        if (gpart) {
            gate_with_parts(cl, gpart, self, wq, t, kvt, kshift, xt, bf16, W, S, lo, cols, x, xx, sh, part, &sok,
                            &allok, tot,
                            gs, &sbad, rank, status, token_base, warp, lane);
            return;
        }
        pdl_wait(); /* kv: the projection's */
        EG_MARK(7);
        /* kv rows of the F16 paths are kv * 2^-ks; kshift is written by
         * decode16_kernel, before the projection's grid (which waited for
         * it): read after the wait like kv */
        const int ks = kshift ? kshift[t] : 0;
        /* the columns' v, loaded with the sums' k: one latency */
        float vs[GATE_PRE];
#pragma unroll
        for (int j = 0; j < GATE_PRE; j++) {
            int i = lo + threadIdx.x + j * GATE_THREADS;
            vs[j] = gate_col_in(j, cols) ? v[i] : 0.0f;
        }
        float p[3 * GATE_GROUP];
#pragma unroll
        for (int k = 0; k < 3 * GATE_GROUP; k++)
            p[k] = 0.0f;
        gate_sums_pre(p, kvt, ks, W, S, lo, cols, x, q, xx);
        gate_block_sums(p, sh, part, 0, S, warp, lane);
        EG_MARK(8);
        /* ok: every x and scaled v of this thread below 2^126 in magnitude
         * (and not NaN), so that y = x + g v, 0 <= g <= 1, is finite in F32
         * and in BF16 */
        int ok = 1;
#pragma unroll
        for (int j = 0; j < GATE_PRE; j++) {
            vs[j] = bf16r(pow2scale(vs[j], ks));
            if (gate_col_in(j, cols)) {
                ok &= fabsf(vs[j]) < 0x1p126f;
#pragma unroll
                for (int s = 0; s < GATE_GROUP; s++)
                    ok &= s >= S || fabsf(x[j][s]) < 0x1p126f;
            }
        }
        gate_exchange(cl, ok, part, &sok, &allok, tot, gs, W, S);
        EG_MARK(9);
        int safe = allok; /* the cluster's: every block takes the same branch */
        for (int s = 0; s < S; s++)
            safe &= isfinite(gs[s]);
        gate_write_pre(cl, safe, xt, bf16, W, S, lo, cols, x, vs, gs, &sbad, rank, status, token_base, t);
        EG_MARK(10);
    } else {
        pdl_wait(); /* kv: the projection's */
        const int ks = kshift ? kshift[t] : 0; /* as above */
        for (int s0 = 0; s0 < S; s0 += GATE_GROUP) {
            float p[3 * GATE_GROUP];
#pragma unroll
            for (int k = 0; k < 3 * GATE_GROUP; k++)
                p[k] = 0.0f;
            const int ns = min(GATE_GROUP, S - s0);
            /* the loop here, not in the helper: see above */
#pragma unroll 2
            for (int i = lo + threadIdx.x; i < lo + cols; i += GATE_THREADS)
                gate_sums_column(p, i, s0, ns, xt, bf16, wq, kvt, ks, W);
            gate_block_sums(p, sh, part, s0, S, warp, lane);
        }
        /* no bounds checked: the outputs are, before any is written */
        gate_exchange(cl, 0, part, &sok, &allok, tot, gs, W, S);
        gate_write_strided(cl, xt, bf16, v, ks, W, lo, cols, S * cols, gs, &sbad, rank, status, token_base,
                           t);
    }
}

/*
 * Gate and update for n > ENGRAM_CUDA_GEMV_MAX tokens: one block of
 * GATEB_THREADS per token (many tokens keep every SM busy; the cluster
 * kernel's synchronisation would cost more than it saves).  Each stream's
 * columns go in chunks of 8 (the last one short when 8 does not divide W);
 * thread j takes the chunks j, j + GATEB_THREADS, ...  V16: 16-byte loads
 * (W a multiple of 8, the residual 16-byte aligned), else element by
 * element, in the same order: the same bits either way.  The 3 S sums of
 * all streams in one fixed-order block reduction (per thread in column
 * order, xor trees in warps, then the warps' sums in index order), the
 * gates, then the update: written whole or not at all.  The first pass also
 * loads v and checks every x and v against 2^126: if all are below and the
 * gates finite, every output is finite (|x + g v| < 2^127, 0 <= g <= 1) and
 * the token is written at once; otherwise a check pass over the token
 * comes first.
 * KEEP (S <= GATEB_KS, at most GATEB_KC chunks a thread: W <= 5120): this
 * thread's x and v stay in registers from the first pass to the update, so
 * the token's x is read from memory once (re-read, it had been evicted from
 * L2 by the tokens in flight: 2048 tokens, F32 residual, 163 us on the
 * H200 against 150 kept).
 */
#define GATEB_THREADS 320
#define GATEB_WARPS (GATEB_THREADS / 32)
#define GATEB_BIG 8.5070592e37f /* 2^126 */
#define GATEB_KS 4
#define GATEB_KC 2
#ifndef GATEB_MINB
#define GATEB_MINB 2 /* blocks an SM at least: 102 registers, a few spilled (1: 126, 205 us) */
#endif

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The lim (<= 8) values from i on into o[0..lim) (the rest 0); V16: lim is
 * 8 and p + i 16-byte aligned. */
template <bool V16> __device__ __forceinline__ void ld_f32(const float *p, size_t i, int lim, float *o)
{
    if (V16) {
        float4 a = __ldg((const float4 *)(p + i)), b = __ldg((const float4 *)(p + i) + 1);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < lim ? p[i + e] : 0.0f;
    }
}

template <bool V16>
__device__ __forceinline__ void ld_bf16(const unsigned short *p, size_t i, int lim, float *o)
{
    if (V16) {
        uint4 a = *(const uint4 *)(p + i);
        unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            o[2 * q] = __uint_as_float(w[q] << 16);
            o[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[e] = e < lim ? __uint_as_float((unsigned)p[i + e] << 16) : 0.0f;
    }
}

/* keys or values as the gate takes them: BF16(kv x 2^ks) from F32 kv, or as
 * stored (BF16 kv, already scaled and rounded: the same values) */
template <bool V16>
__device__ __forceinline__ void ld_kv(const float *kv, size_t i, int lim, int ks, float *o)
{
    ld_f32<V16>(kv, i, lim, o);
#pragma unroll
    for (int e = 0; e < 8; e++)
        o[e] = bf16r(pow2scale(o[e], ks));
}

template <bool V16>
__device__ __forceinline__ void ld_kv(const unsigned short *kv, size_t i, int lim, int, float *o)
{
    ld_bf16<V16>(kv, i, lim, o);
}

template <bool V16> __device__ __forceinline__ void ld_x(const void *x, int bf16, size_t i, int lim, float *o)
{
    if (bf16)
        ld_bf16<V16>((const unsigned short *)x, i, lim, o);
    else
        ld_f32<V16>((const float *)x, i, lim, o);
}

template <bool V16> __device__ __forceinline__ void st_x(void *x, int bf16, size_t i, int lim, const float *y)
{
    if (bf16) {
        unsigned short *p = (unsigned short *)x + i;
        if (V16) {
            unsigned w[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                w[q] = (__float_as_uint(y[2 * q]) >> 16) | (__float_as_uint(y[2 * q + 1]) & 0xffff0000u);
            *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < lim)
                    p[e] = (unsigned short)(__float_as_uint(y[e]) >> 16);
        }
    } else {
        float *p = (float *)x + i;
        if (V16) {
            ((float4 *)p)[0] = make_float4(y[0], y[1], y[2], y[3]);
            ((float4 *)p)[1] = make_float4(y[4], y[5], y[6], y[7]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < lim)
                    p[e] = y[e];
        }
    }
}

template <typename KV, bool V16, bool KEEP>
__global__ void __launch_bounds__(GATEB_THREADS, GATEB_MINB)
gate_block_kernel(const KV *__restrict__ kv, int ldkv, const float *__restrict__ wq, void *resid,
                  int bf16, const uint8_t *mask, int W, int S, int *status, int token_base,
                  const int *kshift)
{
    EG_STAMP(3);
    int t = blockIdx.x;
    int ks = kshift ? kshift[t] : 0;
    if (mask && !mask[t])
        return;
    /* warp w's sums of stream s: part[(3 s + j) * GATEB_WARPS + w], j = 0 d, 1 xx, 2 kk */
    __shared__ float part[3 * ENGRAM_MAX_STREAMS * GATEB_WARPS];
    __shared__ float gs[ENGRAM_MAX_STREAMS];
    const KV *kvt = kv + (size_t)t * ldkv, *v = kvt + (size_t)S * W;
    size_t es = bf16 ? 2 : 4;
    char *xt = (char *)resid + (size_t)t * S * W * es;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = (W + 7) / 8;
    int small = 1; /* every x and v this thread loads is below 2^126 */
    float xk[KEEP ? GATEB_KS * GATEB_KC : 1][8], vk[KEEP ? GATEB_KC : 1][8];
#pragma unroll
    for (int s = 0; s < (KEEP ? GATEB_KS : ENGRAM_MAX_STREAMS); s++) {
        if (s >= S)
            break;
        const void *x = xt + (size_t)s * W * es;
        float d = 0.0f, sx = 0.0f, sk = 0.0f;
#pragma unroll
        for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
            int c = threadIdx.x + j * GATEB_THREADS;
            if (c >= chunks)
                break;
            int lim = V16 ? 8 : min(8, W - 8 * c);
            float xtmp[8], q[8], k[8];
            float *xi = KEEP ? xk[s * GATEB_KC + j] : xtmp;
            ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
            ld_f32<V16>(wq, (size_t)s * W + (size_t)c * 8, lim, q);
            ld_kv<V16>(kvt, (size_t)s * W + (size_t)c * 8, lim, ks, k);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (e >= lim)
                    break;
                d = fmaf(xi[e] * q[e], k[e], d);
                sx = fmaf(xi[e], xi[e], sx);
                sk = fmaf(k[e], k[e], sk);
                small &= fabsf(xi[e]) < GATEB_BIG;
            }
        }
        d = warp_sum(d);
        sx = warp_sum(sx);
        sk = warp_sum(sk);
        if (lane == 0) {
            part[(3 * s + 0) * GATEB_WARPS + warp] = d;
            part[(3 * s + 1) * GATEB_WARPS + warp] = sx;
            part[(3 * s + 2) * GATEB_WARPS + warp] = sk;
        }
    }
#pragma unroll
    for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
        int c = threadIdx.x + j * GATEB_THREADS;
        if (c >= chunks)
            break;
        int lim = V16 ? 8 : min(8, W - 8 * c);
        float vtmp[8];
        float *vv = KEEP ? vk[j] : vtmp;
        ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            small &= fabsf(vv[e]) < GATEB_BIG; /* 0 past lim */
    }
    small = __syncthreads_and(small); /* also: every part[] is written */
    if (threadIdx.x < (unsigned)S) {
        int s = threadIdx.x;
        float sum[3];
        for (int j = 0; j < 3; j++) {
            const float *p = part + (3 * s + j) * GATEB_WARPS;
            float a = p[0];
            for (int q = 1; q < GATEB_WARPS; q++)
                a += p[q];
            sum[j] = a;
        }
        gs[s] = gate_of(sum[0], sum[1], sum[2], W);
    }
    __syncthreads();
    int gok = 1;
    for (int s = 0; s < S; s++)
        gok &= isfinite(gs[s]);
    if (!(small && gok)) { /* the check pass: any non-finite output, and none is written */
        int bad = 0;
        for (int s = 0; s < S; s++) {
            const void *x = xt + (size_t)s * W * es;
            for (int c = threadIdx.x; c < chunks; c += GATEB_THREADS) {
                int lim = V16 ? 8 : min(8, W - 8 * c);
                float xi[8], vv[8];
                ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
                ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    bad |= !isfinite(bf16r(fmaf(gs[s], vv[e], xi[e]))); /* 0 past lim */
            }
        }
        if (__syncthreads_or(bad)) {
            if (threadIdx.x == 0)
                atomicMin(status, token_base + t);
            return;
        }
    }
#pragma unroll
    for (int j = 0; KEEP ? j < GATEB_KC : 1; j++) {
        int c = threadIdx.x + j * GATEB_THREADS;
        if (c >= chunks)
            break;
        int lim = V16 ? 8 : min(8, W - 8 * c);
        float vtmp[8];
        float *vv = KEEP ? vk[j] : vtmp;
        if (!KEEP)
            ld_kv<V16>(v, (size_t)c * 8, lim, ks, vv);
#pragma unroll
        for (int s = 0; s < (KEEP ? GATEB_KS : ENGRAM_MAX_STREAMS); s++) {
            if (s >= S)
                break;
            void *x = xt + (size_t)s * W * es;
            float xtmp[8], y[8];
            float *xi = KEEP ? xk[s * GATEB_KC + j] : xtmp;
            if (!KEEP)
                ld_x<V16>(x, bf16, (size_t)c * 8, lim, xi);
#pragma unroll
            for (int e = 0; e < 8; e++)
                y[e] = bf16r(fmaf(gs[s], vv[e], xi[e]));
            st_x<V16>(x, bf16, (size_t)c * 8, lim, y);
        }
    }
}

#endif
