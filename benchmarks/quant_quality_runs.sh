#!/usr/bin/env bash
# Issue 10: every quality figure of docs/BENCHMARKS.md "Quality of the quantized paths", one
# mode per process (each resumable: a reference's outputs are kept in a JSON file).
#   bash benchmarks/quant_quality_runs.sh OUT_DIR
# Deterministic (no timing): run it under tools/cpu or tools/bg, never tools/bench.
# 1. against the file's exact model (the Q4_1 / Q8_0 numbers in float32): the bf16 paths as
#    shipped (none, int4, int8, auto) with perplexity, then the quantized kernels in float32
#    (the kernels compute the file's numbers: quantization alone, no bf16 rounding);
# 2. against bf16 `none` (the previous reference): the same bf16 modes and float32 none.
set -u
OUT=${1:-results/quant_quality}
PY=${PY:-/work/tools/py}
mkdir -p "$OUT"
TEXT="--text tests/model/data/apache-2.0.txt --max-text-tokens 1024"
q() { $PY -u benchmarks/quant_quality.py --threads 1 "$@"; }
date -u
q --reference none:float32 --reference-cache "$OUT/ref_fp32.json" $TEXT --modes none int4 int8 auto
q --reference none:float32 --reference-cache "$OUT/ref_fp32.json" $TEXT --skip-perplexity \
  --measures alone forced --modes int4:float32+lm_head int8:float32 int4:float32
q --reference none --reference-cache "$OUT/ref_bf16.json" $TEXT --skip-perplexity \
  --modes int4 int8 auto none:float32
date -u
