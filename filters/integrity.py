"""The state a task must leave as it found it in the process that judged it: the attributes of torch, of the
checker's modules and of Python's own, torch's global settings, Python's hooks, signal handlers and timers, and
the threads and child processes running. A worker takes a snapshot before its first task and compares after
each: a task that changed any of it is rejected (`tampering`) and its worker replaced, so that no task can change
the state another task is judged in.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Hashable
from operator import attrgetter

# Modules and classes whose attributes are compared, where imported: a task that rebinds one of them (a
# `torch.allclose` that always agrees, a patched `nn.Module.__call__`) has changed what every later task runs.
WATCHED = (
    "builtins",
    "math",
    "time",
    "os",
    "statistics",
    "contextlib",
    "json",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.modules.module",
    "torch.nn.Module",
    "torch.Tensor",
    "torch._C.TensorBase",
    "torch.testing",
    "torch.autograd",
    "torch.autograd.grad_mode",
    "torch.cuda",
    "torch.random",
    "torch.profiler",
    "torch.autograd.profiler",
    "torch.compiler",
    "multiprocessing.connection",
    "opsynth.filters.execution",
    "opsynth.filters.rehearsal",
    "opsynth.filters.comparison",
    "opsynth.filters.timing",
    "opsynth.filters.shape_check",
    "opsynth.filters.task_loading",
    "opsynth.reasons",
    "opsynth.filters.device_lock",
    "opsynth.filters.integrity",
    "opsynth.filters.worker_process",
)
# torch's global settings, read through its own getters: a default dtype, a matmul precision or a pushed
# TorchFunctionMode would change what later tasks compute or how they are compared.
TORCH_SETTINGS = (
    "get_default_dtype",
    "get_default_device",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled",
    "get_float32_matmul_precision",
    "get_num_threads",
    "get_num_interop_threads",
    "is_anomaly_enabled",
    "_C._len_torch_function_stack",
    "_C._len_torch_dispatch_stack",
    "_C._get_cublas_allow_tf32",
    "_C._get_cudnn_enabled",
    "_C._get_cudnn_benchmark",
    "_C._get_cudnn_deterministic",
    "_C._get_cudnn_allow_tf32",
    "backends.cuda.flash_sdp_enabled",
    "backends.cuda.mem_efficient_sdp_enabled",
    "backends.cuda.math_sdp_enabled",
    "cuda.get_sync_debug_mode",
)
SIGNALS = ("SIGINT", "SIGTERM", "SIGALRM", "SIGCHLD", "SIGPIPE", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGXFSZ", "SIGVTALRM")
SIMPLE = (int, float, bool, str, bytes, type(None))
_MISSING = object()


class Running(frozenset):
    """Threads: a task may end some, but must not leave new ones running."""


class Kept(frozenset):
    """Child processes (the worker's compile pool): a task must neither leave new ones running nor end any (a pool
    process gone would fail every later task's compile)."""


class Members(frozenset):
    """Hooks such as import finders, or environment variables: a library may add one, but none may be removed or
    replaced."""


def _resolve(dotted: str):
    """The module or class `dotted` names, if its module is imported already (nothing is imported here)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:cut]))
        if obj is not None:
            try:
                for name in parts[cut:]:
                    obj = obj.__dict__[name]
            except (KeyError, AttributeError):
                return None
            return obj
    return None


def _token(value) -> Hashable:
    """What identifies an attribute's value: simple values by value; anything else by identity, a function also
    by its code and defaults (which can be replaced in place), a container also by its length (registries of
    hooks are filled in place)."""
    if isinstance(value, float):
        return repr(value)  # NaN is not equal to itself
    if isinstance(value, SIMPLE) or (isinstance(value, tuple) and all(isinstance(v, SIMPLE) for v in value)):
        return value
    if isinstance(value, types.FunctionType):
        return (id(value), id(value.__code__), id(value.__defaults__), id(value.__kwdefaults__))
    if isinstance(value, dict | list | set):
        return (id(value), len(value))
    return id(value)


def _torch_settings() -> dict[str, Hashable]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    settings = {}
    for dotted in TORCH_SETTINGS:
        getter = torch
        try:
            for name in dotted.split("."):
                getter = getattr(getter, name)
            settings[f"torch.{dotted}()"] = repr(getter())
        except (AttributeError, RuntimeError, AssertionError):  # AssertionError: torch built without CUDA
            continue
    for config in ("torch._dynamo.config", "torch._inductor.config"):
        module = sys.modules.get(config)
        if module is not None:
            public = {k: v for k, v in module.get_config_copy().items() if not k.startswith("_")}
            settings[config] = repr(
                sorted((k, sorted(map(repr, v)) if isinstance(v, set) else v) for k, v in public.items())
            )
    return settings


def _children() -> set[int]:
    """This process's child processes (Linux); empty where /proc cannot tell."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return pids


def _python_hooks() -> dict[str, Hashable]:
    hooks: dict[str, Callable[[], Hashable]] = {
        "sys.gettrace()": lambda: id(sys.gettrace()),
        "sys.getprofile()": lambda: id(sys.getprofile()),
        "threading.gettrace()": lambda: id(threading.gettrace()),
        "threading.excepthook": lambda: id(threading.excepthook),
        "sys.meta_path": lambda: Members(map(id, sys.meta_path)),  # a library may add a finder (six does)
        "sys.path_hooks": lambda: Members(map(id, sys.path_hooks)),
        "sys.excepthook": lambda: id(sys.excepthook),
        "sys.stdout": lambda: id(sys.stdout),
        "sys.stderr": lambda: id(sys.stderr),
        "gc": lambda: (gc.isenabled(), gc.get_threshold(), len(gc.callbacks)),
        "os.environ": lambda: Members(os.environ.items()),  # torch adds cache locations on first use
        "alarm timer": lambda: signal.getitimer(signal.ITIMER_REAL)[0] > 0,
        "threads": lambda: Running(t.ident for t in threading.enumerate()),
    }
    state = {name: probe() for name, probe in hooks.items()}
    for name in SIGNALS:
        if hasattr(signal, name):
            state[f"signal.{name} handler"] = _token(signal.getsignal(getattr(signal, name)))
    return state


def _global_state() -> dict[str, Hashable]:
    """What the snapshot reads besides the watched namespaces: torch's settings, Python's hooks, the children."""
    return {**_torch_settings(), **_python_hooks(), "child processes": Kept(_children())}


def snapshot() -> dict[str, Hashable]:
    """The watched state of this process, as comparable tokens."""
    state: dict[str, Hashable] = {}
    for dotted in WATCHED:
        namespace = _resolve(dotted)
        if namespace is not None:
            for name, value in list(vars(namespace).items()):
                state[f"{dotted}.{name}"] = _token(value)
            state[f"sys.modules[{dotted}]"] = id(sys.modules.get(dotted))
    state.update(_global_state())
    return state


def changes(before: dict[str, Hashable], after: dict[str, Hashable]) -> list[str]:
    """What `after` changed or removed of `before`. Attributes added later (a submodule the task imported) are
    not changes; of threads, only new ones are; of child processes, new and ended ones; of hooks, only removed
    ones."""
    changed = []
    for name, token in before.items():
        now = after.get(name, _MISSING)
        if isinstance(token, Running) and isinstance(now, Running):
            if now - token:
                changed.append(f"{name} ({len(now - token)} new)")
        elif isinstance(token, Kept) and isinstance(now, Kept):
            counts = [f"{len(pids)} {what}" for pids, what in ((now - token, "new"), (token - now, "ended")) if pids]
            if counts:
                changed.append(f"{name} ({', '.join(counts)})")
        elif isinstance(token, Members) and isinstance(now, Members):
            if token - now:
                changed.append(f"{name} ({len(token - now)} removed)")
        elif now != token:
            changed.append(name)
    return changed


def describe(changed: list[str], limit: int = 3) -> str:
    shown = ", ".join(changed[:limit]) + (f" and {len(changed) - limit} more" if len(changed) > limit else "")
    return f"the task changed the checker's process: {shown}"


def _identities() -> list[int]:
    """The identity of every watched namespace, of its names and of its values, in order: equal lists mean that
    no attribute was rebound, added or removed (identities only: comparing them runs no object's code)."""
    found: list[int] = []
    for dotted in WATCHED:
        namespace = _resolve(dotted)
        found += (id(sys.modules.get(dotted)), id(namespace))
        if namespace is not None:
            attributes = vars(namespace)
            found += map(id, attributes)
            found += map(id, attributes.values())
    return found


_FUNCTION_PARTS = tuple(map(attrgetter, ("__code__", "__defaults__", "__kwdefaults__")))


def _function_parts(functions: list[types.FunctionType]) -> list[int]:
    """The identities of what a function's token holds besides itself (replaceable in place)."""
    return [i for part in _FUNCTION_PARTS for i in map(id, map(part, functions))]


class Watch:
    """A worker's baseline (`snapshot`) and, after each task, what the task changed of it (`changes`), found
    quickly where it changed nothing: the identities of the watched namespaces' names and values, of the
    functions' code and defaults, and the containers' lengths (what a token holds) are compared with those of a
    state found unchanged, and only where they differ is a whole snapshot compared with the baseline. A state
    found unchanged that way (a task imported a submodule, adding an attribute) becomes the quick comparison's
    reference, so it costs one whole comparison, not one a task. A shape check takes a few milliseconds, as
    long as a whole snapshot and comparison of torch's thousands of attributes."""

    def __init__(self) -> None:
        self.baseline = snapshot()
        self._refer_to_now()

    def _refer_to_now(self) -> None:
        self.identities = _identities()
        values = [v for dotted in WATCHED if (ns := _resolve(dotted)) is not None for v in vars(ns).values()]
        self.functions = [v for v in values if isinstance(v, types.FunctionType)]
        self.containers = [v for v in values if isinstance(v, dict | list | set)]
        self.parts, self.lengths = _function_parts(self.functions), list(map(len, self.containers))
        self.state = _global_state()

    def _unchanged(self) -> bool:
        return (
            _identities() == self.identities  # first: the functions and containers below are then the same objects
            and _function_parts(self.functions) == self.parts
            and list(map(len, self.containers)) == self.lengths
            and _global_state() == self.state
        )

    def changes(self) -> list[str]:
        """What the tasks since the baseline changed of it (as `changes` names it); empty where nothing."""
        if self._unchanged():
            return []
        changed = changes(self.baseline, snapshot())
        if not changed:
            self._refer_to_now()
        return changed
