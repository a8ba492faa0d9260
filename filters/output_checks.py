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

# Outputs of at most this many elements (in all) are kept for every pair of draws to be compared (see DrawOutputs):
# the verdicts of tiny tasks that turned on the draws were all of outputs of at most 64 elements.
EVERY_PAIR_ELEMENTS = 1 << 16


class DrawOutputs:
    """The draws' outputs, judged as they come: the first draw's kept (the rerun and the compiled model are
    compared with it), every other one reduced at once to whether it agrees with the first and each floating
    output's size, min, max and mean (one fused reduction and a mean, no full-size temporaries). So a task's
    checks hold two draws' outputs at a time, not all of them; `decide` gives the first reason it fails.

    With `cfg.every_pair`, small outputs (at most EVERY_PAIR_ELEMENTS elements in all) are kept, and every two
    draws must be told apart: whether two draws of a small output agree is a matter of chance, which draws other
    than the checker's may not repeat (a distance between two vectors, a loss per sample of a small batch)."""

    def __init__(self, first: list[torch.Tensor], cfg: ExecutionConfig):
        self.first = first
        self.cfg = cfg
        self.ranges: list[tuple[int, float, float, float]] = []  # (numel, min, max, mean); min/max NaN where any is
        self.complex_finite = True
        self.agreeing: list[tuple[int, int]] = []  # pairs of draws whose outputs are not told apart
        self.draws = 0
        small = cfg.every_pair and sum(t.numel() for t in first) <= EVERY_PAIR_ELEMENTS
        self.kept: list[list[torch.Tensor]] | None = [first] if small else None  # every draw, where small
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
        earlier = self.kept if self.kept is not None else [self.first]
        self.agreeing += [(i, self.draws) for i, other in enumerate(earlier) if not self.apart(out, other)]
        if self.kept is not None:
            self.kept.append(out)
        self._reduce(out)

    def apart(self, out: list[torch.Tensor], other: list[torch.Tensor]) -> bool:
        """Whether two draws' outputs differ beyond the tolerance (times `cfg.tolerance_margin`) in the configured
        fraction of their elements (at least one; opsynth.config's DISTINGUISHING_FRACTION)."""
        cfg = self.cfg
        enough = max(1, math.ceil(cfg.distinguishing_fraction * sum(t.numel() for t in out)))
        margin = cfg.tolerance_margin
        return differing_elements(out, other, cfg.atol * margin, cfg.rtol * margin, enough) >= enough

    def decide(self, rerun: list[torch.Tensor]) -> None:
        cfg = self.cfg
        if not self.first:
            raise CheckFailed(RUNTIME_ERROR, "forward returns no tensor")
        if not (self.complex_finite and all(math.isfinite(lo) and math.isfinite(hi) for _, lo, hi, _ in self.ranges)):
            raise CheckFailed(NOT_FINITE, "an output holds NaN or infinity")
        margin = cfg.tolerance_margin
        if not outputs_close(rerun, self.first, cfg.atol / margin, cfg.rtol / margin):
            within = "" if margin == 1 else f" (beyond tolerance / {margin:g})"
            raise CheckFailed(NOT_DETERMINISTIC, f"the same input gave different outputs{within}")
        if self.agreeing:
            (i, j), beyond = self.agreeing[0], "tolerance" if margin == 1 else f"{margin:g} times the tolerance"
            raise CheckFailed(
                INDISTINGUISHABLE_OUTPUTS,
                f"outputs of input draws {i} and {j} differ beyond {beyond} in under "
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
