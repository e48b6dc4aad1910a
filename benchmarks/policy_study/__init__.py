"""Every scheduling policy on four workloads: which work to batch together, which to isolate.

Run from the repository root (outputs under results/; the figures in docs/ only with
`--plots docs/policies` or `--plots docs/policies/real`):

    .venv/bin/python -m benchmarks.policy_study sim --jobs 2      # the whole study, ~20 min
    .venv/bin/python -m benchmarks.policy_study report            # tables + plots from the JSON
    .venv/bin/python -m benchmarks.policy_study real              # ~1 h 40 min on 2 cores
    .venv/bin/python -m benchmarks.policy_study real --predict    # the real plan, simulated

`sim`: in the simulator at GPU scale (Llama-3.1-8B on one H100, roofline). First each
workload's fcfs saturation throughput is measured (and static's, for the Orca comparison);
then every policy runs at loads given as fractions of it; then the points the targets of
issue 5 depend on are rerun with more seeds. Raw results: results/policies_sim.json; tables:
results/policies_sim.md; plots: results/policies/*.png.

`real`: the same policies on the real CPU engine (embedded SmolLM2-135M) at two loads, the
workloads scaled down, arrivals replayed in real time. Run it on a quiet machine. Raw results:
results/policies_real.json; tables: results/policies_real.md; plots: results/policies/real/.

Modules: spec (policies, workloads, tuning), sim and real (one run of each kind), metrics (what
a run reports), targets (the targets of issue 5), report (tables and plots), __main__ (the
command line).
"""
