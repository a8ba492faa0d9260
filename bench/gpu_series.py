"""When a CUDA run's GPU idled, and where its workers were then, from the samples a session writes beside its
record (`sessions/<record>.gpu.jsonl` in the run's work folder):

    python -m opsynth.bench.gpu_series RUN/.opsynth/sessions/*.gpu.jsonl [--idle 0.1] [--stalls 10]

For each file and GPU: the samples' mean busy share; the mean number of workers in each state over the samples
under `--idle` busy and over those above 1 - `--idle` (both ends of NVML's scale, where the stats' weighted means
blur them); and the longest stretches of consecutive samples under `--idle`, each with its workers' mean states.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def read_series(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mean_states(samples: list[dict], gpu: int) -> dict[str, float]:
    """The mean number of `gpu`'s workers in each state over `samples` (those with states), most first."""
    with_states = [s["workers"][gpu] for s in samples if "workers" in s]
    total = Counter()
    for states in with_states:
        total.update(states)
    n = max(1, len(with_states))
    return {state: round(count / n, 2) for state, count in total.most_common()}


def stretches(samples: list[dict], gpu: int, idle: float) -> list[list[dict]]:
    """The runs of consecutive samples whose `gpu` was under `idle` busy, longest first."""
    runs, current = [], []
    for sample in samples:
        if sample["busy"][gpu] < idle:
            current.append(sample)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return sorted(runs, key=lambda run: (-len(run), run[0]["t"]))


def report(samples: list[dict], idle: float, stalls: int) -> list[str]:
    lines = []
    if not samples:
        return ["no samples"]
    for gpu in range(len(samples[0]["busy"])):
        busy = [s["busy"][gpu] for s in samples]
        low = [s for s in samples if s["busy"][gpu] < idle]
        high = [s for s in samples if s["busy"][gpu] > 1 - idle]
        lines.append(f"GPU {gpu}: {len(samples)} samples, mean busy {sum(busy) / len(busy):.3f}")
        lines.append(f"  under {idle:g} busy ({len(low)} samples): {mean_states(low, gpu)}")
        lines.append(f"  over {1 - idle:g} busy ({len(high)} samples): {mean_states(high, gpu)}")
        for run in stretches(samples, gpu, idle)[:stalls]:
            lines.append(f"  {run[0]['t']:.1f}-{run[-1]['t']:.1f} s ({len(run)} samples): {mean_states(run, gpu)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--idle", type=float, default=0.1, help="a sample under this busy share counts as idle")
    parser.add_argument("--stalls", type=int, default=10, help="how many of the longest idle stretches to show")
    args = parser.parse_args(argv)
    for path in args.files:
        print(path)
        print("\n".join(report(read_series(path), args.idle, args.stalls)))


if __name__ == "__main__":
    main()
