"""Reductions along one non-batch dimension: sums, means, extrema, norms, and their index forms.

`torch.max`-style calls that return (values, indices) keep the values; argmax-style ones return int64,
which the composer casts back to float if another operator follows.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import OpCall, OpEntry, SampleContext

FAMILY = "reductions"
RANKS = (2, 3, 4, 5)


def _reduce(name: str, keepdim: bool = True, values_of_tuple: bool = False, extra: tuple = ()):
    def sample(ctx: SampleContext) -> OpCall:
        kwargs = [("dim", ctx.non_batch_dim())]
        if keepdim:
            kwargs.append(("keepdim", ctx.rng.random() < 0.5))
        return OpCall(
            name=name,
            style="function",
            target=name,
            kwargs=tuple(kwargs) + extra,
            output_index=0 if values_of_tuple else None,
        )

    return sample


ENTRIES = [
    OpEntry(name="torch.sum", family=FAMILY, sampler=_reduce("torch.sum"), ranks=RANKS),
    OpEntry(name="torch.mean", family=FAMILY, sampler=_reduce("torch.mean"), ranks=RANKS),
    OpEntry(name="torch.amax", family=FAMILY, sampler=_reduce("torch.amax"), ranks=RANKS),
    OpEntry(name="torch.nansum", family=FAMILY, sampler=_reduce("torch.nansum"), ranks=RANKS),
    OpEntry(name="torch.logsumexp", family=FAMILY, sampler=_reduce("torch.logsumexp"), ranks=RANKS),
    OpEntry(name="torch.std", family=FAMILY, sampler=_reduce("torch.std"), ranks=RANKS),
    OpEntry(name="torch.norm", family=FAMILY, sampler=_reduce("torch.norm", extra=(("p", 2),)), ranks=RANKS),
    OpEntry(name="torch.max", family=FAMILY, sampler=_reduce("torch.max", values_of_tuple=True), ranks=RANKS),
    OpEntry(name="torch.min", family=FAMILY, sampler=_reduce("torch.min", values_of_tuple=True), ranks=RANKS),
    OpEntry(name="torch.median", family=FAMILY, sampler=_reduce("torch.median", values_of_tuple=True), ranks=RANKS),
    OpEntry(name="torch.argmax", family=FAMILY, sampler=_reduce("torch.argmax"), ranks=RANKS),
    OpEntry(name="torch.argmin", family=FAMILY, sampler=_reduce("torch.argmin"), ranks=RANKS),
    OpEntry(
        name="torch.prod",
        family=FAMILY,
        sampler=_reduce("torch.prod"),
        ranks=RANKS,
        notes="long products of N(0,1) values vanish; the distinguishability filter drops those",
    ),
    OpEntry(name="torch.mode", family=FAMILY, sampler=_reduce("torch.mode", values_of_tuple=True), ranks=RANKS),
    OpEntry(
        name="torch.nanmedian", family=FAMILY, sampler=_reduce("torch.nanmedian", values_of_tuple=True), ranks=RANKS
    ),
    # (std, mean) / (var, mean): the first of the pair.
    OpEntry(name="torch.std_mean", family=FAMILY, sampler=_reduce("torch.std_mean", values_of_tuple=True), ranks=RANKS),
    OpEntry(name="torch.var_mean", family=FAMILY, sampler=_reduce("torch.var_mean", values_of_tuple=True), ranks=RANKS),
]
