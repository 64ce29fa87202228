#!/usr/bin/env python3
"""Reads the per-block stamps of one decode step (`tetra bench decode --block-stamps PATH`, a
build with -DTETRA_BLOCK_STAMPS=ON; layout in src/perf/block_stamps.h) and prints, averaged over
the step's layers, where the q/k/v GEMV -> attention -> o_proj chain spends its time: when each
kernel's blocks start, when their griddepcontrol.wait returns, the attention's phases, how many
SMs the attention's blocks share, and how long o_proj's blocks compute after their wait.

    python3 scripts/gpu/block_stamps.py stamps.b1.c1024.bin
Times are microseconds from the first q/k/v GEMV block's start in the same layer."""
import statistics
import struct
import sys

WORDS = 10  # kBlockStampWords
QKV, ATTN, STREAM = 1, 2, 3


def read(path):
    data = open(path, "rb").read()
    launches = {}
    for i in range(len(data) // (8 * WORDS)):
        w = struct.unpack_from("<%dQ" % WORDS, data, i * 8 * WORDS)
        kind, launch = w[0] >> 56, (w[0] >> 32) & 0xFFFFFF
        launches.setdefault((kind, launch), []).append({"sm": w[1], "t": w[2:]})
    # In time order; a layer is a q/k/v GEMV, then the attention, then the o_proj GEMV.
    ordered = sorted(launches.items(), key=lambda kv: min(b["t"][0] for b in kv[1]))
    layers = []
    for i in range(len(ordered) - 2):
        kinds = [ordered[i + j][0][0] for j in range(3)]
        if kinds == [QKV, ATTN, STREAM]:
            layers.append(tuple(ordered[i + j][1] for j in range(3)))
    return layers


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
    return f


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    layers = read(sys.argv[1])
    if not layers:
        sys.exit("no q/k/v -> attention -> o_proj layers in " + sys.argv[1])
    figs = [layer_figures(*l) for l in layers]
    print("%d layers; mean over layers (us from the layer's first q/k/v GEMV block start)" % len(figs))
    for key in figs[0]:
        print("  %-45s %9.2f" % (key, sum(f[key] for f in figs) / len(figs)))


if __name__ == "__main__":
    main()
