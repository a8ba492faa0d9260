"""Standalone tasks that wrap one `transformers` module, with its computation visible in the code.

The class and the helpers of its own modeling module it needs are inlined (decorators dropped), the class is
renamed `Model`, and everything else it names is imported from the module that defines it; configs are built
in `get_init_inputs()` with the installed transformers, sized by the workload.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

from operator_catalog.entry import RenderedTask, TensorSpec, Workload, within_input_budget

FAMILY = "transformers"
HEADER = ["from __future__ import annotations", "", "import torch", "import torch.nn as nn", "import transformers"]


@dataclass(frozen=True)
class ModuleUse:
    """One sampled instantiation: constructor argument expressions and input shapes."""

    init_args: tuple[str, ...]  # Python expressions, evaluated in get_init_inputs()
    input_shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TransformersEntry:
    """One transformers module class of the catalog."""

    name: str  # the class name, as the released set spells it
    module: str  # the modeling module that defines it
    sampler: Callable[[random.Random, Workload], ModuleUse]  # sizes one use for the workload
    excluded: str | None = None  # why it is never sampled, or None
    family: str = FAMILY
    kind: str = "transformers"
    ranks: tuple[int, ...] = field(default=())
    domain: str = "real"
    terminal: bool = True

    def __post_init__(self) -> None:
        if not self.module.startswith("transformers.models."):
            raise ValueError(f"{self.name}: module must be a transformers modeling module, got {self.module}")

    def resolve(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)


def _names_used(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def inline_source(cls: type) -> tuple[list[str], list[str]]:
    """(import lines, definitions in dependency order) for `cls` and the helpers of its module it needs."""
    module = importlib.import_module(cls.__module__)
    imports: set[str] = set()
    ordered: list[str] = []
    done: set[str] = set()

    def visit(obj) -> None:
        if obj.__name__ in done:
            return
        done.add(obj.__name__)
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                node.decorator_list = []
        for name in sorted(_names_used(tree)):
            value = module.__dict__.get(name)
            if value is None or name in {"torch", "nn", "transformers", obj.__name__}:
                continue
            if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__:
                visit(value)
            elif inspect.ismodule(value):
                imports.add(f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}")
            else:
                imports.add(f"from {module.__name__} import {name}")
        ordered.append(ast.unparse(tree))

    visit(cls)
    return sorted(imports), ordered


def render_transformers(entry: TransformersEntry, use: ModuleUse) -> RenderedTask:
    cls = entry.resolve()
    imports, definitions = inline_source(cls)
    target = ast.parse(definitions[-1])
    for node in ast.walk(target):
        if isinstance(node, ast.ClassDef) and node.name == entry.name:
            node.name = "Model"
        elif isinstance(node, ast.Name) and node.id == entry.name:
            node.id = "Model"
    definitions = [*definitions[:-1], f"# {entry.name}, from {entry.module}\n" + ast.unparse(target)]
    inputs = ", ".join(f"torch.randn{shape!r}" for shape in use.input_shapes)
    lines = [*HEADER, *imports, "", ""]
    lines.append("\n\n\n".join(definitions))
    lines += ["", "", "def get_inputs():", f"    return [{inputs}]", "", ""]
    lines += ["def get_init_inputs():", f"    return [{', '.join(use.init_args)}]", ""]
    shapes = tuple(TensorSpec(s) for s in use.input_shapes)
    return RenderedTask("\n".join(lines), (entry.name,), use.init_args, shapes)


def _image(rng: random.Random, wl: Workload, channels: int) -> tuple[int, ...]:
    side = rng.choice(wl.spatial[4])
    return within_input_budget((rng.choice(wl.batch_sizes), channels, side, side), wl)


def _sequence(rng: random.Random, wl: Workload, hidden: int) -> tuple[int, ...]:
    return within_input_budget((rng.choice(wl.batch_sizes), rng.choice(wl.spatial[3]), hidden), wl, fixed=(2,))


def _resnet_basic(rng: random.Random, wl: Workload) -> ModuleUse:
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    stride = rng.choice((1, 2))
    return ModuleUse((str(c_in), str(c_out), str(stride), repr(rng.choice(("relu", "gelu")))), (_image(rng, wl, c_in),))


def _resnet_bottleneck(rng: random.Random, wl: Workload) -> ModuleUse:
    c_in, c_out = rng.choice(wl.channels), 4 * rng.choice(wl.channels)
    return ModuleUse((str(c_in), str(c_out), str(rng.choice((1, 2)))), (_image(rng, wl, c_in),))


def _resnet_shortcut(rng: random.Random, wl: Workload) -> ModuleUse:
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    return ModuleUse((str(c_in), str(c_out), str(rng.choice((1, 2)))), (_image(rng, wl, c_in),))


def _convnext_layer(rng: random.Random, wl: Workload) -> ModuleUse:
    dim = rng.choice(wl.channels)
    config = "transformers.ConvNextConfig(hidden_act='gelu', layer_scale_init_value=1e-06)"
    return ModuleUse((config, str(dim)), (_image(rng, wl, dim),))


def _poolformer_layer(rng: random.Random, wl: Workload) -> ModuleUse:
    channels = rng.choice(wl.channels)
    config = "transformers.PoolFormerConfig(hidden_act='gelu', use_layer_scale=True, layer_scale_init_value=1e-05)"
    args = (config, str(channels), "3", str(channels), str(4 * channels), "0.0")
    return ModuleUse(args, (_image(rng, wl, channels),))


def _glpn_patches(rng: random.Random, wl: Workload) -> ModuleUse:
    c_in, hidden = rng.choice((3, *wl.channels)), rng.choice(wl.channels)
    return ModuleUse(("7", "4", str(c_in), str(hidden)), (_image(rng, wl, c_in),))


def _mpnet_head(rng: random.Random, wl: Workload) -> ModuleUse:
    hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
    config = f"transformers.MPNetConfig(hidden_size={hidden}, vocab_size={vocab})"
    return ModuleUse((config,), (_sequence(rng, wl, hidden),))


def _mobilebert_head(rng: random.Random, wl: Workload) -> ModuleUse:
    hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
    # A smaller embedding than hidden size, as MobileBERT's defaults (128 of 512): the head then also runs its
    # extra projection, which is empty when the two are equal.
    config = f"transformers.MobileBertConfig(hidden_size={hidden}, embedding_size={hidden // 4}, vocab_size={vocab})"
    return ModuleUse((config,), (_sequence(rng, wl, hidden),))


def _tdnn_layer(rng: random.Random, wl: Workload) -> ModuleUse:
    hidden = rng.choice(wl.features)
    config = f"transformers.Wav2Vec2Config(tdnn_dim=({hidden}, {hidden}), tdnn_kernel=(5, 3), tdnn_dilation=(1, 2))"
    return ModuleUse((config, "1"), (_sequence(rng, wl, hidden),))


ENTRIES = [
    TransformersEntry("ResNetBasicLayer", "transformers.models.resnet.modeling_resnet", _resnet_basic),
    TransformersEntry("ResNetBottleNeckLayer", "transformers.models.resnet.modeling_resnet", _resnet_bottleneck),
    TransformersEntry("ResNetShortCut", "transformers.models.resnet.modeling_resnet", _resnet_shortcut),
    TransformersEntry("ConvNextLayer", "transformers.models.convnext.modeling_convnext", _convnext_layer),
    TransformersEntry("PoolFormerLayer", "transformers.models.poolformer.modeling_poolformer", _poolformer_layer),
    TransformersEntry("GLPNOverlapPatchEmbeddings", "transformers.models.glpn.modeling_glpn", _glpn_patches),
    TransformersEntry("MPNetLMHead", "transformers.models.mpnet.modeling_mpnet", _mpnet_head),
    TransformersEntry(
        "MobileBertLMPredictionHead", "transformers.models.mobilebert.modeling_mobilebert", _mobilebert_head
    ),
    TransformersEntry("TDNNLayer", "transformers.models.wav2vec2.modeling_wav2vec2", _tdnn_layer),
]


def compose_transformers(seed: int, workload: Workload, batch_scale: float = 1.0) -> RenderedTask:
    """A standalone task around one transformers module, deterministic in `seed`; `batch_scale` multiplies
    the batch of its inputs (shape calibration)."""
    rng = random.Random(seed)
    entry = rng.choice([e for e in ENTRIES if e.excluded is None])
    return transformers_task(entry, rng, workload, batch_scale)


def transformers_task(
    entry: TransformersEntry, rng: random.Random, workload: Workload, batch_scale: float = 1.0
) -> RenderedTask:
    """One sampled use of `entry`, its input batch multiplied by `batch_scale`."""
    use = entry.sampler(rng, workload)
    if batch_scale != 1.0:
        fixed = tuple(range(1, 5))  # only the batch moves: every other dimension is tied to the module's config
        shapes = tuple(
            within_input_budget((max(1, round(s[0] * batch_scale)), *s[1:]), workload, fixed) for s in use.input_shapes
        )
        use = ModuleUse(use.init_args, shapes)
    return render_transformers(entry, use)
