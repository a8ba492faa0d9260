"""Small task programs that each must get one verdict from the execution checks (the template, the honest and
the hostile ones shared with the fault suite live in bench.hostile_tasks)."""

from opsynth.bench.hostile_tasks import (  # noqa: F401  (the shared templates and tasks, re-exported for the tests)
    CONSTANT,
    FOOTER,
    GOOD,
    HANG,
    HEADER,
    HONEST,
    HOSTILE,
    SECRET_FILE,
    SEGFAULT,
    STOCHASTIC,
    at_import,
    secrets_probe,
    task,
)

# `generate` on the CPU with the tiny workload and two workers: the end-to-end tests' run.
TINY_RUN = ["--device", "cpu", "--workload", "tiny", "--workers", "2"]

SCALAR_LOSS = task("return torch.nn.functional.mse_loss(x, torch.zeros_like(x))")
CONSTANT_SCALAR = task("return (x * 0).sum() + 1.0")
VANISHING = task("return x * 1e-6")
NAN = task("return torch.log(-x.abs() - 1.0)")
TOO_SLOW = task("import time\ntime.sleep(0.05)\nreturn x * 2")
UNLOADABLE = "import torch\nclass Model(:\n"
NO_GET_INPUTS = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    pass\n"
RAISES = task("raise ValueError('boom')")
SHAPE_MISMATCH = task("return self.linear(x)", "self.linear = nn.Linear(64, 16)")
COMPILE_MISMATCH = task("if torch.compiler.is_compiling():\n    return x * 2\nreturn x")
# Within the checker's tolerance (1e-2 + 1e-2 |x|) of eager, beyond half of it wherever |x| < 0.4.
COMPILE_NEAR_TOLERANCE = task("if torch.compiler.is_compiling():\n    return x + 0.007\nreturn x")
# A bool output whose compiled model flips its largest element where that is over 3 (in 29 % of draws).
COMPILE_FLIPS_ON_SOME_DRAWS = task(
    "y = x > 0\nif torch.compiler.is_compiling():\n    y = y ^ ((x == x.max()) & (x.max() > 3.0))\nreturn y"
)
# Draws told apart by 2 of 256 output elements (0.8 %): above the checker's 0.1 %, under generate's 1 %.
BARELY_DISTINGUISHABLE = task("y = torch.ones_like(x)\ny[0, :2] = x[0, :2] * 3\nreturn y")
OUT_OF_MEMORY = task("raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')")
