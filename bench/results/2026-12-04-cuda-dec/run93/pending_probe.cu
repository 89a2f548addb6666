/*
 * pending_probe.cu - which CUDA runtime calls of a layer's open consume a
 * caller's pending error (run 92: test_cuda's open under a pending
 * cudaErrorInvalidDevice lost it, with the library before and after
 * d98e60b).  The open's calls in its order (open_on_device, ws_probe,
 * ws_setup, ws_fit, ws_maps, the upload, cuBLAS), each made with the
 * error set just before (cudaSetDevice of a device that does not exist)
 * and the pending error read after it with cudaPeekAtLastError.  Prints a
 * line a call: "kept" or "CLEARED" (or the call's own failure).
 *   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -o pending_probe pending_probe.cu -lcublas -lcuda
 */
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__global__ void probe_kernel(int *d) { *d = 1; }
__global__ void big_kernel(float *p)
{
    extern __shared__ float s[];
    s[threadIdx.x] = p ? p[threadIdx.x] : 0.0f;
    __syncthreads();
    if (p)
        p[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void never_used_kernel(float *p) { if (p) p[0] = 1.0f; }

static int cleared;

static void pend(void) { (void)cudaSetDevice(1 << 20); }

static void look(const char *what, cudaError_t e)
{
    cudaError_t p = cudaPeekAtLastError();
    int kept = p == cudaErrorInvalidDevice;
    if (!kept)
        cleared++;
    printf("%-58s returned %-28s pending after: %-24s %s\n", what, cudaGetErrorName(e), cudaGetErrorName(p),
           kept ? "kept" : "CLEARED");
    (void)cudaGetLastError();
    (void)cudaSetDevice(0);
    (void)cudaGetLastError();
}

#define STEP(what, call)                                                                            \
    do {                                                                                            \
        pend();                                                                                     \
        cudaError_t e_ = (call);                                                                    \
        look(what, e_);                                                                             \
    } while (0)

int main(void)
{
    printf("CUDA_MODULE_LOADING=%s\n", getenv("CUDA_MODULE_LOADING") ? getenv("CUDA_MODULE_LOADING") : "(unset)");
    int n = 0;
    STEP("cudaGetDeviceCount (first runtime call of the process)", cudaGetDeviceCount(&n));
    STEP("cudaGetDeviceCount again", cudaGetDeviceCount(&n));
    STEP("cudaSetDevice(0)", cudaSetDevice(0));
    void *a = NULL, *b = NULL;
    STEP("cudaMalloc (first)", cudaMalloc(&a, 1 << 20));
    STEP("cudaMalloc (second)", cudaMalloc(&b, 1 << 20));
    void *args[] = {&a};
    STEP("cudaLaunchKernel (first launch of probe_kernel)",
         cudaLaunchKernel((const void *)probe_kernel, dim3(1), dim3(1), args, 0, 0));
    int h = 0;
    STEP("cudaMemcpy device to host", cudaMemcpy(&h, a, sizeof h, cudaMemcpyDeviceToHost));
    STEP("cudaLaunchKernel (second launch)", cudaLaunchKernel((const void *)probe_kernel, dim3(1), dim3(1), args, 0, 0));
    STEP("cudaFuncSetAttribute MaxDynamicSmem (a kernel never used)",
         cudaFuncSetAttribute(big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 190 * 1024));
    STEP("cudaFuncSetAttribute MaxDynamicSmem (again)",
         cudaFuncSetAttribute(big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 190 * 1024));
    STEP("cudaFuncSetAttribute carveout",
         cudaFuncSetAttribute(big_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1] = {};
        cfg.gridDim = dim3(2);
        cfg.blockDim = dim3(384);
        cfg.dynamicSmemBytes = 190 * 1024;
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 2;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int k = 0;
        STEP("cudaOccupancyMaxActiveClusters", cudaOccupancyMaxActiveClusters(&k, (void *)big_kernel, &cfg));
    }
    {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        STEP("cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)",
             cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    }
    int major = 0;
    STEP("cudaDeviceGetAttribute", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    static char host[1 << 20];
    STEP("cudaMemcpy host to device", cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));
    STEP("cudaMemcpy2D host to device", cudaMemcpy2D(a, 256, host, 256, 256, 16, cudaMemcpyHostToDevice));
    STEP("cudaDeviceSynchronize", cudaDeviceSynchronize());
    STEP("cudaFuncSetAttribute (a kernel never used, first touch)",
         cudaFuncSetAttribute(never_used_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024));
    cublasHandle_t hb = NULL;
    pend();
    cublasStatus_t s = cublasCreate(&hb);
    look(s == CUBLAS_STATUS_SUCCESS ? "cublasCreate (ok)" : "cublasCreate (FAILED)", cudaSuccess);
    pend();
    s = cublasSetMathMode(hb, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    look(s == CUBLAS_STATUS_SUCCESS ? "cublasSetMathMode (ok)" : "cublasSetMathMode (FAILED)", cudaSuccess);
    pend();
    s = cublasDestroy(hb);
    look("cublasDestroy", cudaSuccess);
    STEP("cudaFree", cudaFree(b));
    STEP("cudaFree (second)", cudaFree(a));
    printf("%d calls cleared the pending error\n", cleared);
    return 0;
}
