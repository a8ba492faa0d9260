"""The data sources of a mixture, named as the released set names them: `torch#k`, a chain of k torch operators
(k from 1 to MAX_OPS), and `transformers`, one transformers module. Everything that reads a source's name asks
here."""

from __future__ import annotations

from typing import Literal

TRANSFORMERS = "transformers"
TORCH_PREFIX = "torch#"


def torch_source(k: int) -> str:
    """The data source of chains of `k` torch operators."""
    return f"{TORCH_PREFIX}{k}"


def kind(source: str) -> Literal["torch", "transformers"]:
    """Which part of the catalog a source draws from."""
    return "transformers" if source == TRANSFORMERS else "torch"


def operator_count(source: str) -> int:
    """The operators in a task of a torch source (`torch#3`: 3); a transformers task wraps one module."""
    return int(source.removeprefix(TORCH_PREFIX)) if source.startswith(TORCH_PREFIX) else 1
