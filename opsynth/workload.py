"""The size scale of generated tasks, a plain record that the options, the constants and the catalog share."""

from __future__ import annotations

import random
from dataclasses import dataclass

# The floating-point dtypes a task may compute in (`Workload.dtypes`, `generate --dtypes`), float32 first: the one
# every catalog entry takes, and the only one unless asked.
TASK_DTYPES = ("float32", "bfloat16", "float16")


def kept_window(window: tuple[float, float], margin: float) -> tuple[float, float]:
    """The part of a runtime window a kept task's time must lie in, `margin` inside each end (low * (1 + margin),
    high / (1 + margin)), rounded to a millionth of a ms so that it prints as it reads."""
    return round(window[0] * (1 + margin), 6), round(window[1] / (1 + margin), 6)


@dataclass(frozen=True)
class Workload:
    """Size scale of generated tasks: tiny for CPU and CI, gpu for the paper's shapes."""

    name: str
    batch_sizes: tuple[int, ...]  # batch dimension choices
    channels: tuple[int, ...]  # channel / feature-group choices
    features: tuple[int, ...]  # last-dimension sizes of rank-2 and rank-3 inputs
    spatial: dict[int, tuple[int, ...]]  # per input rank, spatial extent choices (rank 3: length, 4: H=W, 5: D)
    max_elements: int  # no tensor of a chain may hold more elements than this
    runtime_window_ms: tuple[float, float]  # eager time window of the runtime filter
    timeout_s: float  # per-candidate wall-clock limit of the execution worker
    min_largest_dim: int = 0  # calibration never shrinks an input below this largest dimension
    # An input holds at most max_elements // input_share elements: room for a chain's tensors to grow.
    input_share: int = 4
    # (dtype, weight) pairs: a task computes in one float dtype, drawn with these weights (only float32: no draw)
    dtypes: tuple[tuple[str, float], ...] = (("float32", 1.0),)

    def task_dtype(self, seed: int) -> str:
        """The float dtype the task of `seed` computes in, drawn with these weights from an RNG of its own: where
        there is one dtype, nothing is drawn, and every other draw of the seed is what it always was."""
        if len(self.dtypes) == 1:
            return self.dtypes[0][0]
        names, weights = zip(*self.dtypes, strict=True)
        return random.Random(f"{seed}:dtype").choices(names, weights=weights)[0]
