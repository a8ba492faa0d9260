"""How often each of the 330 torch operator names occurs in the `ops` lists of CUDA-Agent-Ops-6K.

Counts over its 5,929 torch rows (statistics of that dataset, CC-BY-4.0, ByteDance Seed and Tsinghua AIR), used by
`--op-weights ops6k` to sample operators as often as the released set uses them. The counts are data, in
`data/ops6k_counts.json`, most used first.
"""

from __future__ import annotations

import importlib.resources
import json

OPS6K_COUNTS: dict[str, int] = json.loads(
    importlib.resources.files("opsynth.operator_catalog").joinpath("data", "ops6k_counts.json").read_text("utf-8")
)
