#!/bin/sh
# avg queue depth and latency at the block layer for the reader and fio at depth D
D=$1; F=/tmp/engram-bench/t8.gguf
OFF=520192; SIZE=$((4294967296/512*512))
st() { cat /sys/block/vda/stat; }
meas() { # name cmd...
  name=$1; shift
  a=$(st); t0=$(date +%s.%N); "$@" > /tmp/s9/qd_out.txt 2>&1; t1=$(date +%s.%N); b=$(st)
  echo "$a|$b|$t0|$t1" | awk -F'|' -v n="$name" '{split($1,x," ");split($2,y," ");dt=$4-$3;r=y[1]-x[1];tk=y[4]-x[4];tq=y[11]-x[11];
     printf "%-8s reads/s %7.0f  lat %6.1f us  avg queue %5.1f\n", n, r/dt, tk*1000/r, tq/1000/dt}'
}
for i in 1 2 3; do
 meas reader /tmp/exp/ab3 $F $D 5 0
 meas fio-mix fio --name=e --filename=$F --readonly --direct=1 --rw=randread --bssplit=512/50:1024/50 --blockalign=512 --ioengine=io_uring --iodepth=$D --offset=$OFF --size=$SIZE --runtime=5s --time_based --norandommap --randrepeat=0
 meas fio-bat fio --name=e --filename=$F --readonly --direct=1 --rw=randread --bssplit=512/50:1024/50 --blockalign=512 --ioengine=io_uring --iodepth=$D --iodepth_batch_submit=$((D/4)) --iodepth_batch_complete_max=$D --registerfiles --fixedbufs --offset=$OFF --size=$SIZE --runtime=5s --time_based --norandommap --randrepeat=0
done
