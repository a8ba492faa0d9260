"""The output checks of a task's input draws, as the agent's checker sees them: finite, deterministic (a rerun of
the first draw agrees with it), distinguishable (draws' outputs differ), neither vanishing nor constant.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from opsynth.filters.comparison import differing_counts, outputs_close, read_back
from opsynth.filters.verdicts import CheckFailed
from opsynth.reasons import INDISTINGUISHABLE_OUTPUTS, NOT_DETERMINISTIC, NOT_FINITE, RUNTIME_ERROR

if TYPE_CHECKING:
    from opsynth.filters.execution import ExecutionConfig

# Two input draws tell a task's outputs apart when this share of their elements differ beyond tolerance.
DISTINGUISHING_FRACTION = 1e-3


class DrawOutputs:
    """The draws' outputs, judged as they come: the first draw's kept (the rerun and the compiled model are
    compared with it), every other one reduced at once, on its device, to how many of its elements differ from
    the first's beyond tolerance, and each floating output's size, min, max and mean (one fused reduction and a
    mean, no full-size temporaries). So a task's checks hold two draws' outputs at a time, not all of them. What
    the reductions found is read back once, by `decide`, which gives the first reason the task fails: each read
    from a GPU is a wait for it, and where other tasks' checks share it, a wait for this task's turn on it too."""

    def __init__(self, first: list[torch.Tensor], cfg: ExecutionConfig):
        self.first = first
        self.cfg = cfg
        self.draws = 0
        # Per later draw: how many elements of each output differ from the first's, and how many make it apart.
        self._differing: list[tuple[list[torch.Tensor | int], int]] = []
        self._ranges: list[tuple[int, torch.Tensor]] = []  # per floating output: numel, and [min, max, mean]
        self._finite: list[torch.Tensor] = []  # per complex output: whether all its elements are finite
        self._reduce(first)

    def _reduce(self, out: list[torch.Tensor]) -> None:
        self.draws += 1
        for t in out:
            if t.is_floating_point() and t.numel():
                lo, hi = torch.aminmax(t)
                self._ranges.append((t.numel(), torch.stack([lo, hi, t.mean() if t.numel() > 1 else lo])))
            elif t.is_complex():
                self._finite.append(torch.isfinite(t).all())

    def add(self, out: list[torch.Tensor]) -> None:
        """A later draw's outputs, reduced (nothing read back from the device)."""
        # Told apart from the first's where DISTINGUISHING_FRACTION of their elements differ (at least one): a
        # task whose outputs are one value but for a few extremes (a saturated tanh) would be told apart by those
        # extremes alone, and so by one seed and not another.
        enough = max(1, math.ceil(DISTINGUISHING_FRACTION * sum(t.numel() for t in out)))
        self._differing.append((differing_counts(out, self.first, self.cfg.atol, self.cfg.rtol), enough))
        self._reduce(out)

    def decide(self, rerun: list[torch.Tensor]) -> None:
        cfg = self.cfg
        if not self.first:
            raise CheckFailed(RUNTIME_ERROR, "forward returns no tensor")
        counts = [c for counted, _ in self._differing for c in counted]
        read = iter(read_back([*counts, *(r for _, r in self._ranges), *self._finite]))
        differing = [sum(sum(next(read)) for _ in counted) for counted, _ in self._differing]
        ranges = [(n, *next(read)) for n, _ in self._ranges]
        finite = all(next(read) == [1.0] for _ in self._finite)
        if not (finite and all(math.isfinite(lo) and math.isfinite(hi) for _, lo, hi, _ in ranges)):
            raise CheckFailed(NOT_FINITE, "an output holds NaN or infinity")
        if not outputs_close(rerun, self.first, cfg.atol, cfg.rtol):
            raise CheckFailed(NOT_DETERMINISTIC, "the same input gave different outputs")
        for draw, ((_, enough), found) in enumerate(zip(self._differing, differing, strict=True), start=1):
            if found < enough:
                raise CheckFailed(
                    INDISTINGUISHABLE_OUTPUTS,
                    f"outputs of input draws 0 and {draw} differ beyond tolerance in under "
                    f"{DISTINGUISHING_FRACTION:.1%} of their elements",
                )
        if ranges:
            if all(max(-lo, hi) <= cfg.atol for _, lo, hi, _ in ranges):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "outputs vanish: all zero within tolerance")
            # assert_close's rule against a constant c is max |t - c| <= atol + rtol |c|, with c the mean: the
            # largest |t - c| is at t's min or max. A single value is trivially constant: a scalar output (a
            # loss, a distance) is judged across draws only.
            spread = [(lo, hi, m) for n, lo, hi, m in ranges if n > 1]
            if spread and all(max(hi - m, m - lo) <= cfg.atol + cfg.rtol * abs(m) for lo, hi, m in spread):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "each output is a constant within tolerance")


def check_outputs(outs: list[list[torch.Tensor]], rerun: list[torch.Tensor], cfg: ExecutionConfig) -> None:
    """Every output check of the draws `outs` and the rerun of the first; raises CheckFailed with the first
    reason they fail."""
    judged = DrawOutputs(outs[0], cfg)
    for out in outs[1:]:
        judged.add(out)
    judged.decide(rerun)
