#!/usr/bin/env python3
"""Can compare_hf.py's required variants catch a wrong expert-selection rule?

For every required Glm4Moe variant, float32 logits (local_forward.py, which matches transformers
to ~1e-6) with the right routing against two wrong rules an engine could have:
  - "no bias in choice": e_score_correction_bias left out of the top-k choice;
  - "no group limit":    top-k over all experts, n_group / topk_group ignored (grouped only).
The relative error ||wrong - right|| / ||right|| of the worst of the prompts is printed. A rule
is caught when that error is far above compare_hf.py's 2e-2 bound (here: above 5 x 2e-2).
Exit status 1 when a "decisive" variant does not catch a rule it is built to catch; the
"confident" variants are printed for comparison (their margins are too wide for these rules to
change a choice, which is why the decisive variants exist).

usage: routing_sensitivity.py
"""
import sys

import torch

import compare_hf as ch
from local_forward import forward

CAUGHT = 5 * ch.REL_TOL


def worst_rel(tensors, config, wrong_tensors, wrong_config, prompts):
    worst = 0.0
    for ids in prompts:
        right = forward(tensors, config, ids)[0]
        wrong = forward(wrong_tensors, wrong_config, ids)[0]
        worst = max(worst, ((wrong - right).norm() / right.norm()).item())
    return worst


def main():
    failed = False
    print("| variant | routing | rule | worst-prompt rel err of the wrong rule | caught (> 1e-1) |")
    print("|---|---|---|---|---|")
    for vi, (name, config, opts) in enumerate(ch.VARIANTS):
        if not ch.required(opts) or config["model_type"] != "glm4_moe":
            continue
        t = {k: v.float() for k, v in ch.make_weights(config, 1000 + vi, opts["routing"]).items()}
        g = torch.Generator().manual_seed(100 + vi)
        prompts = [torch.randint(0, config["vocab_size"], (n,), generator=g).tolist() for n in [5, 17, 40]]
        rules = [("no bias in choice",
                  {k: torch.zeros_like(v) if k.endswith("e_score_correction_bias") else v for k, v in t.items()},
                  config)]
        if config.get("n_group", 1) > 1:
            rules.append(("no group limit", t, dict(config, n_group=1, topk_group=1)))
        for rule, wt, wc in rules:
            err = worst_rel(t, config, wt, wc, prompts)
            caught = err > CAUGHT
            if opts["routing"] == "decisive" and not caught:
                failed = True
            print(f"| {name} | {opts['routing']} | {rule} | {err:.2e} | {'yes' if caught else 'no'} |",
                  flush=True)
    print(f"exit status {1 if failed else 0}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
