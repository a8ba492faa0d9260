"""Hostile and broken task programs, as someone validating a set they did not write meets them, for the fault
suite (`opsynth bench faults`) and the tests: each with the verdict it must get, and honest tasks whose verdicts
must not change when they are validated after them.
"""

from __future__ import annotations

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


GOOD = task("return torch.tanh(self.linear(x)) * 2", "self.linear = nn.Linear(32, 16)")
STOCHASTIC = task("return torch.nn.functional.dropout(x, p=0.5, training=True)")
CONSTANT = task("return torch.ones_like(x)")
SEGFAULT = task("import ctypes\nctypes.string_at(0)\nreturn x")
HANG = task("import time\ntime.sleep(3600)\nreturn x")
HONEST = {"good": (GOOD, "keep"), "stochastic": (STOCHASTIC, "not_deterministic"),
          "constant": (CONSTANT, "indistinguishable_outputs")}  # fmt: skip


def at_import(code: str, body: str = "return x * 2") -> str:
    """A task that runs `code` when its module is executed (before the checker builds anything)."""
    return task(body).replace(HEADER, HEADER + code + "\n\n", 1)


LOOPS_IN_GET_INIT_INPUTS = task("return x").replace(
    "def get_init_inputs():\n", "def get_init_inputs():\n    while True:\n        pass\n"
)
PATCHES_ALLCLOSE = at_import(
    "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True", "return torch.rand_like(x)"
)
LEAVES_PROCESSES = task(
    "import subprocess\nfor _ in range(20):\n    subprocess.Popen(['sleep', '7654321'])\nreturn x * 2"
)
FORK_BOMB = task(
    "import os, time\nfor _ in range(600):\n    if os.fork() == 0:\n        time.sleep(3600)\n        os._exit(0)\n"
    "return x * 2"
)
# Hostile or broken tasks, as someone validating a set they did not write meets them, with the verdict each must
# get ("not keep": any but keep); every honest task validated after them must still get its own verdict.
HOSTILE = {
    "segfault_in_forward": (SEGFAULT, "crash"),
    "exit_in_forward": (task("import sys\nsys.exit(0)"), "runtime_error"),
    "os_exit_in_forward": (task("import os\nos._exit(3)"), "crash"),
    "kills_its_parent": (task("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nreturn x"), "crash"),
    "kills_its_group": (task("import os, signal\nos.killpg(0, signal.SIGKILL)\nreturn x"), "crash"),
    # its answer must not count: a stopped parent passes nothing on (the pool's timeout ends the worker)
    "stops_its_parent": (task("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nreturn x"), "timeout"),
    "hang_in_forward": (HANG, "timeout"),
    "hang_at_import": (at_import("import time\ntime.sleep(3600)"), "timeout"),
    "loop_in_get_init_inputs": (LOOPS_IN_GET_INIT_INPUTS, "timeout"),
    "patches_allclose": (PATCHES_ALLCLOSE, "tampering"),
    "patches_module_call": (at_import("nn.Module.__call__ = lambda self, *a: a[0]"), "tampering"),
    "sets_default_dtype": (at_import("torch.set_default_dtype(torch.float64)"), "tampering"),
    "leaves_processes": (LEAVES_PROCESSES, "tampering"),
    "fork_bomb": (FORK_BOMB, "not keep"),
    "memory_hog": (task("hog = [torch.empty(1 << 28) for _ in range(1024)]\nreturn x"), "out_of_memory"),
    "nested_too_deep": (task("return x" + " + 1" * 1500), "load_error"),  # compiles; too deep to compare
}
SECRET_FILE = "opsynth-secret-probe.txt"  # where secrets_probe also leaves what it found (a relative path)


def secrets_probe(found_path: str) -> str:
    """A task that looks for a token in its environment and writes what it found to `found_path`, and to a
    relative path (which must land in a scratch folder removed afterwards)."""
    return at_import(
        "import os, pathlib\n"
        "found = repr([os.environ.get('HF_TOKEN'), pathlib.Path('/proc/self/environ').read_bytes()])\n"
        f"pathlib.Path({SECRET_FILE!r}).write_text(found)\n"
        f"pathlib.Path({found_path!r}).write_text(found)"
    )
