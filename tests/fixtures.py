"""Small task programs that each must get one verdict from the execution checks."""

HEADER = "import torch\nimport torch.nn as nn\n\n\n"
FOOTER = """

def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return []
"""


def task(forward_body: str, init_body: str = "pass") -> str:
    """A Model with the given forward body (x is the input) and __init__ body."""
    return (
        HEADER
        + "class Model(nn.Module):\n"
        + "    def __init__(self):\n        super().__init__()\n"
        + "".join(f"        {line}\n" for line in init_body.splitlines())
        + "\n    def forward(self, x):\n"
        + "".join(f"        {line}\n" for line in forward_body.splitlines())
        + FOOTER
    )


GOOD = task("return torch.relu(self.linear(x))", "self.linear = nn.Linear(32, 16)")
STOCHASTIC = task("return torch.nn.functional.dropout(x, p=0.5, training=True)")
CONSTANT = task("return torch.ones_like(x)")
SCALAR_LOSS = task("return torch.nn.functional.mse_loss(x, torch.zeros_like(x))")
CONSTANT_SCALAR = task("return (x * 0).sum() + 1.0")
VANISHING = task("return x * 1e-6")
NAN = task("return torch.log(-x.abs() - 1.0)")
SEGFAULT = task("import ctypes\nctypes.string_at(0)\nreturn x")
HANG = task("import time\ntime.sleep(3600)\nreturn x")
TOO_SLOW = task("import time\ntime.sleep(0.05)\nreturn x * 2")
UNLOADABLE = "import torch\nclass Model(:\n"
NO_GET_INPUTS = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    pass\n"
RAISES = task("raise ValueError('boom')")
SHAPE_MISMATCH = task("return self.linear(x)", "self.linear = nn.Linear(64, 16)")
COMPILE_MISMATCH = task("if torch.compiler.is_compiling():\n    return x * 2\nreturn x")
OUT_OF_MEMORY = task("raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')")
