#!/usr/bin/env python3
# Per-kernel summary of an `ncu --csv --page raw` file written by profile_kernels.sh:
#   python3 scripts/gpu/ncu_summary.py FILE.csv
# one row per kernel name: launches, mean us, MB read from HBM, GB/s, grid, block, registers,
# achieved warps-active %.
import csv, sys, collections
f = sys.argv[1]
lines = [l for l in open(f) if l.startswith('"')]
r = list(csv.reader(lines))
hdr = r[0]; rows = r[2:]
ix = {h: i for i, h in enumerate(hdr)}
def g(row, k):
    v = row[ix[k]].replace(',', '')
    try: return float(v)
    except: return v
agg = collections.OrderedDict()
for row in rows:
    name = row[ix['Kernel Name']][:70]
    key = name
    a = agg.setdefault(key, dict(n=0, t=0, rd=0, wr=0, grid=g(row,'launch__grid_size'), blk=g(row,'launch__block_size'),
        reg=g(row,'launch__registers_per_thread'), occ=0, smem=g(row,'launch__shared_mem_per_block')))
    a['n'] += 1; a['t'] += g(row,'gpu__time_duration.sum'); a['rd'] += g(row,'dram__bytes_read.sum'); a['wr'] += g(row,'dram__bytes_write.sum')
    a['occ'] += g(row,'sm__warps_active.avg.pct_of_peak_sustained_active')
print(f"{'kernel':70s} {'n':>4} {'us/call':>8} {'MB rd':>8} {'GB/s':>7} {'grid':>6} {'blk':>4} {'reg':>4} {'occ%':>5}")
tot = 0
for k, a in sorted(agg.items(), key=lambda kv: -kv[1]['t']):
    n = a['n']; t = a['t'] / n / 1000.0  # ns -> us
    tot += a['t']
    mb = a['rd'] / n / 1e6
    print(f"{k:70s} {n:4d} {t:8.2f} {mb:8.2f} {mb*1e6/(t*1e3) if t else 0:7.0f} {a['grid']:6.0f} {a['blk']:4.0f} {a['reg']:4.0f} {a['occ']/n:5.1f}")
print('total us', tot/1000)
