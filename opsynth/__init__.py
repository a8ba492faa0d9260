"""opsynth: synthesize KernelBench-style training tasks for agents that write CUDA kernels.

The package is layered, and no module imports from a layer above its own:

- `opsynth` itself, the ground floor: records, reasons, errors, options, constants (`opsynth.config`);
- `opsynth.operator_catalog`, then `opsynth.filters`, then `opsynth.outputs` (schema, shards, card, figures, stats);
- `opsynth.pipeline`: the Beam graph, its stages and the driver of a run;
- `opsynth.commands` and `opsynth.bench`: the command line and what only it runs.
"""

from opsynth.config import VERSION as __version__

__all__ = ["__version__"]
