"""Typed catalog of the operators opsynth composes into tasks, one module per family."""

from opsynth.operator_catalog.entry import (
    NotApplicable,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    TensorSpec,
    Workload,
)
from opsynth.operator_catalog.registry import all_entries, catalog_version, get, sampleable

__all__ = [
    "NotApplicable",
    "OpCall",
    "OpEntry",
    "Operand",
    "SampleContext",
    "TensorSpec",
    "Workload",
    "all_entries",
    "catalog_version",
    "get",
    "sampleable",
]
