"""Module containers: `nn.Sequential` as a sampled block, and the container and namespace names of the
released vocabulary that are not operators of their own.

A sequential block is a small stack whose layers fit the input (linear or convolutional, a norm, an
activation); the task's `ops` name the container, as the released set does.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import OpCall, OpEntry, SampleContext, Submodule, excluded_entry

FAMILY = "containers"
ACTIVATIONS = ("nn.ReLU", "nn.GELU", "nn.SiLU", "nn.Tanh", "nn.Sigmoid")
NOT_AN_OPERATOR = "a container of modules or parameters, not an operator: what it holds is what runs"


def _sequential(ctx: SampleContext) -> OpCall:
    act = Submodule(ctx.choice(ACTIVATIONS))
    if ctx.x.rank == 4:
        c_in, c_out = ctx.x.shape[1], ctx.out_channels()
        layers = (
            Submodule("nn.Conv2d", (c_in, c_out, 3, 1, 1)),
            Submodule("nn.BatchNorm2d", (c_out,)),
            act,
        )
    else:
        f_in, f_out = ctx.x.shape[-1], ctx.choice(ctx.workload.features)
        layers = (Submodule("nn.Linear", (f_in, f_out)), act)
        if ctx.rng.random() < 0.5:
            layers += (Submodule("nn.Linear", (f_out, f_in)),)
    return OpCall(name="nn.Sequential", style="module", target="nn.Sequential", init_args=layers)


ENTRIES = [
    OpEntry(name="nn.Sequential", family=FAMILY, sampler=_sequential, ranks=(2, 3, 4)),
    *(
        excluded_entry(name, FAMILY, NOT_AN_OPERATOR)
        for name in ("nn.ModuleDict", "nn.ParameterList", "nn.ParameterDict", "nn.Parameter", "nn.Container")
    ),
    excluded_entry("nn.functional", FAMILY, "the name of a namespace (torch.nn.functional), not an operator"),
]
