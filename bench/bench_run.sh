#!/bin/sh
# bench_run.sh [BUILD] - issue #10's measurements with engram run on the demo
# model, as ratios within one run (configurations alternate, 2 rounds):
#  (a) decode with reads overlapped vs waited before layer 0, 1 session,
#      layers of 1000 us (longer than the device's 48-read time here);
#  (b) batched decode of B = 1, 8, 32 sessions: device reads per token;
#  (c) prefill tokens/s with the prefetch ring vs serial chunk reads, layers
#      of 100 and 1000 us per 64 tokens.
B=${1:-build}
E="$B/engram"
J() { "$E" run --json "$@" 2>/dev/null; }
echo "engram run benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for round in 1 2; do
    echo "== round $round"
    for ov in "" "--no-overlap"; do
        J --sessions 1 --decode 48 --layer-us 1000 $ov | /usr/bin/python3 -c "
import json,sys; d=json.load(sys.stdin); x=d['decode']
t=x['per_table']
print('(a) overlap=%-5s decode %7.1f tok/s, step p50 %6.2f ms, read span %.1f ms, hidden %5.1f%% (%.1f%% in the begin call; table 0 span %.1f ms exposed %.1f ms, table 1 span %.1f ms exposed %.1f ms)' % (
  d['overlap'], x['tokens_per_s'], x['step_p50_ns']/1e6, x['read_span_ns']/1e6,
  100*x['hidden_ns']/max(1,x['read_span_ns']), 100*x['hidden_in_begin_ns']/max(1,x['read_span_ns']),
  t['read_span_ns'][0]/1e6, t['exposed_wait_ns'][0]/1e6, t['read_span_ns'][1]/1e6, t['exposed_wait_ns'][1]/1e6))"
    done
    for s in 1 8 32; do
        J --sessions $s --decode 32 --layer-us 100 | /usr/bin/python3 -c "
import json,sys; d=json.load(sys.stdin); x=d['decode']
print('(b) B=%-3d decode %7.1f tok/s, step p50 %6.2f ms, %d rows requested, %d read: %.2f device reads per token' % (
  d['sessions'], x['tokens_per_s'], x['step_p50_ns']/1e6, x['rows_requested'], x['rows_read'], x['rows_read']/x['tokens']))"
    done
    for us in 100 1000; do
        for pf in "" "--no-prefetch"; do
            J --sessions 1 --decode 4 --layer-us $us $pf | /usr/bin/python3 -c "
import json,sys; d=json.load(sys.stdin); x=d['prefill']
print('(c) layer-us %4d prefetch=%-5s prefill %7.1f tok/s (%d tokens, %.2f s, reads: span %.2f s, exposed %.2f s)' % (
  d['layer_us'], d['prefetch'], x['tokens_per_s'], x['tokens'], x['seconds'], x['read_span_ns']/1e9, x['exposed_wait_ns']/1e9))"
        done
    done
done
