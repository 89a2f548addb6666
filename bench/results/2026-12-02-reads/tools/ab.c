/* A/B harness: fio (batched, same sizes as bench io's FIO_MIX_BATCHED) and engram
 * reader variants (ENGRAM_EXP=<mask> set before each reader's open), rotating. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <inttypes.h>
#include "engram.h"

static double now_s(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu_s(void){struct rusage u;getrusage(RUSAGE_SELF,&u);return u.ru_utime.tv_sec+u.ru_utime.tv_usec*1e-6+u.ru_stime.tv_sec+u.ru_stime.tv_usec*1e-6;}
static void disk(double *ios, double *wq){FILE*f=fopen("/proc/diskstats","r");char l[512];*ios=*wq=0;
 while(fgets(l,sizeof l,f)){unsigned a,b;char n[32];unsigned long long v[17];
  if(sscanf(l,"%u %u %31s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",&a,&b,n,v,v+1,v+2,v+3,v+4,v+5,v+6,v+7,v+8,v+9,v+10)==14&&!strcmp(n,"vda")){*ios=(double)v[0];*wq=(double)v[3];}}
 fclose(f);}
static double dq[64][16], dl[64][16];
static void setv(const char *v){ unsigned f=0,m=0,u=0; sscanf(v,"%u,%u,%u",&f,&m,&u); char b[16];
  snprintf(b,sizeof b,"%u",f); setenv("ENGRAM_X_FLAGS",b,1); snprintf(b,sizeof b,"%u",m); setenv("ENGRAM_X_MIN",b,1);
  snprintf(b,sizeof b,"%u",u); setenv("ENGRAM_X_SUB",b,1); }
static uint64_t seed=88172645463325252ull;
static uint64_t rnd(void){seed^=seed<<13;seed^=seed>>7;seed^=seed<<17;return seed;}

static double fio(const char *path, unsigned depth, uint64_t off, uint64_t size, double secs, const char *extra_cfg)
{
    char cmd[2048];
    snprintf(cmd,sizeof cmd,"fio --name=engram --filename='%s' --readonly --direct=1 --rw=randread "
      "--bssplit=512/50:1024/50 --blockalign=512 --ioengine=io_uring --iodepth=%u "
      "--iodepth_batch_submit=%u --iodepth_batch_complete_max=%u --registerfiles --fixedbufs %s "
      "--offset=%" PRIu64 " --size=%" PRIu64 " --runtime=%.0f --time_based --norandommap --randrepeat=0 "
      "--output-format=json 2>/dev/null | grep -m1 '\"iops\"'", path, depth, depth/4?depth/4:1, depth, extra_cfg,
      off, size, secs);
    FILE *p=popen(cmd,"r"); char line[256]=""; if(!fgets(line,sizeof line,p)) line[0]=0; pclose(p);
    char *c=strchr(line,':'); return c?strtod(c+1,NULL):0;
}

int main(int argc,char**argv)
{
    if(argc<6){fprintf(stderr,"ab FILE DEPTH ROUNDS SECS MASK...\n");return 2;}
    const char*path=argv[1]; unsigned depth=atoi(argv[2]); int rounds=atoi(argv[3]); double secs=atof(argv[4]);
    int nv=argc-5; const char**masks=(const char**)argv+5;
    engram_model*m; engram_error err;
    if(engram_model_open(path,&m,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
    engram_model_info in; engram_model_get_info(m,&in);
    uint64_t off=in.table[0].offset/512*512, size=in.table[0].bytes/512*512;
    size_t tokens=depth*16u>2048?2048:depth*16u; if(tokens<4)tokens=4;
    uint32_t*rows=malloc(tokens*48*4); uint16_t*out=malloc(tokens*24*ENGRAM_ROW_VALUES*2);
    int nk=nv+1; double res[64][16]; double cpu[64][16];
    for(int r=0;r<rounds;r++){
        for(int k=0;k<nk;k++){
            int w=(k+r)%nk;
            double i0,q0,i1,q1,ts=now_s(); disk(&i0,&q0);
            if(w==nv){res[r][w]=getenv("NOFIO")?0:fio(path,depth,off,size,secs<1?1:secs,"");cpu[r][w]=0;
              disk(&i1,&q1); dl[r][w]=(q1-q0)/(i1-i0)*1000; dq[r][w]=(q1-q0)/1000/(now_s()-ts); continue;}
            setv(masks[w]);
            engram_reader_opts o={.engine=ENGRAM_IO_AUTO,.depth=depth}; engram_reader*rd;
            if(engram_reader_open(m,&o,&rd,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
            double t0=now_s(),c0=cpu_s(),t1;
            do{ for(size_t i=0;i<tokens*48;i++) rows[i]=rnd()%in.table[i%48/24].rows;
                if(engram_reader_batch(rd,0,rows,tokens,ENGRAM_BF16,out,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
                t1=now_s(); }while(t1-t0<secs);
            engram_io_stats st; engram_reader_get_stats(rd,&st);
            res[r][w]=st.rows_read/(t1-t0); cpu[r][w]=(cpu_s()-c0)/(t1-t0);
            engram_reader_close(rd);
            disk(&i1,&q1); dl[r][w]=(q1-q0)/(i1-i0)*1000; dq[r][w]=(q1-q0)/1000/(now_s()-ts);
        }
        if(getenv("NOFIO")) res[r][nv]=res[r][0];
        printf("round %d  fio %.0f (lat %.0f us, qd %.1f)",r,res[r][nv],dl[r][nv],dq[r][nv]);
        for(int v=0;v<nv;v++) printf("  [%s] %.0f (%.3f, %.2f c, lat %.0f us, qd %.1f)",masks[v],res[r][v],res[r][v]/res[r][nv],cpu[r][v],dl[r][v],dq[r][v]);
        printf("\n"); fflush(stdout);
    }
    /* summary: mean and median of per-round ratios */
    for(int v=0;v<nv;v++){ double s=0, a[64]; for(int r=0;r<rounds;r++){a[r]=res[r][v]/res[r][nv];s+=a[r];}
        for(int i=0;i<rounds;i++)for(int j=i+1;j<rounds;j++)if(a[j]<a[i]){double t=a[i];a[i]=a[j];a[j]=t;}
        printf("variant %s: ratio mean %.3f median %.3f min %.3f max %.3f\n",masks[v],s/rounds,rounds%2?a[rounds/2]:(a[rounds/2-1]+a[rounds/2])/2,a[0],a[rounds-1]);}
    return 0;
}
