#!/usr/bin/env bash
# Builds of the package compared on one CUDA machine, from the repository root: the README's 600-row run by each in
# turn, each from empty inductor, Triton and CUDA caches (and a home of its own), NVML sampled every second beside
# it; with REMEASURE=1 each run's rows are then re-measured by one worker alone (150 of them, against the recorded
# `eager_ms`), and with RECHECK=1 checked again whole (every row, validate's default workers and compile check, on
# its own draws). A machine's speed moves a run by more than most changes do: compare builds on one machine, and put
# the build to be judged first (a machine's first run also pays its cold page cache).
#
# BUILDS (default .gpu-builds) holds one folder per build, each with that build's wheel (`pip wheel --no-deps -w
# .gpu-builds/NAME .` on a checkout of it); ORDER names them in the order run (default: every folder). The
# package's dependencies must import already (see docs/development.md). ROWS (default 600) and RUN_S (the limit of
# one run, default 240) size the runs; ARGS_NAME adds options to build NAME's command (ARGS_w20="--workers 20", with
# .gpu-builds/w20 a copy of another build's folder, compares options of one build). ORDER may name a build again
# ("a b a b": a machine can grow faster run after run, so alternate and compare neighbours); its later runs' files are
# NAME.2, NAME.3 and so on where the list below says NAME. Writes to $OUT (default gpu-out): machine.txt (the GPU,
# the cores, the CPU's model and one core's Python speed), NAME.stats.json, NAME.samples (time, GPU use, memory),
# NAME.cpu (time, the host's first /proc/stat line, every second), NAME.gpu.jsonl (the run's own samples, with where
# its workers were), NAME.progress.tgz (each execution's verdict, its phases' seconds included), NAME.out/.err, with
# REMEASURE remeasure_NAME.jsonl/.log, with RECHECK recheck_NAME.jsonl/.log, with either the run's dataset as
# data_NAME.tgz, and summary.txt, one block per run (its busy share as the run measured it, and as NAME.samples read
# over the same stretch; the host's cores' busy share over it, and while the GPU idled); everything is packed into
# all.tgz after each run. FIRST_FORWARDS (options of `python -m opsynth.bench.first_forwards`, "--longest 60" say)
# times the run's longest first forwards again alone after it: first_forwards_NAME.txt/.jsonl/.err. DEVICE=cpu
# (default cuda) runs the same on the CPU, to try the script.
set -u
export PYTHONSAFEPATH=1  # python -m from the repository root imports the installed package, not ./opsynth
OUT=${OUT:-gpu-out}
BUILDS=$(realpath "${BUILDS:-.gpu-builds}")
ORDER=${ORDER:-$(ls "$BUILDS")}
mkdir -p "$OUT/w"
W=$(realpath "$OUT/w")
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; grep -m 1 "model name" /proc/cpuinfo
  # one core's Python speed: hosts of one kind differ, and the workers' compiles (and so the busy share) follow it
  python3 -c "import time; t = time.perf_counter(); sum(i * i for i in range(10**7))
print('python, 10M squares:', round(time.perf_counter() - t, 3), 's')"
} > "$W/machine.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in $ORDER; do
  [ -d "$work/pkg_$name" ] || python3 -m pip install -q --no-index --no-deps --target "$work/pkg_$name" \
    "$BUILDS/$name"/*.whl || exit 1
done
pack() { tar czf "$OUT/all.tgz" -C "$OUT" w; }
summary() {  # NAME RC: one block of summary.txt from the run's stats.json and nvidia-smi's samples beside it
  python3 - "$W/$1.stats.json" "$1" "$2" "$W/$1.samples" "$W/$1.cpu" >> "$W/summary.txt" <<'PY'
import datetime, json, sys
path, name, rc, samples, cpu = sys.argv[1:]
try:
    stats = json.load(open(path))
except (OSError, ValueError) as e:
    sys.exit(print(name, "exit", rc, "no stats:", e))
gpu, counts = stats["timings_s"]["sessions"][0].get("gpu", {}), stats["counts"]  # no "gpu" on the CPU
idle = gpu.get("while_idle", {})
print(name, "exit", rc, "sessions_total", stats["timings_s"]["sessions_total"], "busy", gpu.get("busy_fraction"),
      "over", gpu.get("executing_s"), "before", gpu.get("first_execution_s"), "executions", counts["executions"],
      "per row", counts["executions_per_row"], "ceiling stops", counts.get("ceiling_stops"),
      "host cores busy", gpu.get("host_busy_fraction"))  # the run's own reading (builds before it: None)
print("  rounds (round, wall_s, candidates, executions):",
      [(r["round"], r["wall_s"], r["candidates"], r["executions"]) for r in stats["rounds"]])
print("  idle", idle.get("seconds"), "s; workers meanwhile:",
      {k: v for k, v in idle.get("workers", {}).items() if v >= 0.1})
print("  worker-s by phase:", {k: round(v) for k, v in stats["timings_s"]["execution_worker_phases"].items()})
if gpu.get("executing_s"):  # nvidia-smi's samples over the same stretch (the session's start known to the second)
    first = datetime.datetime.fromisoformat(stats["timings_s"]["sessions"][0]["started"]).replace(tzinfo=None)
    first += datetime.timedelta(seconds=gpu["first_execution_s"])
    last = first + datetime.timedelta(seconds=gpu["executing_s"])
    busy = []
    try:
        lines = open(samples).readlines()
    except OSError:
        lines = []  # no sampler ran
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        try:
            when = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f")
            if first <= when <= last:
                busy.append(float(fields[1].split()[0]))
        except (ValueError, IndexError):
            continue  # a line cut short as the sampler was stopped
    if busy:
        print(f"  nvidia-smi over the execution: {sum(busy) / len(busy):.1f} % busy ({len(busy)} samples)")
    # the host's cores over the same stretch, from /proc/stat's first line: busy = 1 - (idle + iowait) / all
    host, idle_gpu_host, previous = [], [], None
    gpu_at = {}
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        try:
            gpu_at[fields[0][:19]] = float(fields[1].split()[0])  # by the second
        except (ValueError, IndexError):
            continue
    try:
        cpu_lines = open(cpu).readlines()
    except OSError:
        cpu_lines = []
    for line in cpu_lines:
        try:
            stamp, ticks = line.split(" cpu ")
            when = datetime.datetime.strptime(stamp.strip()[:26], "%Y/%m/%d %H:%M:%S.%f")
            counts = [int(x) for x in ticks.split()[:8]]  # guest time is counted within user already
        except ValueError:
            continue  # a line cut short as the sampler was stopped
        if previous is not None and first <= when <= last:
            delta = [a - b for a, b in zip(counts, previous)]
            if sum(delta) > 0:
                share = 1 - (delta[3] + delta[4]) / sum(delta)
                host.append(share)
                gpu = gpu_at.get(when.strftime("%Y/%m/%d %H:%M:%S"))
                if gpu is not None and gpu < 10:
                    idle_gpu_host.append(share)
        previous = counts
    if host:
        print(f"  host cores over the execution: {100 * sum(host) / len(host):.1f} % busy ({len(host)} samples);",
              f"while nvidia-smi read under 10 %: {100 * sum(idle_gpu_host) / max(1, len(idle_gpu_host)):.1f} %",
              f"({len(idle_gpu_host)} samples)")
PY
}
declare -A runs  # how many times each build has run so far
for name in $ORDER; do
  runs[$name]=$(( ${runs[$name]:-0} + 1 ))
  run=$name  # the run's name in its files: the build's, then NAME.2, NAME.3 where ORDER repeats it
  [ "${runs[$name]}" -gt 1 ] && run="$name.${runs[$name]}"
  caches="$work/caches_$run"
  args="ARGS_$name"
  mkdir -p "$caches/home"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$W/$run.samples" &
  monitor=$!
  while :; do echo "$(date '+%Y/%m/%d %H:%M:%S.%6N') $(head -n 1 /proc/stat)"; sleep 1; done > "$W/$run.cpu" &
  cpu_monitor=$!
  PYTHONPATH="$work/pkg_$name:${PYTHONPATH:-}" HOME="$caches/home" TORCHINDUCTOR_CACHE_DIR="$caches/inductor" \
    TRITON_CACHE_DIR="$caches/triton" CUDA_CACHE_PATH="$caches/nv" timeout "${RUN_S:-240}" python3 -m opsynth generate \
    --out "$work/run_$run" --num-samples "${ROWS:-600}" --device "${DEVICE:-cuda}" --seed 11 ${!args:-} \
    > "$W/$run.out" 2> "$W/$run.err"
  rc=$?
  kill "$monitor" "$cpu_monitor"
  cp "$work/run_$run/stats.json" "$W/$run.stats.json" 2>/dev/null
  find "$work/run_$run/.opsynth" -name '*.gpu.jsonl' -exec cat {} + > "$W/$run.gpu.jsonl" 2>/dev/null
  tar czf "$W/$run.progress.tgz" -C "$work/run_$run/.opsynth" progress 2>/dev/null  # each execution's verdict
  summary "$run" "$rc"
  PYTHONPATH="$work/pkg_$name:${PYTHONPATH:-}" python3 -m opsynth.bench.gpu_series "$W/$run.gpu.jsonl" --stalls 6 \
    >> "$W/summary.txt" 2>/dev/null  # a build before its GPU series has none
  if [ -n "${REMEASURE:-}" ]; then
    PYTHONPATH="$work/pkg_$name:${PYTHONPATH:-}" timeout 120 python3 -m opsynth validate "$work/run_$run" --sample 150 \
      --device "${DEVICE:-cuda}" --workers 1 --no-compile-check --report "$W/remeasure_$run.jsonl" > "$W/remeasure_$run.log" 2>&1
    echo "  re-measured: $(tail -n 1 "$W/remeasure_$run.log")" >> "$W/summary.txt"
  fi
  if [ -n "${RECHECK:-}" ]; then  # every row executed again as validate does by default (workers, compile check)
    PYTHONPATH="$work/pkg_$name:${PYTHONPATH:-}" timeout 180 python3 -m opsynth validate "$work/run_$run" \
      --device "${DEVICE:-cuda}" --report "$W/recheck_$run.jsonl" > "$W/recheck_$run.log" 2>&1
    echo "  checked again whole: $(tail -n 1 "$W/recheck_$run.log")" >> "$W/summary.txt"
  fi
  if [ -n "${REMEASURE:-}${RECHECK:-}" ]; then
    tar czf "$W/data_$run.tgz" -C "$work" --exclude=.opsynth "run_$run"
  fi
  if [ -n "${FIRST_FORWARDS:-}" ]; then
    PYTHONPATH="$work/pkg_$name:${PYTHONPATH:-}" timeout 120 python3 -m opsynth.bench.first_forwards "$work/run_$run" \
      --device "${DEVICE:-cuda}" --report "$W/first_forwards_$run.jsonl" $FIRST_FORWARDS \
      > "$W/first_forwards_$run.txt" 2> "$W/first_forwards_$run.err"
    echo "  first forwards alone: $(head -n 2 "$W/first_forwards_$run.txt" | tr '\n' ' ')" >> "$W/summary.txt"
  fi
  pack
done
cat "$W/summary.txt"
