"""What each part of the profiled cost model is worth, on the steps the real engine ran.

`benchmarks/sim_fidelity.py` saves the profile's own timed shapes (`.profile_steps.json`, the
grid's first, then the random steps in quarters: decode-only, mixed, mixed filling the budget,
a light load's first step) and the real runs' steps (`.steps.json`). This refits the same
profile samples four ways, on the virtual clock (seconds, no model):

- without the layer-path terms (`prefill_step`, `prefill_step_decode_tokens`) and without the
  light-load shapes: the third pass's model;
- with the light-load shapes only; with the layer-path terms only; with both (the profile);

and prints, for each, the fit's held-out error and its error on the real steps (median and
p90 |error|, and the signed median of the kinds of step the issue named: decodes, and steps
with a 17-64-token prompt chunk).

    python benchmarks/fidelity_terms.py results/r4/auto/sim_fidelity.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from heddle.hostinfo import machine_line
from heddle.model.step_log import load_steps
from heddle.sim.profiled import fit_profile
from heddle.sim.step_error import step_errors

LAYER_PATH = ("prefill_step", "prefill_step_decode_tokens")
BUCKETS = ("decode b=1 ctx<=256", "decode b=2-4 ctx<=256", "decode b=5-16 ctx<=256",
           "mixed b=1 tok=17-64", "mixed b=2-4 tok=17-64", "mixed b=5-16 tok=17-64",
           "prefill tok=17-64")  # fmt: skip


def variants(samples: list[Any], num_grid: int) -> dict[str, tuple[list[Any], tuple[str, ...]]]:
    """name -> (samples, terms held at zero). Random shape j is of quarter j % 4; the light
    load's steps are quarter 3."""
    without_light = samples[:num_grid] + [s for j, s in enumerate(samples[num_grid:])
                                          if j % 4 != 3]  # fmt: skip
    return {
        "third pass: neither": (without_light, LAYER_PATH),
        "+ light-load shapes": (samples, LAYER_PATH),
        "+ layer-path terms": (without_light, ()),
        "both (this profile)": (samples, ()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a sim_fidelity.py output (RESULTS.json)")
    args = parser.parse_args()
    base = Path(args.results)
    samples, meta = load_steps(base.with_suffix(".profile_steps.json"))
    real, _ = load_steps(base.with_suffix(".steps.json"))
    dispatch = meta.get("dispatch_rows") or ()
    print(f"{len(samples)} profiled shapes ({meta['num_grid']} grid), {len(real)} real steps, "
          f"{meta.get('dtype')}, switches at {list(dispatch)}; {machine_line()}")  # fmt: skip
    header = ["variant", "shapes", "held out p50 / p90", "real steps p50 / p90",
              *(f"{b} (signed)" for b in BUCKETS)]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for name, (chosen, without) in variants(samples, int(meta["num_grid"])).items():
        model = fit_profile(chosen, held_out=0.25, seed=int(meta.get("seed", 0)),
                            dispatch_rows=dispatch, without=without)  # fmt: skip
        fit = model.metadata.fit
        assert fit is not None and fit.held_out_median_abs is not None
        assert fit.held_out_p90_abs is not None
        report = step_errors(model, real)
        signed = {b.name: b for b in report.buckets}
        cells = [name, str(len(chosen)),
                 f"{100 * fit.held_out_median_abs:.1f}% / {100 * fit.held_out_p90_abs:.1f}%",
                 f"{100 * report.overall.median_abs:.1f}% / {100 * report.overall.p90_abs:.1f}%",
                 *(f"{100 * signed[b].median_signed:+.1f}% ({signed[b].num_steps})"
                   .replace("-", "−") if b in signed else "—" for b in BUCKETS)]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
