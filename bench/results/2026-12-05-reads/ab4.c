/* ab3 with variants as "GRP,MIN,FLAGS" env knobs */
/* Interleaved A/B of reader variants: one batch each in turn (ENGRAM_EXP=<mask> set before
 * each variant's open and each of its batches); rows/s per variant over the whole run,
 * also per 2-second window ratio to variant 0. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <inttypes.h>
#include "engram.h"
static double now_s(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void setv(const char *v){ unsigned g=0,m=0,f=0; sscanf(v,"%u,%u,%u",&g,&m,&f); char b[16]; snprintf(b,sizeof b,"%u",g); setenv("ENGRAM_X_GRP",b,1); snprintf(b,sizeof b,"%u",m); setenv("ENGRAM_X_MIN",b,1); snprintf(b,sizeof b,"%u",f); setenv("ENGRAM_X_FLAGS",b,1); }
static uint64_t seed=88172645463325252ull;
static uint64_t rnd(void){seed^=seed<<13;seed^=seed>>7;seed^=seed<<17;return seed;}
int main(int argc,char**argv)
{
    const char*path=argv[1]; unsigned depth=atoi(argv[2]); double total=atof(argv[3]);
    int nv=argc-4; char**masks=argv+4;
    unsigned tokmul = getenv("TOKMUL") ? atoi(getenv("TOKMUL")) : 16;
    engram_model*m; engram_error err;
    if(engram_model_open(path,&m,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
    engram_model_info in; engram_model_get_info(m,&in);
    size_t tokens=depth*tokmul>2048?2048:depth*tokmul; if(tokens<4)tokens=4;
    uint32_t*rows=malloc(tokens*48*4); uint16_t*out=malloc(tokens*24*ENGRAM_ROW_VALUES*2);
    engram_reader*rd[16];
    for(int v=0;v<nv;v++){ setv(masks[v]);
        engram_reader_opts o={.engine=ENGRAM_IO_AUTO,.depth=depth};
        if(engram_reader_open(m,&o,&rd[v],&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;} }
    double t[16]={0}, rws[16]={0}, wt[16]={0}, wr[16]={0};
    double t0=now_s(), wstart=t0; int k=0;
    double wratios[16][512]; int nw=0;
    while(now_s()-t0<total){
        for(int i=0;i<nv;i++){
            int v=(i+k)%nv;
            for(size_t q=0;q<tokens*48;q++) rows[q]=rnd()%in.table[q%48/24].rows;
            setv(masks[v]);
            engram_io_stats a,b; engram_reader_get_stats(rd[v],&a);
            double s=now_s();
            if(engram_reader_batch(rd[v],0,rows,tokens,ENGRAM_BF16,out,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
            double e=now_s(); engram_reader_get_stats(rd[v],&b);
            t[v]+=e-s; rws[v]+=b.rows_read-a.rows_read; wt[v]+=e-s; wr[v]+=b.rows_read-a.rows_read;
        }
        k++;
        if(now_s()-wstart>2 && nw<512){ for(int v=0;v<nv;v++) wratios[v][nw]=(wr[v]/wt[v])/(wr[0]/wt[0]); for(int v=0;v<nv;v++) wr[v]=wt[v]=0; nw++; wstart=now_s(); }
    }
    for(int v=0;v<nv;v++){
        double a[512]; int n=nw; memcpy(a,wratios[v],n*sizeof*a);
        for(int i=0;i<n;i++)for(int j=i+1;j<n;j++)if(a[j]<a[i]){double x=a[i];a[i]=a[j];a[j]=x;}
        printf("variant %-4s: %8.0f rows/s overall, ratio to [%s] %.3f; 2-s windows (%d): median %.3f, quartiles %.3f %.3f\n",
               masks[v], rws[v]/t[v], masks[0], (rws[v]/t[v])/(rws[0]/t[0]), n, n?a[n/2]:0, n?a[n/4]:0, n?a[3*n/4]:0);
    }
    return 0;
}
