#!/usr/bin/env python3
"""Loads a Tetra-written NVFP4 checkpoint with Hugging Face `safetensors` (PyTorch) and checks the
dtypes and shapes NVFP4.md specifies; with --reference DIR (the BF16 source), also dequantizes
every FP4 weight in PyTorch and reports the relative error against the original.

usage: check_nvfp4_checkpoint.py QUANT_DIR [--reference BF16_DIR]
Exit status 1 on any mismatch."""
import argparse
import glob
import json
import os
import sys

import torch
from safetensors.torch import load_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def load_dir(d):
    tensors = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def dequant(packed, scale, s2):
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)  # even k = low nibble
    vals = E2M1[codes]
    block = scale.float().repeat_interleave(16, dim=1)
    return vals * block * s2.float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("quant_dir")
    ap.add_argument("--reference")
    args = ap.parse_args()
    q = load_dir(args.quant_dir)
    ref = load_dir(args.reference) if args.reference else None
    hf = json.load(open(os.path.join(args.quant_dir, "hf_quant_config.json")))
    print("hf_quant_config:", json.dumps(hf["quantization"]))
    errors = 0
    fp4 = 0
    worst = 0.0
    for name, w in sorted(q.items()):
        if not name.endswith(".weight") or w.dtype != torch.uint8:
            continue
        fp4 += 1
        m = name[: -len(".weight")]
        s, s2 = q.get(m + ".weight_scale"), q.get(m + ".weight_scale_2")
        ok = (s is not None and s.dtype == torch.float8_e4m3fn and s.dim() == 2
              and s.shape[0] == w.shape[0] and s.shape[1] * 8 == w.shape[1]
              and s2 is not None and s2.dtype == torch.float32 and s2.numel() == 1)
        if not ok:
            errors += 1
            print("BAD", name, w.dtype, tuple(w.shape), s.dtype if s is not None else None,
                  tuple(s.shape) if s is not None else None, s2)
            continue
        if torch.isnan(s.float()).any():
            errors += 1
            print("NaN scale in", m)
        if ref is not None and fp4 <= 400:
            x = ref[name].float()
            d = dequant(w, s, s2)
            rel = ((d - x).norm() / x.norm()).item()
            worst = max(worst, rel)
            if rel > 0.2:
                errors += 1
                print("dequant error too large", name, rel)
    example = next(n for n, t in sorted(q.items()) if n.endswith(".weight") and t.dtype == torch.uint8)
    m = example[: -len(".weight")]
    print(f"example {m}: weight {q[m + '.weight'].dtype} {tuple(q[m + '.weight'].shape)}, "
          f"weight_scale {q[m + '.weight_scale'].dtype} {tuple(q[m + '.weight_scale'].shape)}, "
          f"weight_scale_2 {q[m + '.weight_scale_2'].dtype} {tuple(q[m + '.weight_scale_2'].shape)}")
    print(f"{len(q)} tensors, {fp4} FP4 linears, dtype/shape errors: {errors}"
          + (f", worst dequant relative error vs bf16: {worst:.4f}" if ref is not None else ""))
    sys.exit(1 if errors or fp4 == 0 else 0)


if __name__ == "__main__":
    main()
