#!/usr/bin/env python3
"""deployment_model.py - a model of Engram's tables in a multi-node deployment.

Usage:  python3 tools/deployment_model.py            (markdown on stdout)

Standard library only, no randomness: the same output on every run.
DISTRIBUTED.md includes the output verbatim.

Every input is a named constant below with its source, one of:
  MEASURED  measured on this project's machines: the file and figure named
  SPEC      /work/shared/SPEC.md (the model's constants, or its section 11)
  DERIVED   computed from the ones above (the formula is in the comment)
  ASSUME    an assumption: not measured here; change it and rerun

The model is arithmetic, not a simulation.  Per node it counts what each
mode stores, reads from the node's drives, and moves over the network, and
compares each with what the node has; the resource with the highest
utilization is the one that saturates first.
"""

import math

# --------------------------------------------------------------------------
# The model's constants (SPEC section 2)
# --------------------------------------------------------------------------
ROWS_PER_TOKEN = 48            # SPEC 2: 24 columns x 2 tables
ROWS_PER_TABLE_TOKEN = 24      # SPEC 2
ROW_BYTES = 264                # SPEC 2: 256 E4M3 + 8 E8M0 bytes
ROWS_TOTAL = 384_006_168 + 384_016_682   # SPEC 2: rows of table 0 + table 1
TABLE_BYTES = ROWS_TOTAL * ROW_BYTES      # DERIVED: 202.8e9 B
TABLE_GIB = TABLE_BYTES / 2**30           # DERIVED: 188.8 GiB (SPEC 2)
BF16_ROW_BYTES = 512           # SPEC 7: 256 values as BF16 (the combine's dtype in the measurements)
STEP_BYTES_BF16 = ROWS_PER_TOKEN * BF16_ROW_BYTES   # DERIVED: 24,576 B a token (engram_mpi.h)
STEP_BYTES_RAW = ROWS_PER_TOKEN * ROW_BYTES         # DERIVED: 12,672 B a token as raw rows
CHUNK_TOKENS = 2048            # SPEC 9: prefill chunk

# --------------------------------------------------------------------------
# Device reads: one read per row, of the aligned blocks that hold it
# --------------------------------------------------------------------------
# A row at 264*r straddles two blocks when its offset within a block is past
# (block - 264).  264 = 8 * 33, so offsets mod a power-of-two block are the
# multiples of 8, uniformly.
def straddle_fraction(block):
    offs = range(0, block, 8)
    return sum(1 for o in offs if o + ROW_BYTES > block) / len(offs)

STRADDLE_512 = straddle_fraction(512)     # DERIVED: 0.5 (MEASURED too: bench io prints
                                          # "2048 of 4096 (50.0%) span two 512-byte blocks",
                                          # bench/results/2026-12-02-ple-io/v41-1.txt)
STRADDLE_4K = straddle_fraction(4096)     # DERIVED: 0.0625
BYTES_PER_READ_512 = 512 * (1 + STRADDLE_512)    # 768 B; MEASURED: "bytes/read 768",
                                                 # bench/results/2026-12-02-ple-io/v41-1.txt (a)
BYTES_PER_READ_4K = 4096 * (1 + STRADDLE_4K)     # DERIVED: 4,352 B on a 4 KiB-formatted drive
# The drive is bound by operations, not bytes, at these sizes: a 1,024 B read
# gave 0.97-0.99x the rows/s of a 512 B read at depth 128 in 3 of 4 runs
# (MEASURED, BENCHMARKS.md "What a straddling row costs", 2026-12-02-ple-io).
# So one row = one device operation, whatever its size; bytes are reported apart.

# --------------------------------------------------------------------------
# De-duplication (rows requested vs rows read), MEASURED here
# --------------------------------------------------------------------------
DEDUP_PREFILL = 0.069   # MEASURED: 'saved' 6.9% (promessi.tok) .. 12.7% (gpl3, shakespeare)
                        # within 2,048-token chunks, bench/results/2026-11-29-io/run5-cache.txt (c);
                        # the lowest figure is used (the most reads).
DEDUP_DECODE = 0.006    # MEASURED: 47.72 device reads per token at B = 32 sessions on
                        # different slices of text (0.6% saved), BENCHMARKS.md #10 (b),
                        # bench/results/2026-12-01-run/bench_run.txt
ROW_CACHE_SAVED = (0.188, 0.267)  # MEASURED: 'saved' with a 256 MiB row cache, run5-cache.txt (c)
                                  # (reported, not used in the tables)
SHARD_IMBALANCE = 1.048 # MEASURED: rows read by the busiest rank / the even share: N = 2 ranks
                        # 0.504-0.520 of one process, N = 4 0.244-0.262 (libengram-mpi's test,
                        # branch mpi-comm, 2-core VM): max 0.262 / 0.25 = 1.048

# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------
VM_DISK_IOPS = (95_000, 142_000)   # SPEC 11: 512 B O_DIRECT io_uring at depth 48-128,
                                   # GPU machine ~95-100k, development VM ~125-142k
DRIVE_IOPS = 1_000_000  # ASSUME: one datacenter NVMe drive at depth; SPEC 11 says
                        # "good NVMe drives do 1-3M random reads/s"; the low end, and assumed
                        # to hold at 4 KiB reads (4.1 GB/s, inside a Gen4 x4 link)
DRIVES_PER_NODE = 8     # ASSUME: an 8-GPU H200 node with 8 NVMe data drives (DGX H200's
                        # datasheet: 8 x 3.84 TB U.2); not measured here
DRIVE_TB = 3.84         # ASSUME: as above
READ_CORES_PER_MIOPS = 2.4  # MEASURED: host cores per million rows/s read: 0.24 cores at
                            # 100,691 rows/s (depth 64), 0.25 at 106,836 (depth 128),
                            # bench/results/2026-12-02-ple-io/v41-1.txt (a); a virtio VM,
                            # so likely pessimistic (SPEC 11: io_uring has done 10M IOPS/core)
NODE_CORES = 112        # ASSUME: 2 x 56-core CPUs (DGX H200 datasheet)
NODE_RAM_GIB = 2048     # ASSUME: 2 TiB host memory (DGX H200 datasheet)
ROW_CACHE_BYTES_PER_ROW = 273   # include/README.md: the row cache costs about 273 B a row

# --------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------
GPUS_PER_NODE = 8             # the brief: 8-GPU nodes
NIC_GBPS_PER_NODE = 8 * 400   # ASSUME: 8 x 400 Gb/s (one NIC per GPU, as DGX H200)
NIC_BYTES_PER_S = NIC_GBPS_PER_NODE * 1e9 / 8   # DERIVED: 400 GB/s per node, each way
NVLINK_BYTES_PER_S_PER_GPU = 450e9   # ASSUME: H200 NVLink 4, 900 GB/s bidirectional = 450 each way
SHM_COMBINE_BYTES_PER_S = (0.64e9, 1.61e9)  # MEASURED: a 2,048-token chunk of one table in BF16
                            # (25,165,824 B) combined by MPI_Iallreduce between 2 ranks in
                            # 15.6-39.6 ms (Open MPI 4.1.4 shared memory, 2-core VM; each rank
                            # receives ~1x the buffer at N = 2): 0.64-1.61 GB/s received per rank
STEP_COMBINE_US = {2: (4.2, 6.7), 4: (19.0, 36.0)}  # MEASURED: one token's 24,576 B combine p50,
                            # same setup; N = 4 oversubscribed on 2 cores
NET_RTT_US = 10.0             # ASSUME: one RDMA round trip between nodes of one fabric
REQUEST_BYTES_PER_ROW = 8     # ASSUME (design, not built): row id + position per requested row
NVMEOF_CAPSULE_BYTES = 64 + 16  # NVMe-oF command capsule 64 B + response capsule 16 B per read
                                # (the NVMe-oF spec's sizes without in-capsule data)

# --------------------------------------------------------------------------
# Load: tokens per second per GPU (ASSUMED: no V4.1 Flash serving figure exists here)
# --------------------------------------------------------------------------
# DeepSeek's published V3/R1 serving figures (their inference-system overview, H800 nodes):
# 14.8k output tokens/s per node decoding (1.85k per GPU) and 73.7k input tokens/s per node
# prefilling (9.2k per GPU, counting prefix-cache hits, which read no Engram rows).  A Flash
# model is smaller, so these are taken as round, order-of-magnitude figures; the break table
# gives the tokens/s at which each resource saturates, whatever the load.
TOKS_PER_GPU = {'decode': 2_000,    # ASSUME
                'prefill': 10_000}  # ASSUME (tokens actually computed, i.e. read)
DECODE_TOKENS_PER_GPU_STEP = 128    # ASSUME: decode batch per GPU (sets steps/s and message sizes)
LAYERS = 43                         # ASSUME: the layer count engram run simulates (README.md)
DRIVE_LAT_US = 100.0                # ASSUME: one NVMe read under load; SPEC 11: 60-100 us at depth 1
VM_STEP_P50_US = (442.4, 557.1)     # MEASURED: 48-row decode step p50 on the VM disk,
VM_STEP_P99_US = (1638.4, 2883.6)   # and p99: bench/results/2026-12-02-ple-io/v41-{1,2}.txt (b)
STEP_P99_OVER_P50 = (2.9, 6.5)      # MEASURED: 48-row step p99/p50 on the VM disk:
                                    # 1,638/557 us (v41-1) and 2,884/442 us (v41-2),
                                    # bench/results/2026-12-02-ple-io

# --------------------------------------------------------------------------
# Layouts and modes
# --------------------------------------------------------------------------
LAYOUTS = [(8, 1), (4, 2), (2, 4), (1, 8)]   # (TP, DP) inside one 8-GPU node
NODES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
SHARD_GROUP = 8          # mode D's default group: nodes that together hold one copy

MODES = [
    ('A', 'replicated per rank (ds4)'),
    ('B', 'replicated per node, one read per token'),
    ('C', 'row-block shards over the TP group, one file per node'),
    ('D', 'row-block shard files across S nodes (S = %d)' % SHARD_GROUP),
    ('E1', 'remote tables over NVMe-oF (4 KiB-block drives)'),
    ('E2', 'remote tables over a transfer engine, rows from remote DRAM'),
]


def node_tokens(role):
    return GPUS_PER_NODE * TOKS_PER_GPU[role]


def dedup(role):
    return DEDUP_PREFILL if role == 'prefill' else DEDUP_DECODE


def per_node(mode, tp, dp, role, S=SHARD_GROUP):
    """What one node stores, reads and moves, per second, in steady state."""
    T = node_tokens(role)
    d = dedup(role)
    r = {}
    # rows the node's drives serve per second
    if mode == 'A':
        rows = T * ROWS_PER_TOKEN * tp * (1 - d)      # every TP rank reads every row of its tokens
        r['storage_gib'] = TABLE_GIB                  # one file, opened by every rank
    elif mode in ('B', 'C'):
        rows = T * ROWS_PER_TOKEN * (1 - d)           # each token's rows once per node
        r['storage_gib'] = TABLE_GIB
    elif mode == 'D':
        # the node reads its 1/S of the rows for all S nodes' tokens: the same count,
        # times the measured imbalance of row blocks
        rows = T * ROWS_PER_TOKEN * (1 - d) * SHARD_IMBALANCE
        r['storage_gib'] = TABLE_GIB / S
    else:  # 'E1', 'E2': no local reads; the storage tier serves them
        rows = 0.0
        r['storage_gib'] = 0.0
    r['rows_per_s'] = rows
    r['drive_util'] = rows / (DRIVES_PER_NODE * DRIVE_IOPS)
    r['read_mb_s_512'] = rows * BYTES_PER_READ_512 / 1e6
    r['read_mb_s_4k'] = rows * BYTES_PER_READ_4K / 1e6
    r['cores'] = rows / 1e6 * READ_CORES_PER_MIOPS
    r['core_util'] = r['cores'] / NODE_CORES

    # intra-node combine among the t ranks of a TP group (modes C, D: shares to combine)
    if mode in ('C', 'D') and tp > 1:
        # bytes received per rank per token of its group; node total = T tokens x t ranks
        ar = 2 * (tp - 1) / tp * STEP_BYTES_BF16
        ag = (tp - 1) / tp * STEP_BYTES_BF16
        r['combine_b_tok_rank'] = (ar, ag)
        r['combine_gb_s_node'] = (T * tp * ar / 1e9, T * tp * ag / 1e9)
        per_gpu = T / GPUS_PER_NODE * tp * ag / tp   # a GPU receives ag per token of its group
        r['combine_nvlink_util'] = per_gpu / NVLINK_BYTES_PER_S_PER_GPU
        # over host shared memory at the VM's measured rate (a rank receives ag..ar per token)
        tok_per_rank = T / GPUS_PER_NODE * tp          # tokens of the group, seen by each rank
        r['combine_shm_util'] = tok_per_rank * ag / SHM_COMBINE_BYTES_PER_S[1]
    elif mode in ('B',) and tp > 1:
        # one reader per node hands each TP rank its rows: ranks receive the whole token's rows
        r['combine_b_tok_rank'] = (STEP_BYTES_BF16, STEP_BYTES_BF16)
        r['combine_gb_s_node'] = (T * tp * STEP_BYTES_BF16 / 1e9,) * 2
        r['combine_nvlink_util'] = 0.0
        r['combine_shm_util'] = 0.0
    else:
        r['combine_b_tok_rank'] = (0.0, 0.0)
        r['combine_gb_s_node'] = (0.0, 0.0)
        r['combine_nvlink_util'] = 0.0
        r['combine_shm_util'] = 0.0

    # inter-node bytes per token of this node's (out + in; symmetric in steady state)
    if mode == 'D':
        remote = ROWS_PER_TOKEN * (1 - d) * (S - 1) / S
        b_tok = remote * (REQUEST_BYTES_PER_ROW + ROW_BYTES)   # requests out, raw rows back
    elif mode == 'E1':
        remote = ROWS_PER_TOKEN * (1 - d)
        b_tok = remote * (NVMEOF_CAPSULE_BYTES + BYTES_PER_READ_4K)  # NVMe-oF, 4 KiB drives
    elif mode == 'E2':
        remote = ROWS_PER_TOKEN * (1 - d)
        b_tok = remote * (REQUEST_BYTES_PER_ROW + ROW_BYTES)         # 264 B rows by RDMA
    else:
        b_tok = 0.0
    r['net_b_tok'] = b_tok
    r['net_gb_s'] = b_tok * T / 1e9
    r['nic_util'] = r['net_gb_s'] * 1e9 / NIC_BYTES_PER_S
    r['storage_util'] = r['storage_gib'] * 2**30 / (DRIVES_PER_NODE * DRIVE_TB * 1e12)
    return r


def verdict(mode, r):
    utils = {'drive IOPS': r['drive_util'], 'host cores (reads)': r['core_util'],
             'NIC': r['nic_util'], 'combine (host shm, VM rate)': r['combine_shm_util']}
    name, u = max(utils.items(), key=lambda kv: kv[1])
    if mode.startswith('E'):
        return 'nothing local (NIC %.1f%%); the storage tier is sized in Table 3' % (100 * r['nic_util'])
    if u >= 1.0:
        return '**breaks**: %s at %.1fx' % (name, u)
    return '%s first (%.0f%%)' % (name, 100 * u)


# --------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------
def fmt_n(x):
    if x == 0:
        return '0'
    if x >= 1e6:
        return '%.2fM' % (x / 1e6)
    if x >= 1e4:
        return '%.0fk' % (x / 1e3)
    if x >= 1e3:
        return '%.1fk' % (x / 1e3)
    return '%.0f' % x


def fmt_gb(x):
    if x == 0:
        return '0'
    if x >= 100:
        return '%.0f' % x
    if x >= 1:
        return '%.1f' % x
    return '%.3f' % x


def table(head, rows):
    out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        out.append('| ' + ' | '.join(str(c) for c in r) + ' |')
    return '\n'.join(out)


def main():
    p = print
    p('<!-- generated by: python3 tools/deployment_model.py -->')
    p()
    p('#### Inputs')
    p()
    p(table(['input', 'value', 'source'], [
        ['rows per token (2 tables x 24)', ROWS_PER_TOKEN, 'SPEC 2'],
        ['row bytes', ROW_BYTES, 'SPEC 2'],
        ['table bytes', '%.1f GiB (%s rows)' % (TABLE_GIB, format(ROWS_TOTAL, ',')), 'SPEC 2'],
        ['combine bytes per token (BF16 / raw rows)', '%s / %s' % (format(STEP_BYTES_BF16, ','), format(STEP_BYTES_RAW, ',')), 'derived'],
        ['bytes per row read, 512 B / 4 KiB blocks', '%.0f / %.0f (%.1f%% / %.2f%% of rows straddle)' % (BYTES_PER_READ_512, BYTES_PER_READ_4K, 100 * STRADDLE_512, 100 * STRADDLE_4K), 'measured 768 (bench io); 4 KiB derived'],
        ['dedup, prefill (2,048-token chunks)', '%.1f%% (measured 6.9-12.7%%)' % (100 * DEDUP_PREFILL), 'measured: run5-cache.txt (c)'],
        ['dedup, decode (B = 32 sessions)', '%.1f%%' % (100 * DEDUP_DECODE), 'measured: BENCHMARKS #10 (b)'],
        ['busiest shard / even share', '%.3f' % SHARD_IMBALANCE, 'measured: libengram-mpi test, N = 2, 4'],
        ['host cores per 1M rows/s read', READ_CORES_PER_MIOPS, 'measured: v41-1.txt (a), virtio VM'],
        ['drive random reads/s', fmt_n(DRIVE_IOPS), 'assumed (SPEC 11: 1-3M for good NVMe)'],
        ['drives per node, TB each', '%d x %.2f' % (DRIVES_PER_NODE, DRIVE_TB), 'assumed (DGX H200 class)'],
        ['node cores / host RAM', '%d / %d GiB' % (NODE_CORES, NODE_RAM_GIB), 'assumed (DGX H200 class)'],
        ['NIC per node', '%d Gb/s = %.0f GB/s each way' % (NIC_GBPS_PER_NODE, NIC_BYTES_PER_S / 1e9), 'assumed (8 x 400 Gb/s)'],
        ['NVLink per GPU, each way', '%.0f GB/s' % (NVLINK_BYTES_PER_S_PER_GPU / 1e9), 'assumed (H200)'],
        ['MPI shared-memory combine, received per rank', '%.2f-%.2f GB/s' % (SHM_COMBINE_BYTES_PER_S[0] / 1e9, SHM_COMBINE_BYTES_PER_S[1] / 1e9), 'measured: libengram-mpi --bench, 2-core VM'],
        ['tokens/s per GPU, decode / prefill', '%s / %s' % (format(TOKS_PER_GPU['decode'], ','), format(TOKS_PER_GPU['prefill'], ',')), 'assumed (order of DeepSeek V3 H800 figures)'],
        ['node tokens/s, decode / prefill', '%s / %s' % (format(node_tokens('decode'), ','), format(node_tokens('prefill'), ',')), 'derived (8 GPUs)'],
        ['shard group S (mode D)', SHARD_GROUP, 'chosen'],
    ]))
    p()

    # ---- Table 1: per node, per mode x layout, both roles
    for role in ('decode', 'prefill'):
        p('#### Table 1%s: one node, %s (%s tokens/s per node)' % ('a' if role == 'decode' else 'b', role, format(node_tokens(role), ',')))
        p()
        rows = []
        for code, name in MODES:
            for tp, dp in LAYOUTS:
                if code.startswith('E') and (tp, dp) != (8, 1):
                    continue   # E's per-node figures do not depend on the layout
                if code == 'B' and tp == 1:
                    continue   # DP only: B is A
                r = per_node(code, tp, dp, role)
                lay = 'any' if code.startswith('E') else 'TP%d x DP%d' % (tp, dp)
                ar, ag = r['combine_gb_s_node']
                rows.append([
                    code, lay,
                    '%.1f' % r['storage_gib'],
                    fmt_n(r['rows_per_s']),
                    '%.0f%%' % (100 * r['drive_util']),
                    '%s / %s' % (fmt_gb(r['read_mb_s_512'] / 1e3), fmt_gb(r['read_mb_s_4k'] / 1e3)),
                    '%.1f' % r['cores'],
                    ('%s / %s' % (fmt_gb(ar), fmt_gb(ag))) if ar else '0',
                    ('%s' % format(round(r['net_b_tok']), ',')) if r['net_b_tok'] else '0',
                    fmt_gb(r['net_gb_s']),
                    verdict(code, r),
                ])
        p(table(['mode', 'layout', 'storage GiB', 'rows read/s', 'of 8 drives', 'read GB/s (512 B / 4 KiB)',
                 'read cores', 'intra-node combine GB/s (allreduce / allgatherv)',
                 'inter-node B/token', 'inter-node GB/s', 'first to saturate'], rows))
        p()
    p('Modes A-C: every figure is per node and the same at 1 or 1,000 nodes (nothing crosses nodes). '
      'Mode B with TP ranks: one reader hands each TP rank all 48 rows of its tokens (the combine column is those bytes). '
      'The combine column of C and D is inside the node (NVLink or host shared memory); at the VM\'s measured '
      'MPI shared-memory rate the "combine" utilization is the busiest rank\'s bytes received / %.2f GB/s.'
      % (SHM_COMBINE_BYTES_PER_S[1] / 1e9))
    p()

    # ---- Table 2: break points in tokens/s per node
    p('#### Table 2: where each mode breaks, in tokens/s per node (whatever the tokens/s per GPU)')
    p()
    p('The node tokens/s at which a resource is exhausted; decode dedup for the read limits. '
      'The measured VM disk (SPEC 11, ~95k-142k reads/s) is one "drive" of the last column.')
    p()
    rows = []
    cap_8 = DRIVES_PER_NODE * DRIVE_IOPS
    for code, name in MODES:
        for tp, dp in LAYOUTS:
            if code.startswith('E') and (tp, dp) != (8, 1):
                continue
            if code == 'B' and tp == 1:
                continue
            mult = tp if code == 'A' else 1
            if code == 'D':
                mult = SHARD_IMBALANCE
            per_tok = ROWS_PER_TOKEN * (1 - DEDUP_DECODE) * mult
            if code.startswith('E'):
                lim_drives = lim_one = lim_vm = lim_cores = '- (storage tier)'
            else:
                lim_drives = fmt_n(cap_8 / per_tok)
                lim_one = fmt_n(DRIVE_IOPS / per_tok)
                lim_cores = fmt_n(NODE_CORES * 1e6 / READ_CORES_PER_MIOPS / per_tok)
                lim_vm = '%s-%s' % (fmt_n(VM_DISK_IOPS[0] / per_tok), fmt_n(VM_DISK_IOPS[1] / per_tok))
            if code in ('D', 'E1', 'E2'):
                b = per_node(code, tp, dp, 'decode')['net_b_tok']
                lim_nic = fmt_n(NIC_BYTES_PER_S / b)
            else:
                lim_nic = '-'
            if code in ('C', 'D') and tp > 1:
                ag = (tp - 1) / tp * STEP_BYTES_BF16
                # a rank sees its group's tokens: node tokens / DP groups
                lim_shm = fmt_n(SHM_COMBINE_BYTES_PER_S[1] / ag * dp)
                lim_nvl = fmt_n(NVLINK_BYTES_PER_S_PER_GPU / ag * dp)
            else:
                lim_shm = lim_nvl = '-'
            rows.append([code, 'any' if code.startswith('E') else 'TP%d x DP%d' % (tp, dp), lim_drives, lim_one,
                         lim_cores, lim_nic, lim_shm, lim_nvl, lim_vm])
    p(table(['mode', 'layout', '8 drives', '1 drive', '%d cores' % NODE_CORES, 'NIC %d Gb/s' % NIC_GBPS_PER_NODE,
             'combine, MPI shm (VM rate)', 'combine, NVLink', 'VM disk (measured IOPS)'], rows))
    p()

    # ---- Table 3: 1 .. 1000 nodes
    p('#### Table 3: from 1 to 1,000 nodes (TP4 x DP2 per node; decode, %s tokens/s per node)' % format(node_tokens('decode'), ','))
    p()
    p('A-C hold a whole table per node; D holds a table per S = %d nodes (D* spreads one copy over all M nodes); '
      'E1 holds it on a storage tier sized to the cluster\'s reads (storage nodes of %d drives at %s reads/s each, '
      'each holding a whole copy; E2\'s DRAM tier is bound by its NICs\' message rate, not modelled). "P(step waits on a p99)": the chance that one of the peers a decode step '
      'needs is in its slowest 1%% (1 - 0.99^peers); measured here a step\'s p99 is %.1f-%.1fx its p50.'
      % (SHARD_GROUP, DRIVES_PER_NODE, fmt_n(DRIVE_IOPS), STEP_P99_OVER_P50[0], STEP_P99_OVER_P50[1]))
    p()
    rows = []
    T = node_tokens('decode')
    steps_per_s = TOKS_PER_GPU['decode'] / DECODE_TOKENS_PER_GPU_STEP
    for M in NODES:
        a = per_node('A', 4, 2, 'decode')
        S = min(SHARD_GROUP, M)
        d = per_node('D', 4, 2, 'decode', S=S)
        ds = per_node('D', 4, 2, 'decode', S=M)
        e1 = per_node('E1', 4, 2, 'decode')
        e2 = per_node('E2', 4, 2, 'decode')
        peers_d = S - 1
        peers_ds = M - 1
        pw = lambda n: 1 - 0.99 ** n
        # rows per peer per decode step of one GPU (message size) for D*
        rows_per_msg = DECODE_TOKENS_PER_GPU_STEP * ROWS_PER_TOKEN / M
        msgs = steps_per_s * GPUS_PER_NODE * peers_ds * 2
        cluster_rows = M * T * ROWS_PER_TOKEN * (1 - DEDUP_DECODE)
        st_nodes = math.ceil(cluster_rows / (DRIVES_PER_NODE * DRIVE_IOPS))
        rows.append([
            M,
            '%.1f' % (M * a['storage_gib'] / 1024),
            '%.1f / %.1f' % (d['storage_gib'], M * d['storage_gib'] / 1024 / 1),
            '%.0f%%' % (100 * pw(peers_d)),
            '%.2f' % ds['storage_gib'],
            fmt_gb(ds['net_gb_s']),
            '%.0f%%' % (100 * pw(peers_ds)),
            '%.1f' % rows_per_msg,
            fmt_n(msgs),
            '%d (%.1f TiB)' % (st_nodes, st_nodes * TABLE_GIB / 1024),
            '%s / %s' % (fmt_gb(e1['net_gb_s']), fmt_gb(e2['net_gb_s'])),
        ])
    p(table(['nodes M', 'A-C: cluster storage TiB',
             'D: GiB/node / cluster TiB', 'D: P(step waits on a p99)',
             'D*: GiB/node', 'D*: net GB/s/node', 'D*: P(step waits on a p99)', 'D*: rows per message',
             'D*: messages/s/node',
             'E1: storage nodes (copies)', 'E1 / E2: net GB/s/node'], rows))
    p()
    p('Prefill (%s tokens/s per node) multiplies the network figures and E\'s storage nodes by %.2f '
      '(%.0fx the tokens, %.3fx the rows per token after its dedup); storage per node and peer counts '
      'do not change.'
      % (format(node_tokens('prefill'), ','),
         node_tokens('prefill') / node_tokens('decode') * (1 - DEDUP_PREFILL) / (1 - DEDUP_DECODE),
         node_tokens('prefill') / node_tokens('decode'), (1 - DEDUP_PREFILL) / (1 - DEDUP_DECODE)))
    p()

    # ---- Table 4: the model against what was measured here
    p('#### Table 4: the model against this project\'s measurements')
    p()
    lo, hi = VM_DISK_IOPS[0] / (ROWS_PER_TOKEN * (1 - DEDUP_PREFILL)), 100_000 / (ROWS_PER_TOKEN * (1 - DEDUP_PREFILL))
    p(table(['what', 'model', 'measured here', 'source'], [
        ['prefill tokens/s, one process, the H200 host\'s virtio disk (~95-100k reads/s)',
         '%s-%s (reads/s / (48 x (1 - %.3f)))' % (format(round(lo), ','), format(round(hi), ','), DEDUP_PREFILL),
         '1,962 (disk-bound: 3.07 of 3.59 s waiting); another host, slower disk: 1,479',
         'BENCHMARKS #11, 2026-12-01-cuda/ws/final/run.txt'],
        ['rows read per rank, row-block shards on one file, N = 2 / 4',
         '0.500 / 0.250 of one process',
         '0.504-0.520 / 0.244-0.262',
         'libengram-mpi test (branch mpi-comm), 2-core VM, N = 4 oversubscribed'],
        ['combine of one decode token (24,576 B), N = 2 / 4',
         'latency-bound (receives 24.6 / 36.9 KB by allreduce)',
         'p50 4.2-6.7 us / 19-36 us',
         'libengram-mpi --bench, Open MPI 4.1.4 shared memory, 2-core VM'],
        ['combine of a 2,048-token chunk of one table (25.2 MB), N = 2',
         'receives ~1x the buffer per rank (2(N-1)/N)',
         '15.6-39.6 ms = %.2f-%.2f GB/s' % (SHM_COMBINE_BYTES_PER_S[0] / 1e9, SHM_COMBINE_BYTES_PER_S[1] / 1e9),
         'same'],
    ]))
    p()
    # ---- Table 5: the decode critical path of table 0 (hidden only behind layer 0)
    step_us = DECODE_TOKENS_PER_GPU_STEP / TOKS_PER_GPU['decode'] * 1e6
    layer_us = step_us / LAYERS
    p('#### Table 5: a decode step\'s table-0 rows against the time they can hide behind')
    p()
    p('A decode step of %d tokens per GPU at %s tokens/s per GPU is %.0f ms; over %d equal layers, layer 0 '
      '(all that table 0\'s reads can hide behind) is %.2f ms, layers 0-13 (table 1) %.1f ms. '
      'Local read: an NVMe read under load (assumed %.0f us); the VM disk measured here gives %.0f-%.0f us p50 '
      'and %.0f-%.0f us p99 for a 48-row step. Combine: measured on the VM (shared memory).'
      % (DECODE_TOKENS_PER_GPU_STEP, format(TOKS_PER_GPU['decode'], ','), step_us / 1e3, LAYERS, layer_us / 1e3,
         14 * layer_us / 1e3, DRIVE_LAT_US, VM_STEP_P50_US[0], VM_STEP_P50_US[1], VM_STEP_P99_US[0], VM_STEP_P99_US[1]))
    p()
    c2 = '%.1f-%.1f' % STEP_COMBINE_US[2]
    c4 = '%.0f-%.0f' % STEP_COMBINE_US[4]
    rows = [
        ['A, B', 'local read', '%.0f' % DRIVE_LAT_US, '%.0f%%' % (100 * DRIVE_LAT_US / layer_us)],
        ['C (TP 2 / 4)', 'local read + combine (%s / %s us measured, 1 token)' % (c2, c4),
         '%.0f / %.0f' % (DRIVE_LAT_US + STEP_COMBINE_US[2][1], DRIVE_LAT_US + STEP_COMBINE_US[4][1]),
         '%.0f%% / %.0f%%' % (100 * (DRIVE_LAT_US + STEP_COMBINE_US[2][1]) / layer_us,
                              100 * (DRIVE_LAT_US + STEP_COMBINE_US[4][1]) / layer_us)],
        ['D (S = %d)' % SHARD_GROUP, 'request RTT + remote read + combine; the slowest of %d peers' % (SHARD_GROUP - 1),
         '%.0f' % (NET_RTT_US + DRIVE_LAT_US + STEP_COMBINE_US[4][1]),
         '%.0f%%' % (100 * (NET_RTT_US + DRIVE_LAT_US + STEP_COMBINE_US[4][1]) / layer_us)],
        ['E1, E2', 'RTT + the storage tier\'s read (E2: DRAM, ~0)', '%.0f / %.0f' % (NET_RTT_US + DRIVE_LAT_US, NET_RTT_US),
         '%.0f%% / %.0f%%' % (100 * (NET_RTT_US + DRIVE_LAT_US) / layer_us, 100 * NET_RTT_US / layer_us)],
        ['(VM disk, measured)', '48-row step p50 / p99', '%.0f-%.0f / %.0f-%.0f' % (VM_STEP_P50_US + VM_STEP_P99_US),
         '%.0f-%.0f%% / %.0f-%.0f%%' % tuple(100 * x / layer_us for x in VM_STEP_P50_US + VM_STEP_P99_US)],
    ]
    p(table(['mode', 'path', 'us', 'of layer 0 (%.0f us)' % layer_us], rows))
    p()
    # ---- in RAM instead
    cache_gib = ROWS_TOTAL * ROW_CACHE_BYTES_PER_ROW / 2**30
    p('Host RAM, for comparison: the table is %.1f GiB, %.0f%% of an assumed %d GiB node; engram\'s row cache '
      'would need %.0f GiB to hold every row (about %d B a row). Drive capacity: %.1f GiB is %.2f%% of %d x %.2f TB.'
      % (TABLE_GIB, 100 * TABLE_GIB / NODE_RAM_GIB, NODE_RAM_GIB, cache_gib, ROW_CACHE_BYTES_PER_ROW,
         TABLE_GIB, 100 * TABLE_GIB * 2**30 / (DRIVES_PER_NODE * DRIVE_TB * 1e12), DRIVES_PER_NODE, DRIVE_TB))


if __name__ == '__main__':
    main()
