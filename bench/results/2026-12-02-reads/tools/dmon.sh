#!/bin/sh
# per-second vda: reads/s, writes/s, average queue depth (weighted ms / 1000 ms)
prev=$(awk '$3=="vda"{print $4, $8, $14}' /proc/diskstats)
while :; do sleep 1; cur=$(awk '$3=="vda"{print $4, $8, $14}' /proc/diskstats)
 echo "$(date +%T) $prev $cur" | awk '{printf "%s r/s %6d w/s %5d qd %6.1f\n", $1, $5-$2, $6-$3, ($7-$4)/1000}'; prev=$cur; done
