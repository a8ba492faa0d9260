"""The output checks of a task's input draws, as the agent's checker sees them: finite, deterministic (a rerun of
the first draw agrees with it), distinguishable (draws' outputs differ), neither vanishing nor constant.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from opsynth.filters.comparison import differing_elements, outputs_close
from opsynth.filters.verdicts import CheckFailed
from opsynth.reasons import INDISTINGUISHABLE_OUTPUTS, NOT_DETERMINISTIC, NOT_FINITE, RUNTIME_ERROR

if TYPE_CHECKING:
    from opsynth.filters.execution import ExecutionConfig


class DrawOutputs:
    """The draws' outputs, judged as they come: the first draw's kept (the rerun and the compiled model are
    compared with it), every other one reduced at once to whether it agrees with the first and each floating
    output's size, min, max and mean (one fused reduction and a mean, no full-size temporaries). So a task's
    checks hold two draws' outputs at a time, not all of them; `decide` gives the first reason it fails."""

    def __init__(self, first: list[torch.Tensor], cfg: ExecutionConfig):
        self.first = first
        self.cfg = cfg
        self.ranges: list[tuple[int, float, float, float]] = []  # (numel, min, max, mean); min/max NaN where any is
        self.complex_finite = True
        self.agreeing: list[int] = []  # draws whose outputs agree with the first's within tolerance
        self.draws = 0
        self._reduce(first)

    def _reduce(self, out: list[torch.Tensor]) -> None:
        self.draws += 1
        for t in out:
            if t.is_floating_point() and t.numel():
                lo, hi = torch.aminmax(t)
                mean = float(t.mean()) if t.numel() > 1 else float(lo)
                self.ranges.append((t.numel(), float(lo), float(hi), mean))
            elif t.is_complex() and not bool(torch.isfinite(t).all()):
                self.complex_finite = False

    def add(self, out: list[torch.Tensor]) -> None:
        if not self.apart(out, self.first):
            self.agreeing.append(self.draws)
        self._reduce(out)

    def apart(self, out: list[torch.Tensor], other: list[torch.Tensor]) -> bool:
        """Whether two draws' outputs differ beyond tolerance in the configured fraction of their elements (at
        least one; opsynth.config's DISTINGUISHING_FRACTION)."""
        enough = max(1, math.ceil(self.cfg.distinguishing_fraction * sum(t.numel() for t in out)))
        return differing_elements(out, other, self.cfg.atol, self.cfg.rtol, enough) >= enough

    def decide(self, rerun: list[torch.Tensor]) -> None:
        cfg = self.cfg
        if not self.first:
            raise CheckFailed(RUNTIME_ERROR, "forward returns no tensor")
        if not (self.complex_finite and all(math.isfinite(lo) and math.isfinite(hi) for _, lo, hi, _ in self.ranges)):
            raise CheckFailed(NOT_FINITE, "an output holds NaN or infinity")
        if not outputs_close(rerun, self.first, cfg.atol, cfg.rtol):
            raise CheckFailed(NOT_DETERMINISTIC, "the same input gave different outputs")
        if self.agreeing:
            raise CheckFailed(
                INDISTINGUISHABLE_OUTPUTS,
                f"outputs of input draws 0 and {self.agreeing[0]} differ beyond tolerance in under "
                f"{cfg.distinguishing_fraction:.1%} of their elements",
            )
        if self.ranges:
            if all(max(-lo, hi) <= cfg.atol for _, lo, hi, _ in self.ranges):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "outputs vanish: all zero within tolerance")
            # assert_close's rule against a constant c is max |t - c| <= atol + rtol |c|, with c the mean: the
            # largest |t - c| is at t's min or max. A single value is trivially constant: a scalar output (a
            # loss, a distance) is judged across draws only.
            spread = [(lo, hi, m) for n, lo, hi, m in self.ranges if n > 1]
            if spread and all(max(hi - m, m - lo) <= cfg.atol + cfg.rtol * abs(m) for lo, hi, m in spread):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "each output is a constant within tolerance")


def check_outputs(outs: list[list[torch.Tensor]], rerun: list[torch.Tensor], cfg: ExecutionConfig) -> None:
    """Every output check of the draws `outs` and the rerun of the first; raises CheckFailed with the first
    reason they fail."""
    judged = DrawOutputs(outs[0], cfg)
    for out in outs[1:]:
        judged.add(out)
    judged.decide(rerun)
