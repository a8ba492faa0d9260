"""The options of `opsynth generate`: one frozen object, parsed and validated from the command line.

Everything a run's result depends on is in `GenerateOptions.fingerprint()`, which resume compares.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from opsynth.config import DATA_SOURCES, MIXTURE_ALIASES, PRESETS, WORKLOADS
from opsynth.errors import UsageError
from opsynth.workload import TASK_DTYPES, Workload

MIXTURE_SLACK = 0.1  # percent by which --mixture's shares may miss 100 (thirds written as 33.33)


@dataclass(frozen=True)
class GenerateOptions:
    out: str  # output folder
    num_samples: int  # rows in the dataset
    seed: int  # run seed: same seed, same GPU class => same dataset
    preset: str  # named recipe (ops6k, ...)
    mixture: dict[str, float]  # data_source -> share in percent (sums to 100)
    op_weights: str  # uniform, or ops6k: operators drawn as often as the released set uses them
    device: str  # cpu or cuda (auto is resolved before this object is made)
    workload: str  # tiny or gpu
    runtime_window_ms: tuple[float, float]
    kernelbench: str  # embedded, hub, or a path
    similarity_threshold: float  # AST similarity (raw or normalized) above which a task is a near-duplicate
    jaccard_threshold: float  # MinHash Jaccard above which a task is a KernelBench near-duplicate
    compile_check: bool
    timeout_s: float  # per-candidate execution limit
    workers: int  # execution worker processes
    batch_size: int  # candidates handed to the worker pool at once
    shared_checks: bool = True  # CUDA: a few tasks' checks may share a GPU (timings never do)
    work_dir: str | None = None  # round outputs and checkpoints, anywhere Beam can write (default DIR/.opsynth)
    max_elements: int | None = None  # the element budget where the GPU's memory sets it (else the workload's)
    accelerator: str | None = None  # the execution stage's accelerator resource hint, in the runner's format
    quiet: bool = False  # no progress lines: only warnings, errors and the final line
    dtypes: dict[str, float] | None = None  # the tasks' dtypes and their weights (None: float32 alone)

    @property
    def sizes(self) -> Workload:
        """The workload that candidates are made at: the named one, under this run's element budget."""
        workload = WORKLOADS[self.workload]
        if self.max_elements is not None:
            workload = replace(workload, max_elements=self.max_elements)
        return workload if self.dtypes is None else replace(workload, dtypes=tuple(self.dtypes.items()))

    def fingerprint(self) -> dict:
        """What must match for a run in an existing folder to resume it."""
        d = asdict(self)
        d.pop("out")
        d.pop("work_dir")
        d["runtime_window_ms"] = list(self.runtime_window_ms)
        for volatile in ("workers", "batch_size", "timeout_s", "shared_checks", "accelerator", "quiet"):
            d.pop(volatile)
        if self.dtypes is None:
            d.pop("dtypes")  # as runs made before --dtypes existed recorded it
        return d


def _named_numbers(text: str, option: str, what: str, resolve, unknown, bare: float | None = None) -> dict[str, float]:
    """`NAME=NUMBER,...` -> {resolve(NAME): NUMBER}, each a finite number of at least 0 and no name twice;
    `resolve` gives None for a name it does not know, `unknown(part, name)` says what to write instead; a bare
    NAME counts `bare` where given."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name = name.strip()
        key = resolve(name)
        if key is None or (not sep and bare is None):
            raise UsageError(f"{option}: {unknown(part, name)}")
        try:
            number = float(value) if sep else bare
        except ValueError:
            raise UsageError(f"{option}: {what} of {name} is not a number: {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise UsageError(f"{option}: {what} of {name} must be a non-negative number, got {value!r}")
        if key in values:
            raise UsageError(f"{option}: {name} is given twice")
        values[key] = number
    return values


def parse_mixture(text: str) -> dict[str, float]:
    """`torch1=3.40,torch2=83.77,...` (or `torch#1=...`) -> shares in percent summing to 100."""
    shares = _named_numbers(
        text,
        "--mixture",
        "share",
        resolve=lambda name: MIXTURE_ALIASES.get(name, name if name in DATA_SOURCES else None),
        unknown=lambda part, _: (
            f"bad entry {part!r}; write NAME=SHARE with NAME in {', '.join(MIXTURE_ALIASES)}, "
            "e.g. --mixture torch1=10,torch2=90"
        ),
    )
    total = sum(shares.values())
    if abs(total - 100.0) > MIXTURE_SLACK:
        raise UsageError(
            f"--mixture: the shares add up to {total:g}, not 100; give percentages, e.g. --mixture torch1=20,torch2=80"
        )
    return {s: shares.get(s, 0.0) * 100.0 / total for s in DATA_SOURCES}


def parse_dtypes(text: str) -> dict[str, float] | None:
    """`float32=80,bfloat16=20` (weights, in any unit) or `float32,bfloat16` (even) -> {dtype: weight} in
    TASK_DTYPES order, zero weights dropped; None where float32 alone is left (the default)."""
    weights = _named_numbers(
        text,
        "--dtypes",
        "weight",
        resolve=lambda name: name if name in TASK_DTYPES else None,
        unknown=lambda _, name: (
            f"unknown dtype {name!r}; choose among {', '.join(TASK_DTYPES)}, "
            "e.g. --dtypes float32=80,bfloat16=10,float16=10"
        ),
        bare=1.0,
    )
    if not any(weights.values()):
        raise UsageError("--dtypes: give at least one dtype a positive weight, e.g. --dtypes float32=80,bfloat16=20")
    ordered = {d: weights[d] for d in TASK_DTYPES if weights.get(d)}
    return None if list(ordered) == ["float32"] else ordered


def parse_window(text: str) -> tuple[float, float]:
    """`LO,HI` in milliseconds."""
    parts = text.split(",")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise UsageError(f"--runtime-window-ms: expected LO,HI in milliseconds (e.g. 1,100), got {text!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low < 0 or high <= low:
        raise UsageError(f"--runtime-window-ms: need 0 <= LO < HI, got {text!r}")
    return low, high


def quotas(num_samples: int, mixture: dict[str, float]) -> dict[str, int]:
    """Rows per data source: floor of N x share, the remainder to the largest fractional parts (ties in order)."""
    exact = {s: num_samples * mixture.get(s, 0.0) / 100.0 for s in DATA_SOURCES}
    counts = {s: math.floor(v) for s, v in exact.items()}
    missing = num_samples - sum(counts.values())
    by_remainder = sorted(DATA_SOURCES, key=lambda s: (-(exact[s] - counts[s]), DATA_SOURCES.index(s)))
    for s in by_remainder[:missing]:
        counts[s] += 1
    return counts


def check_preset(name: str) -> dict:
    if name not in PRESETS:
        raise UsageError(f"--preset: unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def check_workload(name: str) -> str:
    if name not in WORKLOADS:
        raise UsageError(f"--workload: unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return name
