#!/usr/bin/env bash
# Issue 10: the quality figures of docs/BENCHMARKS.md "Quality of the quantized paths", one mode
# per process (a reference's outputs are kept in a JSON file, made by the first process that
# needs it, then read):
#   bash benchmarks/quant_quality_runs.sh OUT_DIR
# Deterministic (no timing): run it under tools/cpu or tools/bg, never tools/bench. On the
# shared 2-core box, loaded, it took ~1 hour (int4:float32 alone ~28 min: torch's float32 int4
# kernel is ~20x slower than its bf16 one).
# Against the file's exact model (its Q4_1 / Q8_0 numbers in float32, `none:float32`):
#   bf16 none (bf16 rounding alone), int4 in float32 (quantization alone), and the bf16 paths as
#   shipped (int4, auto) with perplexity;
# against bf16 `none` (the reference of the earlier passes' tables): int8, int4, auto.
set -u
OUT=${1:-results/quant_quality}
PY=${PY:-/work/tools/py}
mkdir -p "$OUT"
TEXT="--text tests/model/data/apache-2.0.txt --max-text-tokens 1024"
q() { $PY -u benchmarks/quant_quality.py --threads 1 "$@"; }
FP32="--reference none:float32 --reference-cache $OUT/ref_fp32.json $TEXT"
BF16="--reference none --reference-cache $OUT/ref_bf16_notext.json"
date -u
q $FP32 --modes none
q $FP32 --skip-perplexity --measures alone forced --modes int4:float32
q $FP32 --modes int4 auto
q $BF16 --modes int8 int4 auto
date -u
