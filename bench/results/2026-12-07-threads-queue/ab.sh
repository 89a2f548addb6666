#!/bin/bash
# A/B of the thread-pool engine: main before (a thread per slot) and after (a thread per two slots),
# same file, taking turns; then fio psync with each thread count.
F=/tmp/te.gguf
for round in 1 2 3; do
  for d in 32 64 128; do
    for b in old new; do
      printf "round %d %-3s depth %3d: " $round $b $d
      ENGRAM_IO=threads /tmp/engram.$b bench io $F --depths $d --seconds 2 --rounds 1 --sections a --no-fio 2>&1 | awk -v d=$d '$1==d {print $2" reads/s, "$(NF-2)" cores"}'
    done
  done
  for j in 16 32 64; do
    printf "round %d fio psync %2d jobs: " $round $j
    fio --name=r --filename=$F --rw=randread --bssplit=512/50:1024/50 --blockalign=512 --direct=1 --ioengine=psync --numjobs=$j --group_reporting --runtime=2 --time_based --offset=520192 --size=120M --readonly --norandommap --output-format=json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.0f reads/s, %.2f cores" % (j["read"]["iops"], (j["usr_cpu"]+j["sys_cpu"])/100*'$j'))'
  done
done
for b in old new old new; do
  printf "%-3s decode steps (depth 64): " $b
  ENGRAM_IO=threads /tmp/engram.$b bench io $F --seconds 3 --sections b --no-fio 2>&1 | grep -o "[0-9]* steps, p50 [0-9.]* us, p99 [0-9.]* us"
done
