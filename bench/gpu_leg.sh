#!/usr/bin/env bash
# One leg of a long `generate` run on a CUDA machine, from the repository root: runs (or resumes) the run in RUN
# for at most LEG_S seconds (then sends SIGINT, Ctrl-C's signal: generate records its session and stops), samples
# the GPU's use and the verdicts checkpointed every 5 s, and packs the run folder into $OUT in parts of at most
# 15 MB; the next leg, which may start on a fresh machine, resumes it from those parts put in .gpu-state/ (where
# RUN is absent), with run.code beside them: only the code that made it resumes it, unless RESUME_OTHER_CODE=1.
# When the run finishes, the dataset folder (without its work files) is packed as dataset.tgz.* parts, which a
# later call unpacks the same way.
#
# Before the leg: CHECK=1 runs the GPU tests and stops there if they fail; VALIDATE=1 validates the released
# examples in DATA (default .gpu-data); REMEASURE=FILE validates the tasks of a Parquet file with one worker (to
# compare their eager times with those the run's workers measured); BENCH=1 runs `bench execute` (BENCH_N
# candidates, default 200) with exclusive and with shared checks (BENCH_MODES, to run one of them).
# RUN outside the repository (say /tmp/ops6k) survives between legs on a machine kept between them: a leg finding it
# there resumes it without unpacking. The package runs as installed (PYTHONSAFEPATH: not the sources beside it).
# Once the run has finished: RESAMPLE=N measures N of its rows again with one worker, nothing else on the GPU;
# RECHECK=1 checks every row of it again whole (the default workers, the compile check, validate's own draws);
# then VALIDATE=after validates the released examples. PROGRESS=1 packs the run's checkpointed verdicts (each
# task's phases and measurements) as progress.tgz, whether or not the run has finished.
# ARGS: generate's options after --out (default: ops6k on CUDA, the README's seed and defaults). DEVICE: the
# validations' device.
# BUDGET_S: seconds the whole script may take (counted from its start); the leg is cut short so that what
# follows it still fits.
set -uo pipefail
export PYTHONSAFEPATH=1  # python -m from the repository root imports the installed package, not ./opsynth
OUT=${OUT:-gpu-out}
RUN=${RUN:-.gpu-run/ops6k}
LEG_S=${LEG_S:-540}
ARGS=${ARGS:---preset ops6k --device cuda --seed 11}
DEVICE=${DEVICE:-cuda}  # of the validations
mkdir -p "$OUT" "$(dirname "$RUN")"
code_id() {  # the installed package's code: its files (Python and the catalog's and index's data), hashed
  python3 -c 'import hashlib, pathlib, opsynth
root = pathlib.Path(opsynth.__file__).parent
digest = hashlib.sha256()
for f in sorted(f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts):
    digest.update(str(f.relative_to(root)).encode() + f.read_bytes())
print(digest.hexdigest()[:16])'
}
CODE=$(code_id)
if [ ! -d "$RUN" ] && ls .gpu-state/run.tgz.* >/dev/null 2>&1 && [ -z "${RESUME_OTHER_CODE:-}" ] \
  && [ "$(cat .gpu-state/run.code 2>/dev/null)" != "$CODE" ]; then  # a stale run left in .gpu-state
  echo "the carried run in .gpu-state was made by other code ($(cat .gpu-state/run.code 2>/dev/null || echo unknown)," \
    "installed: $CODE): empty .gpu-state, or set RESUME_OTHER_CODE=1 to resume it anyway"
  exit 2
fi
for packed in run dataset; do  # a run to resume, or a finished one (to re-measure: RESAMPLE, VALIDATE=after)
  if [ ! -d "$RUN" ] && ls .gpu-state/$packed.tgz.* >/dev/null 2>&1; then
    cat .gpu-state/$packed.tgz.* | tar xzf - -C "$(dirname "$RUN")"
    echo "unpacked the carried $packed into $RUN"
  fi
done
if [ -n "${CHECK:-}" ]; then  # the GPU tests first: a broken check must not put its verdicts into the run
  if ! timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/filters/test_execution.py \
    >"$OUT/check.log" 2>&1; then
    tail -30 "$OUT/check.log"
    echo "the GPU tests failed: the leg does not run"
    exit 1
  fi
fi
validate_released() {  # the released examples re-measured on this GPU, for the comparison
  timeout "$1" python3 -m opsynth validate "${DATA:-.gpu-data}/ops6k_examples.parquet" --device "$DEVICE" \
    --no-compile-check --workers 4 --report "$OUT/validate.jsonl" >"$OUT/validate.log" 2>&1
  tail -1 "$OUT/validate.log"
}
if [ -n "${VALIDATE:-}" ] && [ "$VALIDATE" != after ]; then
  validate_released 240
fi
if [ -n "${REMEASURE:-}" ]; then  # rows of the run re-measured by one worker, with no other work on the GPU
  timeout 240 python3 -m opsynth validate "$REMEASURE" --device "$DEVICE" --no-compile-check --workers 1 \
    --report "$OUT/remeasure.jsonl" >"$OUT/remeasure.log" 2>&1
fi
if [ -n "${BENCH:-}" ]; then  # the execution stage alone, exclusive and shared checks, before the leg
  for mode in ${BENCH_MODES:-exclusive shared}; do
    flag=$([ "$mode" = exclusive ] && echo --exclusive-checks)
    # shellcheck disable=SC2086
    timeout 150 python3 -m opsynth bench execute --device cuda --workload gpu --n "${BENCH_N:-200}" $flag \
      --out "$OUT/bench_$mode.json" >>"$OUT/bench.log" 2>&1
  done
fi
(while sleep 5; do  # time, GPU use, GPU memory, checkpointed verdicts, of which kept
  verdicts=$(find "$RUN/.opsynth/progress" -name '*.jsonl' -exec cat {} + 2>/dev/null | wc -l)
  kept=$(find "$RUN/.opsynth/progress" -name '*.jsonl' -exec cat {} + 2>/dev/null | grep -c '"reason": "keep"')
  echo "$(date +%T), $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader), $verdicts, $kept"
done) >"$OUT/gpu.csv" 2>&1 &
monitor=$!
if [ -n "${BUDGET_S:-}" ] && [ $((BUDGET_S - SECONDS - 45)) -lt "$LEG_S" ]; then
  LEG_S=$((BUDGET_S - SECONDS - 45))
  echo "the leg runs $LEG_S s, to end within BUDGET_S=$BUDGET_S s"
fi
if [ -f "$RUN/stats.json" ]; then
  echo "the run in $RUN has finished" | tee "$OUT/leg.log"
else
  # shellcheck disable=SC2086
  timeout -s INT -k 30 "$LEG_S" python3 -m opsynth generate --out "$RUN" $ARGS 2>&1 | tee "$OUT/leg.log"
  echo "generate exited with ${PIPESTATUS[0]}" | tee -a "$OUT/leg.log"
fi
kill "$monitor" 2>/dev/null
validate_finished() {  # NAME WHAT OPTIONS...: validate the finished set within the budget left, to $OUT/NAME.*
  local name=$1 what=$2 left=$((${BUDGET_S:-100000} - SECONDS - 40))
  shift 2
  [ "$left" -gt 30 ] || return 0
  echo "$what of the finished set (at most $left s)"
  timeout "$left" python3 -m opsynth validate "$RUN" --device "$DEVICE" --report "$OUT/$name.jsonl" "$@" \
    >"$OUT/$name.log" 2>&1
  tail -2 "$OUT/$name.log"
}
if [ -f "$RUN/stats.json" ] && [ -n "${RESAMPLE:-}" ]; then  # RESAMPLE rows measured again, one worker alone
  validate_finished resample "re-measuring $RESAMPLE rows" --sample "$RESAMPLE" --no-compile-check --workers 1
fi
if [ -f "$RUN/stats.json" ] && [ -n "${RECHECK:-}" ]; then  # every row checked again whole
  validate_finished recheck "checking again every row" --exit-zero
fi
if [ -n "${PROGRESS:-}" ] && [ -d "$RUN/.opsynth/progress" ]; then
  tar czf "$OUT/progress.tgz" -C "$RUN/.opsynth" progress
fi
if [ -f "$RUN/stats.json" ] && [ "${VALIDATE:-}" = after ]; then
  left=$((${BUDGET_S:-100000} - SECONDS - 40))
  [ "$left" -gt 60 ] && validate_released "$((left < 240 ? left : 240))"
fi
if [ -f "$RUN/stats.json" ]; then
  cp "$RUN/stats.json" "$OUT/stats.json"
  tar czf - -C "$(dirname "$RUN")" --exclude=.opsynth "$(basename "$RUN")" | split -b 15M - "$OUT/dataset.tgz."
else
  tar czf - -C "$(dirname "$RUN")" "$(basename "$RUN")" | split -b 15M - "$OUT/run.tgz."
  echo "$CODE" >"$OUT/run.code"  # carried with the parts: the next leg resumes it only with the same code
fi
ls -la "$OUT"
