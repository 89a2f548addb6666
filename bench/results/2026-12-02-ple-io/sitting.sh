#!/bin/sh
# one sitting: PLE and V4.1 alternating
set -u
cd /work/wt-cli
B=/tmp/engram-cli-bench
C="--corpus data/gpl3.tok --corpus ../shared/data/corpus/shakespeare.tok --corpus ../shared/data/corpus/promessi.tok"
$B/engram-bench bench io $B/ple2m.gguf --depths 1,16,64,128 --max-tokens 60000 $C --csv $B/ple-1.csv > $B/ple-1.txt 2>&1
$B/engram-bench bench io /tmp/engram-bench/t8.gguf --depths 1,16,64,128 --max-tokens 60000 $C --csv $B/v41-1.csv > $B/v41-1.txt 2>&1
$B/engram-bench bench io $B/ple2m.gguf --sections ab --depths 1,16,64,128 --csv $B/ple-2.csv > $B/ple-2.txt 2>&1
$B/engram-bench bench io /tmp/engram-bench/t8.gguf --sections ab --depths 1,16,64,128 --csv $B/v41-2.csv > $B/v41-2.txt 2>&1
echo done > $B/sitting.done
