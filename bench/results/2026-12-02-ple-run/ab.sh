#!/bin/sh
# A/B in one sitting: old = e0fd47f (last stop), new = HEAD; alternating, twice each
cd /work/main
O=/tmp/ab; mkdir -p $O
for i in 1 2; do
  for v in old new; do
    B=/work/main/build/engram; [ $v = old ] && B=/tmp/old/build/engram
    echo "== $v $i" >> $O/io.txt
    $B bench io /tmp/engram-bench/t8.gguf --sections ab --depths 16,64 --seconds 4 --no-fio >> $O/io.txt 2>&1
    echo "== $v $i" >> $O/run.txt
    $B run build/demo.gguf --json >> $O/run.txt 2>&1
  done
done
