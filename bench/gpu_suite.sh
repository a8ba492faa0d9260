#!/usr/bin/env bash
# The GPU checks and benchmarks in one run on a CUDA machine, from the repository root.
# Writes to $OUT (default gpu-out): suite.log, catalog.log, bench_eager.json, gen.tgz, and with VALIDATE=1
# validate.jsonl. ROWS sets the size of the generated set (default 200), WORKERS its execution workers (default
# 6); DATA names a folder holding ops6k_examples.parquet; CATALOG=0 skips the per-entry run on CUDA.
set -uo pipefail
OUT=${OUT:-gpu-out}
DATA=${DATA:-.gpu-data}
mkdir -p "$OUT"
log="$OUT/suite.log"
step() { echo "== $1 ($(date +%T))" >>"$log"; shift; timeout "$@" >>"$log" 2>&1; echo "== exit $?" >>"$log"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; } >>"$log" 2>&1
step "torch" 60 python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.device_count())"
step "gpu tests" 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/filters/test_execution.py \
  tests/filters/test_kernel_configs.py
if [ "${CATALOG:-1}" != 0 ]; then
  step "every catalog entry on CUDA (gpu workload, eager checks)" 300 sh -c \
    "python3 -m opsynth catalog check --execute --device cuda --no-compile-check >'$OUT/catalog.log' 2>&1"
  tail -3 "$OUT/catalog.log" >>"$log"
fi
step "bench execute, eager checks" 150 python3 -m opsynth bench execute --device cuda --workload gpu --n 300 \
  --no-compile-check --out "$OUT/bench_eager.json"
step "generate ${ROWS:-200} rows with the compile check" 330 python3 -m opsynth generate --out "$OUT/gen" \
  --num-samples "${ROWS:-200}" --device cuda --seed 1 --workers "${WORKERS:-6}"
if [ -n "${VALIDATE:-}" ]; then
  step "validate released examples" 120 python3 -m opsynth validate "$DATA/ops6k_examples.parquet" --device cuda \
    --no-compile-check --workers 4 --report "$OUT/validate.jsonl"
fi
if [ -d "$OUT/gen" ]; then tar czf "$OUT/gen.tgz" -C "$OUT" gen && rm -rf "$OUT/gen"; fi
grep "^== " "$log"
