// occ_probe.cu - written by review helper-56 (session j): each wsd_kernel<NB>'s occupancy, registers and stages,
// and NB = 8 against 16, 32 and 64 bit for bit on the same 5 tokens at N = 25600, 25536, 25400 (kernels launched
// directly, timed alone).  Built against the tree's cuda/ws_gemm.cuh.
#include "ws_gemm.cuh"
#include <cstdio>
#include <vector>
#include <cstring>
template<int NB> void occ(){int k=-1;cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k,wsd_kernel<NB>,wsd_shape<NB>::threads,wsd_shape<NB>::smem);
cudaFuncAttributes a;cudaFuncGetAttributes(&a,wsd_kernel<NB>);printf("NB=%d bm=%d st=%d smem=%d regs=%d occ=%d\n",NB,wsd_shape<NB>::bm,wsd_shape<NB>::stages,wsd_shape<NB>::smem,a.numRegs,k);}
template<int NB> void go(CUtensorMap*m,int n,int N,float*kv,uint16_t*w,int*f){typedef wsd_shape<NB> S;cudaLaunchConfig_t c={};c.gridDim=dim3((N+S::bm-1)/S::bm);c.blockDim=dim3(S::threads);c.dynamicSmemBytes=S::smem;
cudaEvent_t a,b;cudaEventCreate(&a);cudaEventCreate(&b);float t=1e9,ms;
for(int r=0;r<20;r++){cudaEventRecord(a);cudaLaunchKernelEx(&c,wsd_kernel<NB>,m[S::bm==WSD_BM?0:5],m[NB==8?1:NB==16?2:NB==32?3:4],n,N,kv,(const uint16_t*)w,(const uint8_t*)0,(size_t)0,(const int*)0,(size_t)0,(const int*)f,(const int*)0);
cudaEventRecord(b);cudaEventSynchronize(b);cudaEventElapsedTime(&ms,a,b);t=ms<t?ms:t;}
printf(" NB=%d N=%d grid=%d %s %.1fus\n",NB,N,c.gridDim.x,cudaGetErrorString(cudaGetLastError()),t*1e3);}
int main(){printf("setup=%d\n",ws_setup());occ<8>();occ<16>();occ<32>();occ<64>();
const int M=25600;uint16_t*w,*e;float*kv;int*f;cudaMalloc(&w,(size_t)M*K*2);cudaMalloc(&e,64*K*2);cudaMalloc(&kv,256*M);cudaMalloc(&f,256);cudaMemset(f,0,256);
std::vector<uint16_t>h((size_t)M*K);uint32_t x=1;for(auto&v:h){x=x*1664525u+1013904223u;v=(uint16_t)(0x3000+((x>>16)&4095)+((x>>31)<<15));}
cudaMemcpy(w,h.data(),h.size()*2,cudaMemcpyHostToDevice);cudaMemcpy(e,h.data()+12345,64*K*2,cudaMemcpyHostToDevice);
for(int N:{25600,25536,25400}){CUtensorMap m[6];if(wsd_maps(m,e,64,w,N))return 1;std::vector<float>r[4];int n=5;
for(int i=0;i<4;i++){cudaMemset(kv,255,256*M);if(i==0)go<8>(m,n,N,kv,w,f);if(i==1)go<16>(m,n,N,kv,w,f);if(i==2)go<32>(m,n,N,kv,w,f);if(i==3)go<64>(m,n,N,kv,w,f);
r[i].resize((size_t)n*N);cudaMemcpy(r[i].data(),kv,r[i].size()*4,cudaMemcpyDeviceToHost);}
int nan=0;for(float v:r[0])nan+=v!=v;printf("N=%d eq16 %d eq32 %d eq64 %d nan %d\n",N,!memcmp(r[0].data(),r[1].data(),r[0].size()*4),!memcmp(r[0].data(),r[2].data(),r[0].size()*4),!memcmp(r[0].data(),r[3].data(),r[0].size()*4),nan);}}
