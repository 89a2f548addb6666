/* Interleaved: the engram reader's batch against a bare io_uring loop over the
 * same kind of reads (random rows of table 0, each the aligned 512/1024-byte
 * span that covers its 264 bytes, fixed file + fixed buffer, O_DIRECT), in
 * turns of one batch each.  Styles of the bare loop:
 *   one:  after each wait for >= 1 completion, every reaped slot is refilled
 *         and submitted by itself (one io_uring_enter per read, as fio's
 *         default iodepth_batch_submit=1)
 *   wave: every reaped slot refilled, all submitted in one call with the wait
 *   w8:   as wave, but waiting for depth/8 completions (the reader's minimum)
 * Prints rows/s per variant over the run and the median of 2-s windows'
 * ratio to the reader. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "engram.h"
static double now_s(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t seed=88172645463325252ull;
static uint64_t rnd(void){seed^=seed<<13;seed^=seed>>7;seed^=seed<<17;return seed;}
static uint64_t t0off, t0rows; static unsigned skip[1024]; static struct io_uring ring; static uint8_t *arena;
static void prep(unsigned slot){
    uint64_t off=t0off+(rnd()%t0rows)*264ull, a=off/512*512, e=(off+264+511)/512*512; skip[slot]=(unsigned)(off-a);
    struct io_uring_sqe*s=io_uring_get_sqe(&ring);
    io_uring_prep_read_fixed(s,0,arena+(size_t)slot*1024,(unsigned)(e-a),a,0);
    s->flags|=IOSQE_FIXED_FILE; io_uring_sqe_set_data64(s,slot);
}
static uint16_t *dout; static size_t dnext, dcap;
static void deliver_from(const uint8_t *b){ if(engram_rows_decode_bf16(ENGRAM_SIMD_AUTO,b,1,dout+(dnext++%dcap)*ENGRAM_ROW_VALUES,NULL)<0){fprintf(stderr,"bad row\n");exit(1);} }
static void deliver(unsigned slot){ deliver_from(arena+(size_t)slot*1024+skip[slot]); }
/* n reads at depth d; style 0 one, 1 wave, 2 w8 */
static void bare(unsigned d, size_t n, int style){
    size_t issued=0, done=0;
    for(unsigned i=0;i<d&&issued<n;i++){prep(i);issued++;}
    io_uring_submit(&ring);
    while(done<n){
        unsigned want = style==2 ? (d/8?d/8:1) : 1;
        if(want>issued-done) want=(unsigned)(issued-done);
        io_uring_submit_and_wait(&ring,want);
        struct io_uring_cqe*c[64]; unsigned got;
        while((got=io_uring_peek_batch_cqe(&ring,c,64))>0){
            unsigned slots[64];
            for(unsigned i=0;i<got;i++){ if(c[i]->res<=0){fprintf(stderr,"res %d\n",c[i]->res);exit(1);} slots[i]=(unsigned)io_uring_cqe_get_data64(c[i]); }
            io_uring_cq_advance(&ring,got); done+=got;
            if(style==3) for(unsigned i=0;i<got;i++) deliver(slots[i]);
            if(style==3||style==4){ uint8_t tmp[64][1024]; for(unsigned i=0;i<got;i++) memcpy(tmp[i],arena+(size_t)slots[i]*1024+skip[slots[i]],264);
                for(unsigned i=0;i<got&&issued<n;i++){ prep(slots[i]); issued++; io_uring_submit(&ring); }
                if(style==4) for(unsigned i=0;i<got;i++) deliver_from(tmp[i]);
                continue; }
            for(unsigned i=0;i<got&&issued<n;i++){ prep(slots[i]); issued++; if(style==0) io_uring_submit(&ring); }
        }
    }
}
int main(int argc,char**argv)
{
    if(argc<5){fprintf(stderr,"raw FILE DEPTH SECONDS STYLE...(reader one wave w8)\n");return 2;}
    const char*path=argv[1]; unsigned depth=atoi(argv[2]); double total=atof(argv[3]);
    int nv=argc-4; char**names=argv+4;
    engram_model*m; engram_error err;
    if(engram_model_open(path,&m,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
    engram_model_info in; engram_model_get_info(m,&in);
    t0off=in.table[0].offset; t0rows=in.table[0].rows;
    size_t tokens=depth*16>2048?2048:depth*16;
    uint32_t*rows=malloc(tokens*48*4); uint16_t*out=malloc(tokens*24*ENGRAM_ROW_VALUES*2);
    engram_reader_opts o={.engine=ENGRAM_IO_AUTO,.depth=depth}; engram_reader*rd;
    if(engram_reader_open(m,&o,&rd,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
    dcap=tokens*24; dout=malloc(dcap*ENGRAM_ROW_VALUES*2);
    int fd=open(path,O_RDONLY|O_DIRECT); if(fd<0){perror("open");return 1;}
    if(io_uring_queue_init(depth,&ring,0)<0||io_uring_register_files(&ring,&fd,1)<0){fprintf(stderr,"ring\n");return 1;}
    if(posix_memalign((void**)&arena,4096,(size_t)depth*1024))return 1;
    struct iovec iov={arena,(size_t)depth*1024}; if(io_uring_register_buffers(&ring,&iov,1)<0){fprintf(stderr,"bufs\n");return 1;}
    double t[8]={0}, rws[8]={0}, wt[8]={0}, wr[8]={0}, wratios[8][1024]; int nw=0, k=0;
    double start=now_s(), wstart=start;
    while(now_s()-start<total){
        for(int i=0;i<nv;i++){
            int v=(i+k)%nv; double s, e, got;
            if(!strncmp(names[v],"reader",6)){ if(!strcmp(names[v],"reader0")) setenv("ENGRAM_X_NODEFER","1",1); else unsetenv("ENGRAM_X_NODEFER");
                for(size_t q=0;q<tokens*48;q++) rows[q]=(uint32_t)(rnd()%in.table[q%48/24].rows);
                engram_io_stats a,b; engram_reader_get_stats(rd,&a); s=now_s();
                if(engram_reader_batch(rd,0,rows,tokens,ENGRAM_BF16,out,&err)<0){fprintf(stderr,"%s\n",err.msg);return 1;}
                e=now_s(); engram_reader_get_stats(rd,&b); got=(double)(b.rows_read-a.rows_read);
            } else {
                int st=!strcmp(names[v],"one")?0:!strcmp(names[v],"wave")?1:!strcmp(names[v],"oneD")?3:!strcmp(names[v],"oneA")?4:2;
                size_t n=tokens*24; s=now_s(); bare(depth,n,st); e=now_s(); got=(double)n;
            }
            t[v]+=e-s; rws[v]+=got; wt[v]+=e-s; wr[v]+=got;
        }
        k++;
        if(now_s()-wstart>2&&nw<1024){for(int v=0;v<nv;v++)wratios[v][nw]=(wr[v]/wt[v])/(wr[0]/wt[0]);for(int v=0;v<nv;v++)wr[v]=wt[v]=0;nw++;wstart=now_s();}
    }
    for(int v=0;v<nv;v++){
        double a[1024]; int n=nw; memcpy(a,wratios[v],n*sizeof*a);
        for(int i=0;i<n;i++)for(int j=i+1;j<n;j++)if(a[j]<a[i]){double x=a[i];a[i]=a[j];a[j]=x;}
        printf("depth %u %-7s %8.0f rows/s, ratio to %s %.3f; 2-s windows (%d): median %.3f, quartiles %.3f %.3f\n",
               depth,names[v],rws[v]/t[v],names[0],(rws[v]/t[v])/(rws[0]/t[0]),n,n?a[n/2]:0,n?a[n/4]:0,n?a[3*n/4]:0);
    }
    return 0;
}
