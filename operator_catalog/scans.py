"""Scans: cumulative sums, products and extrema along one non-batch dimension."""

from __future__ import annotations

from opsynth.operator_catalog.entry import OpCall, OpEntry, SampleContext

FAMILY = "scans"
RANKS = (2, 3, 4, 5)


def _scan(name: str, values_of_tuple: bool = False):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(
            name=name,
            style="function",
            target=name,
            kwargs=(("dim", ctx.non_batch_dim()),),
            output_index=0 if values_of_tuple else None,
        )

    return sample


ENTRIES = [
    OpEntry(name="torch.cumsum", family=FAMILY, sampler=_scan("torch.cumsum"), ranks=RANKS),
    OpEntry(
        name="torch.cumprod",
        family=FAMILY,
        sampler=_scan("torch.cumprod"),
        ranks=RANKS,
        notes="long products of N(0,1) values vanish; the distinguishability filter drops those",
    ),
    OpEntry(name="torch.cummax", family=FAMILY, sampler=_scan("torch.cummax", values_of_tuple=True), ranks=RANKS),
    OpEntry(name="torch.cummin", family=FAMILY, sampler=_scan("torch.cummin", values_of_tuple=True), ranks=RANKS),
]
