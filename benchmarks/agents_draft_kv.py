"""What a paused session's draft-model KV costs to keep and to drop (docs/AGENTS.md, "A draft
model's KV"), from the simulator's roofline cost model and model specs: per context length, the
target's and the draft's KV bytes, what recomputing the context costs each model (one prefill
of the whole context), and the draft KV's copy both ways over the hardware's host link.

    python benchmarks/agents_draft_kv.py --target llama-3.1-8b --draft llama-3.2-1b --hardware h100
    python benchmarks/agents_draft_kv.py --target llama-3.1-70b --draft llama-3.1-8b \\
        --hardware h100 --target-tp 4

A cost model, not a measurement: the figures are the simulator's (the same ones the `cost`
retention policy weighs there).
"""

from __future__ import annotations

import argparse

from heddle.sim.cost_model import StepShape
from heddle.sim.roofline import RooflineCostModel


def prefill_seconds(model: RooflineCostModel, num_tokens: int) -> float:
    return float(model.step_time(StepShape(((num_tokens, num_tokens),), (), 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="llama-3.1-8b")
    parser.add_argument("--draft", default="llama-3.2-1b")
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--target-tp", type=int, default=1)
    parser.add_argument("--contexts", default="1000,4000,13000,32000")
    args = parser.parse_args()
    target = RooflineCostModel(args.target, args.hardware, tp=args.target_tp)
    draft = RooflineCostModel(args.draft, args.hardware, tp=1)
    t_bytes = target.model.kv_bytes_per_token(args.target_tp)
    d_bytes = draft.model.kv_bytes_per_token(1)
    link = draft.hardware.host_bandwidth
    print(f"# target {args.target} (tp {args.target_tp}), draft {args.draft}, {args.hardware} "
          f"(roofline; host link {link / 1e9:.0f} GB/s)")
    print(f"# KV per token: target {t_bytes / 1024:.0f} KiB per device, draft "
          f"{d_bytes / 1024:.0f} KiB ({d_bytes / t_bytes:.0%})")
    print("| context (tokens) | target KV | draft KV | target recompute | draft recompute | "
          "draft / target recompute | draft KV copy out + back |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(c) for c in args.contexts.split(",")):
        tr, dr = prefill_seconds(target, n), prefill_seconds(draft, n)
        copy = 2 * n * d_bytes / link if link else float("nan")
        print(f"| {n:,} | {n * t_bytes / 2**20:,.0f} MiB | {n * d_bytes / 2**20:,.0f} MiB | "
              f"{tr * 1e3:,.1f} ms | {dr * 1e3:,.1f} ms | {dr / tr:.0%} | {copy * 1e3:,.1f} ms |")


if __name__ == "__main__":
    main()
