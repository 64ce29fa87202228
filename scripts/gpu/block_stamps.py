#!/usr/bin/env python3
"""Reads the per-block stamps of one decode step (`tetra bench decode --block-stamps PATH`, a
build with -DTETRA_BLOCK_STAMPS=ON; layout in src/perf/block_stamps.h) and prints, averaged over
the step's layers, where the q/k/v GEMV -> attention -> o_proj chain spends its time: when each
kernel's blocks start, when their griddepcontrol.wait returns, the attention's phases, how many
SMs the attention's blocks share, and how long o_proj's blocks compute after their wait; then the
same for the MoE chain at up to 8 rows per expert (tiny token path -> GEMM1 -> GEMM2 decode
kernels): routing's phases, when the GEMMs' first weights have been multiplied, how many blocks
each SM ran and how far apart the SMs finish.

    python3 scripts/gpu/block_stamps.py stamps.b1.c1024.bin [--qkv-tiles N]
Times are microseconds from the first block's start of the chain's first kernel in the same
layer. Last, per SM, how much work it held against when it finished (us after the kernel's
median wait): GEMM2 by its blocks on the SM, GEMM1 likewise, and with --qkv-tiles N (the GEMV's
16-row tiles, e.g. 896 for GLM-4.5-Air's q/k/v) the q/k/v GEMV by the tiles its blocks took
(block b of a G-block grid takes tiles b, b + G, ...).
"""
import statistics
import struct
import sys

WORDS = 10  # kBlockStampWords
QKV, ATTN, STREAM = 1, 2, 3
TOKEN_PATH, GEMM1, GEMM2 = 4, 5, 6


def read(path):
    data = open(path, "rb").read()
    launches = {}
    for i in range(len(data) // (8 * WORDS)):
        w = struct.unpack_from("<%dQ" % WORDS, data, i * 8 * WORDS)
        kind, launch = w[0] >> 56, (w[0] >> 32) & 0xFFFFFF
        launches.setdefault((kind, launch), []).append(
            {"block": w[0] & 0xFFFFFFFF, "sm": w[1], "t": w[2:]})
    # In time order; a layer is a q/k/v GEMV, then the attention, then the o_proj GEMV, and a
    # token path, then GEMM1, then GEMM2 (a step at more than 8 rows per expert has neither).
    ordered = sorted(launches.items(), key=lambda kv: min(b["t"][0] for b in kv[1]))
    def chains(pattern):
        found = []
        for i in range(len(ordered) - len(pattern) + 1):
            if [ordered[i + j][0][0] for j in range(len(pattern))] == pattern:
                found.append(tuple(ordered[i + j][1] for j in range(len(pattern))))
        return found
    return chains([QKV, ATTN, STREAM]), chains([TOKEN_PATH, GEMM1, GEMM2])


def median(v):
    return statistics.median(v) if v else 0.0


def layer_figures(qkv, attn, oproj):
    t0 = min(b["t"][0] for b in qkv)
    us = lambda ns: (ns - t0) / 1000.0
    qkv_end = max(b["t"][2] for b in qkv)
    attn_end = max(b["t"][6] for b in attn)
    f = {
        "q/k/v: last block end": us(qkv_end),
        "attn: blocks started before q/k/v end": sum(b["t"][0] < qkv_end for b in attn),
        "attn: blocks": len(attn),
        "attn: SMs": len({b["sm"] for b in attn}),
        "attn: start (median)": us(median([b["t"][0] for b in attn])),
        "attn: wait returned (median)": us(median([b["t"][1] for b in attn])),
        "attn: chunks done (median)": us(median([b["t"][2] for b in attn])),
        "attn: block merge (median us)": median([(b["t"][3] - b["t"][2]) / 1e3 for b in attn]),
        "attn: first cluster barrier (median us)": median([(b["t"][4] - b["t"][3]) / 1e3 for b in attn]),
        "attn: cluster merge (max us)": max((b["t"][5] - b["t"][4]) / 1e3 for b in attn),
        "attn: last block end": us(attn_end),
        "o_proj: blocks": len(oproj),
        "o_proj: blocks started before attn end": sum(b["t"][0] < attn_end for b in oproj),
        "o_proj: wait returned (median)": us(median([b["t"][1] for b in oproj])),
        "o_proj: compute after wait (median us)":
            median([(b["t"][3] - max(b["t"][1], b["t"][2])) / 1e3 for b in oproj]),
        "o_proj: last block end": us(max(b["t"][3] for b in oproj)),
    }
    # Blocks that found no room until the attention's blocks left start late: do they end last?
    early = [b["t"][3] for b in oproj if b["t"][0] < attn_end]
    late = [b["t"][3] for b in oproj if b["t"][0] >= attn_end]
    f["o_proj: last end, blocks started before attn end"] = us(max(early)) if early else -1.0
    f["o_proj: last end, blocks started after attn end"] = us(max(late)) if late else -1.0
    return f


def per_sm(blocks):
    sms = {}
    for b in blocks:
        sms.setdefault(b["sm"], []).append(b)
    return sms


def since_start(blocks, i):
    """Median over blocks of the us from a block's start to its stamp i (blocks without it left
    out; 0 when none has it)."""
    return median([(b["t"][i] - b["t"][0]) / 1e3 for b in blocks if b["t"][i]])


def moe_figures(path, gemm1, gemm2):
    t0 = min(b["t"][0] for b in path)
    us = lambda ns: (ns - t0) / 1000.0
    routed = [b["t"][3] for b in path if b["t"][3]]
    g1_end = max(b["t"][3] for b in gemm1)
    # Blocks that ran (an empty slot's blocks return before the wait: no mid stamps).
    run1 = [b for b in gemm1 if b["t"][2]]
    run2 = [b for b in gemm2 if b["t"][2]]
    sm1 = per_sm(run1)
    sm_end1 = sorted(max(b["t"][3] for b in v) for v in sm1.values())
    sm2 = per_sm(run2)
    f = {
        "token path: blocks": len(path),
        "token path: wait returned (median)": us(median([b["t"][1] for b in path])),
        "token path: logits counted (last)": us(max(b["t"][2] for b in path)),
        "token path: routed": us(routed[0]) if routed else 0.0,
        "token path: last block end": us(max(b["t"][4] for b in path)),
        "GEMM1: blocks run": len(run1),
        "GEMM1: first block start": us(min(b["t"][0] for b in gemm1)),
        "GEMM1: wait returned (median)": us(median([b["t"][1] for b in run1])),
        "GEMM1: first batch multiplied (median)": us(median([b["t"][2] for b in run1])),
        # The decode kernel's phases (ops/moe/w4a16_decode.cu, DecodeStamp): t2 first batch
        # multiplied, t4 scored and t5 routed (the routed GEMM1), t6 first weights requested,
        # t7 scales landed (scales staged in shared memory).
        "GEMM1: block start -> scored (median us)": since_start(run1, 4),
        "GEMM1: block start -> routed (median us)": since_start(run1, 5),
        "GEMM1: block start -> first request (median us)": since_start(run1, 6),
        "GEMM1: block start -> scales landed (median us)": since_start(run1, 7),
        "GEMM1: block start -> first multiply (median us)": since_start(run1, 2),
        "GEMM1: block time after wait (median us)":
            median([(b["t"][3] - b["t"][1]) / 1e3 for b in run1]),
        "GEMM1: SMs": len(sm1),
        "GEMM1: blocks per SM (min)": min(len(v) for v in sm1.values()),
        "GEMM1: blocks per SM (max)": max(len(v) for v in sm1.values()),
        "GEMM1: SM end, 10th percentile": us(sm_end1[len(sm_end1) // 10]),
        "GEMM1: last block end": us(g1_end),
        "GEMM2: blocks run": len(run2),
        "GEMM2: blocks started before GEMM1 end": sum(b["t"][0] < g1_end for b in gemm2),
        "GEMM2: wait returned (median)": us(median([b["t"][1] for b in run2])),
        "GEMM2: first batch multiplied (median)": us(median([b["t"][2] for b in run2])),
        "GEMM2: block time after wait (median us)":
            median([(b["t"][3] - max(b["t"][1], b["t"][0])) / 1e3 for b in run2]),
        "GEMM2: blocks per SM (max)": max(len(v) for v in sm2.values()),
        "GEMM2: blocks started after the first GEMM2 block ended":
            sum(b["t"][0] > min(x["t"][3] for x in run2) for b in run2),
        "GEMM2: last block end": us(max(b["t"][3] for b in gemm2)),
    }
    return f


def sm_end_by_work(launches, work_of, wait_index, end_index):
    """{work on an SM: [that SM's last block end, us after the launch's median wait]} over
    launches (lists of blocks); blocks that did not run (no wait stamp) are left out."""
    table = {}
    for blocks in launches:
        ran = [b for b in blocks if b["t"][wait_index]]
        if not ran:
            continue
        t0 = median([b["t"][wait_index] for b in ran])
        sms = {}
        for b in ran:
            work, end = sms.get(b["sm"], (0, 0))
            sms[b["sm"]] = (work + work_of(b, len(blocks)), max(end, b["t"][end_index]))
        for work, end in sms.values():
            table.setdefault(work, []).append((end - t0) / 1e3)
    return table


def report_sm_table(title, table):
    print(title)
    for work in sorted(table):
        v = table[work]
        print("  %3d on the SM: %5d SM-layers, end mean %6.2f, max %6.2f" %
              (work, len(v), sum(v) / len(v), max(v)))


def report(title, figs):
    print("%d layers; mean over layers (us from the %s)" % (len(figs), title))
    for key in figs[0]:
        print("  %-55s %9.2f" % (key, sum(f[key] for f in figs) / len(figs)))


def main():
    args = sys.argv[1:]
    qkv_tiles = 0
    if len(args) == 3 and args[1] == "--qkv-tiles":
        qkv_tiles = int(args[2])
        args = args[:1]
    if len(args) != 1:
        sys.exit(__doc__)
    attention, moe = read(args[0])
    if not attention and not moe:
        sys.exit("no q/k/v -> attention -> o_proj or MoE chains in " + args[0])
    if attention:
        report("layer's first q/k/v GEMV block start", [layer_figures(*l) for l in attention])
    if moe:
        report("layer's first token path block start", [moe_figures(*l) for l in moe])
        one = lambda b, grid: 1  # GEMM1 / GEMM2: t1 wait returned, t3 end
        report_sm_table("GEMM1: SM end by blocks on the SM",
                        sm_end_by_work([l[1] for l in moe], one, 1, 3))
        report_sm_table("GEMM2: SM end by blocks on the SM",
                        sm_end_by_work([l[2] for l in moe], one, 1, 3))
    if attention and qkv_tiles > 0:  # the Rolling GEMV: t1 wait returned, t2 end
        tiles = lambda b, grid: len(range(b["block"], qkv_tiles, grid))
        report_sm_table("q/k/v: SM end by tiles on the SM",
                        sm_end_by_work([l[0] for l in attention], tiles, 1, 2))


if __name__ == "__main__":
    main()
