"""When a CUDA run's GPU idled, and where its workers were then, from the samples a session writes beside its
record (`sessions/<record>.gpu.jsonl` in the run's work folder):

    python -m opsynth.bench.gpu_series RUN/.opsynth/sessions/*.gpu.jsonl [--idle 0.1] [--stalls 10]

For each file and GPU: the samples' mean busy share; the mean number of workers in each state over the samples
under `--idle` busy and over those above 1 - `--idle` (both ends of NVML's scale, where the stats' weighted means
blur them); the idle seconds of its execution by cause (see `idle_causes`); how its workers' compiles bunch (see
`compile_bunching`) and, where the run counted them, when they began and after what (see `compile_entries`); the
host's cores' busy share over the samples, the idle ones and the busy ones; how busy the GPU was in each state of
its lock, fitted over the samples (see `lock_activity`), with the shares of each sample's whole period and of its
last 1/6 s (NVML's period is one of them); and the longest stretches of consecutive samples under `--idle`, each
with its workers' mean states.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from itertools import pairwise
from pathlib import Path

from opsynth.filters.gpu_busy import LOCK_STATES


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


# A sample counts as the round's change (or the run's end) where at least this share of its GPU's workers has no
# task or holds a verdict not taken, and as compile-bound where at least this share compiles.
UNOCCUPIED_SHARE = 0.4
COMPILING_SHARE = 0.7


def idle_cause(states: dict[str, float]) -> str:
    """Why a GPU idled at a sample, from its workers' states: the rounds' change or the run's end; a timing that
    has the GPU waiting for freed memory's clearing; timings waiting for a task's first forward (a library's first
    use in its process, mostly), for tasks in other steps, or with no task sharing the GPU; most workers
    compiling; or other."""
    workers = sum(states.values()) or 1
    if (states.get("no_task", 0) + states.get("handing_back", 0)) / workers >= UNOCCUPIED_SHARE:
        return "between rounds or at the end"
    if states.get("waiting_for_clearing", 0):
        return "a timing waits for freed memory's clearing"
    if states.get("waiting_to_time", 0):
        if states.get("sharing:first_forward", 0):
            return "timings wait for a first forward"
        if any(state.startswith("sharing:") for state in states):
            return "timings wait for other steps"
        return "timings wait, no task sharing"
    if states.get("compile", 0) / workers >= COMPILING_SHARE:
        return "most workers compiling"
    return "other"


def execution(samples: list[dict], gpu: int) -> list[dict]:
    """The samples from the first in which a worker held `gpu` to the last (its execution)."""
    held = [
        k
        for k, s in enumerate(samples)
        if "workers" in s and any(state.startswith(("sharing:", "alone:")) for state in s["workers"][gpu])
    ]  # none where no worker's state was sampled (a session without its pool)
    return samples[held[0] : held[-1] + 1] if held else []


def idle_causes(samples: list[dict], gpu: int) -> dict[str, float]:
    """The seconds `gpu` idled by cause (`idle_cause`), each sample's idle share over its interval, over its
    execution, most first."""
    causes = Counter()
    for before, sample in pairwise(execution(samples, gpu)):
        causes[idle_cause(sample["workers"][gpu])] += (1 - sample["busy"][gpu]) * (sample["t"] - before["t"])
    return {cause: round(seconds, 2) for cause, seconds in causes.most_common()}


def compile_bunching(samples: list[dict], gpu: int) -> dict | None:
    """How `gpu`'s workers compiling bunch over its execution: the mean number compiling at a sample, the variance
    of that number, and its ratio to the variance were each worker compiling independently of the others at the
    same mean share (a binomial's); over 1, their compiles come together, and with them the GPU's idle spells."""
    counts = [(s["workers"][gpu].get("compile", 0), sum(s["workers"][gpu].values())) for s in execution(samples, gpu)]
    compiling, workers = sum(c for c, _ in counts), sum(n for _, n in counts)
    if len(counts) < 2 or not workers:
        return None
    share = compiling / workers
    mean = compiling / len(counts)
    variance = statistics.pvariance([c for c, _ in counts], mu=mean)
    independent = sum(n * share * (1 - share) for _, n in counts) / len(counts)
    return {
        "mean": round(mean, 2),
        "variance": round(variance, 2),
        "ratio": round(variance / independent, 2) if independent else None,
    }


def compile_entries(samples: list[dict], gpu: int) -> dict | None:
    """The workers of `gpu` that began to compile over its execution (the samples' `into_compile`): how many, the
    share that came from each state (most first), and the variance of their number per sample over its mean (about
    1 where each begins independently of the others; more where they begin together); None where no sample counted
    them (older code)."""
    samples = execution(samples, gpu)
    if not any("into_compile" in s for s in samples):
        return None
    began = [s["into_compile"][gpu] if "into_compile" in s else {} for s in samples]
    per_sample = [sum(b.values()) for b in began]
    total = sum(per_sample)
    if not total:
        return None
    origins = Counter()
    for b in began:
        origins.update(b)
    mean = total / len(per_sample)
    variance = statistics.pvariance(per_sample, mu=mean)
    return {
        "entries": total,
        "from": {state: round(n / total, 2) for state, n in origins.most_common()},
        "dispersion": round(variance / mean, 2),
    }


def host_share(samples: list[dict]) -> str:
    """The host's cores' mean busy share over the `samples` that read it, and how many did."""
    shares = [s["host"] for s in samples if "host" in s]
    return f"{sum(shares) / len(shares):.2f} ({len(shares)})" if shares else "none read"


def lock_activity(samples: list[dict], gpu: int, key: str = "lock") -> dict | None:
    """How busy `gpu` was in each state of its lock (filters.gpu_busy.LOCK_STATES) over its execution: each
    sample's busy share fitted, by non-negative least squares, as the sum over states of the state's share of the
    sample (`key`: of its whole period, `lock`, or of its last 1/6 s, `lock_recent`) times the state's own busy
    share. Per state, the seconds spent in it and the idle seconds the fit puts down to it; with the fit's samples
    and root mean square error. None where the samples have no lock shares."""
    import numpy as np
    from scipy.optimize import nnls

    rows = [(s[key][gpu], s["busy"][gpu], s["t"] - b["t"]) for b, s in pairwise(execution(samples, gpu)) if key in s]
    rows = [row for row in rows if row[0]]
    states = [state for state in LOCK_STATES if any(state in shares for shares, _, _ in rows)]
    if not states:
        return None
    shares = np.array([[row[0].get(state, 0.0) for state in states] for row in rows])
    busy, seconds = np.array([row[1] for row in rows]), np.array([row[2] for row in rows])
    activity = np.minimum(nnls(shares, busy)[0], 1.0)
    rms = float(np.sqrt(np.mean((shares @ activity - busy) ** 2)))
    spent = shares.T @ seconds
    return {
        "samples": len(rows),
        "rms": round(rms, 3),
        "states": {
            state: {"seconds": round(float(s), 1), "busy": round(float(a), 2), "idle_s": round(float(s * (1 - a)), 1)}
            for state, s, a in zip(states, spent, activity, strict=True)
        },
    }


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
        if all("workers" in s for s in samples):
            lines.append(f"  idle seconds by cause: {idle_causes(samples, gpu)}")
            if (bunch := compile_bunching(samples, gpu)) is not None:
                lines.append(f"  workers compiling at a sample: mean {bunch['mean']}, variance {bunch['variance']}, "
                             f"{bunch['ratio']} times that of independent workers")  # fmt: skip
            if (entries := compile_entries(samples, gpu)) is not None:
                lines.append(f"  compiles begun: {entries['entries']}, per sample variance / mean "
                             f"{entries['dispersion']}; from {entries['from']}")  # fmt: skip
        if any("host" in s for s in samples):  # busy cores beside an idle GPU: the host's work bounds it
            lines.append(f"  host cores busy: {host_share(samples)} over all samples, {host_share(low)} over those "
                         f"under {idle:g} busy, {host_share(high)} over those over {1 - idle:g}")  # fmt: skip
        for key, span in (("lock", "whole period"), ("lock_recent", "last 1/6 s")):
            if (fit := lock_activity(samples, gpu, key)) is not None:
                states = ", ".join(
                    f"{state} {v['seconds']} s at {v['busy']:.2f} busy ({v['idle_s']} s idle)"
                    for state, v in fit["states"].items()
                )
                lines.append(f"  lock states ({span} of {fit['samples']} samples, fit rms {fit['rms']}): {states}")
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
