/*
 * tc_gemm.cuh - the projection of n > 8 tokens on the tensor cores with F32
 * promotion (included by engram_cuda.cu; wgmma: sm_90a machine code).
 *
 * kv[t][o] = sum_i e16[t][i] * w[o][i] for t < n, o < N, i < K = 6144, both
 * operands F16 with K contiguous, kv F32 [n][N].  A CTA of two warpgroups
 * owns 128 tokens x TC_BN outputs; K goes in tiles of 64 through a
 * TC_STAGES-deep cp.async pipeline (TC_AHEAD tiles loading ahead) into
 * shared memory laid out with the 128-byte swizzle that wgmma's descriptors
 * name (rows past n or N are zero-filled, their outputs not written; whole
 * tiles are loaded without the zero-fill operand).  Per tile each
 * warpgroup issues four wgmma.m64nNk16; TC_PROM tiles (256 products with
 * the default 4) accumulate in the tensor cores into a partial sum (its
 * first wgmma with scale-d = 0), which is then added to the running F32
 * sums with ordinary F32 adds (rounded to nearest): the tensor cores' own
 * accumulation, which rounds less carefully than F32 FMAs, never spans
 * more than 256 products (DeepSeek's DeepGEMM promotes FP8 sums likewise,
 * every 128).  With TC_PROM < TC_CH two partial sums alternate, the
 * previous one added while the tensor cores work on the next; chunks of
 * TC_CH tiles are written out straight (ptxas serializes every wgmma when
 * one is in flight across a loop's back edge), each ending with a full
 * wait.  Measured on the H200 (bench/results/2026-12-01-cuda/prom256/variants.txt):
 * promoting every 256 products with one partial set (192 registers) is the
 * fastest, ahead of two alternating sets every 64 or 128 (239-255
 * registers), and its error stays within 2.6e-4 of the F32 bound gamma_K.
 * Consecutive CTAs share a tile of weights (read once from memory, then from
 * L2).
 */
#define TC_BM 128
#ifndef TC_BN
#define TC_BN 128 /* 128 (192 needs 288 accumulator registers with two partial sets) */
#endif
#define TC_ACC (TC_BN / 2) /* accumulator registers per thread */
#ifndef TC_BK
#define TC_BK 64
#endif
#ifndef TC_STAGES
#define TC_STAGES 4
#endif
#define TC_THREADS 256
#ifndef TC_FULLFAST
#define TC_FULLFAST 1 /* whole tiles loaded without the zero-fill operand */
#endif
#ifndef TC_PROM
#define TC_PROM 4 /* tiles summed by the tensor cores between promotions (divides TC_CH) */
#endif
#define TC_STAGE_BYTES ((TC_BM + TC_BN) * TC_BK * 2)
#define TC_SMEM (TC_STAGES * TC_STAGE_BYTES + 1024)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_WGMMA 1
#endif

__device__ __forceinline__ uint64_t tc_desc(uint32_t saddr)
{
    uint64_t d = (uint64_t)((saddr & 0x3FFFFu) >> 4);
    d |= (uint64_t)1 << 16;           /* leading byte offset (unused with the swizzle) */
    d |= (uint64_t)(1024 >> 4) << 32; /* stride byte offset: 8 rows of 128 bytes */
    d |= (uint64_t)1 << 62;           /* 128-byte swizzle */
    return d;
}

__device__ __forceinline__ void tc_wgmma(float *d, uint64_t da, uint64_t db, int scale_d)
{
#ifdef TC_WGMMA
#if TC_BN == 128
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
#else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
#endif
#endif
}

__device__ __forceinline__ void tc_cp16(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

/* ROWS rows (first .. first+ROWS-1, zero-filled from limit on) of a K-major
 * F16 matrix, k-tile kt, into shared memory at dst as sub-tiles of
 * [ROWS][64]: sub-tile j at j * ROWS * 128, 16-byte chunk c of row r at
 * r * 128 + ((c ^ (r & 7)) << 4) in it. */
template <int ROWS>
__device__ __forceinline__ void tc_load_rows(uint32_t dst, const uint16_t *src, int first, int limit,
                                             int kt)
{
#if TC_FULLFAST
    if (first + ROWS <= limit) { /* a whole tile (uniform per CTA): no zero fill */
#pragma unroll
        for (int q = 0; q < ROWS * TC_BK / 8 / TC_THREADS; q++) {
            int id = threadIdx.x + q * TC_THREADS, c = id & 7, r = (id >> 3) % ROWS, sub = (id >> 3) / ROWS;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                             dst + sub * (ROWS * 128) + r * 128 + ((c ^ (r & 7)) << 4)),
                         "l"(src + (size_t)(first + r) * K + kt * TC_BK + sub * 64 + c * 8));
        }
        return;
    }
#endif
#pragma unroll
    for (int q = 0; q < ROWS * TC_BK / 8 / TC_THREADS; q++) {
        int id = threadIdx.x + q * TC_THREADS, c = id & 7, r = (id >> 3) % ROWS, sub = (id >> 3) / ROWS;
        int row = first + r;
        tc_cp16(dst + sub * (ROWS * 128) + r * 128 + ((c ^ (r & 7)) << 4),
                src + (size_t)(row < limit ? row : 0) * K + kt * TC_BK + sub * 64 + c * 8,
                row < limit ? 16 : 0);
    }
}

__device__ __forceinline__ void tc_load(uint32_t sbase, int s, int kt, const __half *e16,
                                        const uint16_t *w, int m0, int n0, int n, int N)
{
    uint32_t sa = sbase + s * TC_STAGE_BYTES, sb = sa + TC_BM * TC_BK * 2;
    tc_load_rows<TC_BM>(sa, (const uint16_t *)e16, m0, n, kt); /* tokens */
    tc_load_rows<TC_BN>(sb, w, n0, N, kt);                      /* weights */
    asm volatile("cp.async.commit_group;\n" ::);
}

#ifndef TC_CH
#define TC_CH 4 /* tiles per straight-line chunk (divides K / TC_BK; 6 and 8 spill) */
#endif
#define TC_AHEAD (TC_STAGES - 2) /* tiles loading ahead of the one multiplied */
static_assert(TC_CH % TC_PROM == 0, "a chunk holds whole partial sums");
/* keeps the compiler from moving reads of r across the waits before it */
__device__ __forceinline__ void tc_fence(float *r)
{
#pragma unroll
    for (int i = 0; i < TC_ACC; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}
/* issues tile kt's four wgmma (one group) into d, the first with scale-d 0
 * when fresh (a new partial sum), else all adding to d */
__device__ __forceinline__ void tc_issue(float *d, uint32_t sbase, int kt, int wg, int fresh)
{
    uint32_t sa = sbase + (kt % TC_STAGES) * TC_STAGE_BYTES + wg * 64 * 128,
             sb = sbase + (kt % TC_STAGES) * TC_STAGE_BYTES + TC_BM * TC_BK * 2;
    if (fresh)
        tc_fence(d);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < TC_BK / 16; kk++) {
        uint32_t sub = (kk >> 2), kb = (kk & 3) * 32;
        tc_wgmma(d, tc_desc(sa + sub * TC_BM * 128 + kb), tc_desc(sb + sub * TC_BN * 128 + kb),
                 kk > 0 || !fresh);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__global__ void __launch_bounds__(TC_THREADS, 1)
tc_gemm_kernel(const __half *__restrict__ e16, const uint16_t *__restrict__ w, int n, int N,
               float *__restrict__ kv)
{
#ifdef TC_WGMMA
    extern __shared__ uint8_t tc_smem_raw[];
    uint32_t sbase = (uint32_t)__cvta_generic_to_shared(tc_smem_raw);
    sbase = (sbase + 1023) & ~1023u; /* the swizzle's atoms are 1024-byte aligned */
    int mb = (n + TC_BM - 1) / TC_BM;
    int m0 = (blockIdx.x % mb) * TC_BM, n0 = (blockIdx.x / mb) * TC_BN;
    int wg = threadIdx.x >> 7;
    const int KT = K / TC_BK;
    float acc[TC_ACC];
    float p0[TC_ACC], p1[TC_ACC];
#pragma unroll
    for (int i = 0; i < TC_ACC; i++)
        acc[i] = p0[i] = p1[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < TC_AHEAD; s++)
        tc_load(sbase, s, s, e16, w, m0, n0, n, N);
    for (int k0 = 0; k0 < KT; k0 += TC_CH) {
#pragma unroll
        for (int j = 0; j < TC_CH; j++) {
            int kt = k0 + j;
            asm volatile("cp.async.wait_group %0;\n" ::"n"(TC_AHEAD - 1));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
            /* every thread has waited for the wgmma of tile kt - 2: its
             * stage takes tile kt + TC_AHEAD */
            if (kt + TC_AHEAD < KT)
                tc_load(sbase, (kt + TC_AHEAD) % TC_STAGES, kt + TC_AHEAD, e16, w, m0, n0, n, N);
            else
                asm volatile("cp.async.commit_group;\n" ::); /* keep the group count */
            const int g = j / TC_PROM, first = j % TC_PROM == 0;
            float *cur = (g & 1) ? p1 : p0, *prev = (g & 1) ? p0 : p1;
            tc_issue(cur, sbase, kt, wg, first);
            if (j > 0)
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (j > 0 && first) { /* the previous partial is complete */
                tc_fence(prev);
#pragma unroll
                for (int i = 0; i < TC_ACC; i++)
                    acc[i] += prev[i];
            }
            if (j == TC_CH - 1) {
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                tc_fence(cur);
#pragma unroll
                for (int i = 0; i < TC_ACC; i++)
                    acc[i] += cur[i];
            }
        }
    }
    /* D fragment i: row 16 warp + lane/4 + 8 ((i/2)%2), column 8 (i/4) + 2 (lane%4) + i%2 */
    int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int r0 = m0 + wg * 64 + warp * 16 + (lane >> 2);
    /* pairs as one 8-byte store where every pair is aligned: N even, kv too */
    int pairs = !(N & 1) && !((uintptr_t)kv & 7);
#pragma unroll
    for (int i = 0; i < TC_ACC; i += 2) {
        int t = r0 + 8 * ((i >> 1) & 1), o = n0 + 8 * (i >> 2) + 2 * (lane & 3);
        if (t < n && o < N) {
            if (pairs) { /* o even: the pair is aligned and inside the row */
                *(float2 *)(kv + (size_t)t * N + o) = make_float2(acc[i], acc[i + 1]);
            } else { /* an odd width W, or the caller's kv 4-byte aligned */
                kv[(size_t)t * N + o] = acc[i];
                if (o + 1 < N)
                    kv[(size_t)t * N + o + 1] = acc[i + 1];
            }
        }
    }
#endif
}

__global__ void tc_probe_kernel(int *out)
{
#ifdef TC_WGMMA
    *out = 1;
#else
    *out = 0;
#endif
}

/* 1 if the code this device runs has the wgmma kernel (sm_90a machine code;
 * the PTX JIT-compiled for other devices has not), after raising its
 * shared-memory limit; 0 otherwise (then the cuBLAS GEMM is used).  Runs a
 * probe kernel that writes d (a device int) and waits: call at set-up, not
 * during graph capture. */
static int tc_gemm_probe(int *d)
{
    int h = 0;
    tc_probe_kernel<<<1, 1>>>(d);
    int ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1 &&
             cudaFuncSetAttribute(tc_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TC_SMEM) == cudaSuccess;
    cudaGetLastError();
    return ok;
}

static void tc_gemm(const __half *e16, const uint16_t *w, int n, int N, float *kv, cudaStream_t st)
{
    int blocks = ((n + TC_BM - 1) / TC_BM) * ((N + TC_BN - 1) / TC_BN);
    tc_gemm_kernel<<<blocks, TC_THREADS, TC_SMEM, st>>>(e16, w, n, N, kv);
}
