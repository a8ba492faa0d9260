"""Containment of the processes that run task code, which is untrusted: a scrubbed environment, resource limits and,
where Linux permits, their own PID and network namespaces and a pids cgroup.

Standard library only: a worker applies it before it imports torch, while it still has a single thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
CGROUP_ROOT = "/sys/fs/cgroup"

# What task code may see of the environment: what Python, CUDA, torch, Triton and a C compiler need, and of that
# nothing whose name suggests a secret.
KEPT_VARIABLES = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX", "LANG", "LANGUAGE", "TZ", "TMPDIR",
     "USER", "LOGNAME", "CC", "CXX", "CUDA_HOME", "CUDA_PATH"}
)  # fmt: skip
KEPT_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "KMP_", "OPENBLAS_")
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSW", "CREDENTIAL", "KEY", "AUTH", "COOKIE", "SESSION")


def task_environment(environ: Mapping[str, str], home: str, python_path: list[str]) -> dict[str, str]:
    """The environment of a process that runs task code: the variables named in KEPT_*, less any that looks like a
    secret; HOME a scratch folder (nothing under the user's home is found through it), with the compile caches
    that default under it kept where they are; the Hugging Face Hub offline; the package importable."""
    env = {
        name: value
        for name, value in environ.items()
        if (name in KEPT_VARIABLES or name.startswith(KEPT_PREFIXES))
        and not any(marker in name.upper() for marker in SECRET_MARKERS)
    }
    user_home = environ.get("HOME") or os.path.expanduser("~")
    env.setdefault("TRITON_CACHE_DIR", os.path.join(user_home, ".triton", "cache"))
    env.setdefault("CUDA_CACHE_PATH", os.path.join(user_home, ".nv", "ComputeCache"))
    # torch's kernels compiled at run time (jiterator: some operators on some dtypes) cached across the workers
    user_cache = environ.get("XDG_CACHE_HOME") or os.path.join(user_home, ".cache")
    env.setdefault("PYTORCH_KERNEL_CACHE_PATH", os.path.join(user_cache, "torch", "kernels"))
    return env | {
        "HOME": home,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(python_path),
    }


def python_path() -> list[str]:
    """Where a contained process finds this package and its dependencies: this process's import path, after the
    folder that holds the `opsynth` package."""
    import sys

    import opsynth

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(opsynth.__file__)))
    return list(dict.fromkeys([package_root, *(os.path.abspath(p) for p in sys.path if p)]))


@dataclass(frozen=True)
class Limits:
    """Resource limits of a worker process and of everything it starts."""

    open_files: int = 4096
    file_size_bytes: int = 1 << 30  # a task writing more gets an error, not a full disk
    processes: int = 256  # processes and threads (the pids cgroup's limit; RLIMIT_NPROC above the user's count)
    address_space_bytes: int | None = None  # CPU workers; on CUDA the driver reserves far more than it uses
    data_bytes: int | None = None  # CUDA workers: private writable memory (RLIMIT_DATA), not CUDA's reservations


def host_memory_share(workers: int, floor: int = 4 << 30) -> int:
    """The host memory one of `workers` workers may map: its share of nine tenths of physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(floor, int(physical * 0.9) // max(1, workers))


def _lower(kind: int, value: int) -> None:
    _, hard = resource.getrlimit(kind)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def _user_processes() -> int:
    """Processes of this real user, which RLIMIT_NPROC counts."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat(entry.path).st_uid == uid
    return count


def apply_limits(limits: Limits) -> list[str]:
    """Lower this process's resource limits (its children inherit them); the names of those in force. A task's
    write past the file size limit fails with an error instead of killing its worker."""
    _lower(resource.RLIMIT_CORE, 0)
    _lower(resource.RLIMIT_NOFILE, limits.open_files)
    _lower(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    enforced = ["open files", "file size"]
    if limits.address_space_bytes is not None:
        _lower(resource.RLIMIT_AS, limits.address_space_bytes)
        enforced.append("address space")
    if limits.data_bytes is not None:
        _lower(resource.RLIMIT_DATA, limits.data_bytes)
        enforced.append("data")
    if os.getuid() != 0 and os.path.isdir("/proc"):  # root is not bound by RLIMIT_NPROC
        _lower(resource.RLIMIT_NPROC, _user_processes() + limits.processes)
        enforced.append("processes (RLIMIT_NPROC)")
    return enforced


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces() -> list[str]:
    """Move this (single-threaded) process into new PID, network and mount namespaces where Linux lets it:
    directly as root, else inside a new user namespace that maps this user to itself. Its next child is then
    PID 1 of a namespace in which no process outside can be signalled and no network exists; when that child
    dies, the kernel kills every process left in it. Returns the names of the namespaces entered (none where
    refused)."""
    if not hasattr(os, "fork") or not os.path.isdir("/proc/self/ns"):
        return []
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS) == 0:
        return ["pid", "network", "mount"]
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS) != 0:
        return []
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError:
        pass  # unmapped, files read as nobody's: still contained
    return ["user", "pid", "network", "mount"]


def mount_own_proc() -> bool:
    """In the first process of a new PID namespace (and a mount namespace of its own): mount a /proc that shows
    that namespace, as the CUDA driver, which looks itself up there, needs; mounts stay private to it. Whether it
    was mounted."""
    libc = _libc()
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    return libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0


def die_with_parent() -> None:
    """Linux: this process is killed when its parent dies (a worker must not outlive its pool)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class PidsCgroup:
    """A pids cgroup that caps the processes and threads of one worker and everything it starts (a fork bomb
    stops at the cap), and kills them all at once. Made only where this process may create cgroups."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls, name: str, max_pids: int) -> PidsCgroup | None:
        parent = _pids_hierarchy()
        if parent is None:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
            _write(os.path.join(path, "pids.max"), str(max_pids))
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return None
        return cls(path)

    def add(self, pid: int) -> bool:
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []

    def kill(self) -> None:
        """Kill every process in the cgroup and remove it (a process forking meanwhile is caught on a later pass)."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for _ in range(100):  # the dead leave the cgroup once reaped
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def _pids_hierarchy() -> str | None:
    """Where this process may make a child pids cgroup: its own cgroup in the v1 pids hierarchy, or in the v2
    one where the pids controller is delegated to its children. None elsewhere (not Linux, no permission)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "pids" in controllers.split(","):
            folder = os.path.join(CGROUP_ROOT, "pids", path.lstrip("/"))
            if os.access(folder, os.W_OK):
                return folder
    for hierarchy, _, path in lines:
        if hierarchy == "0":
            for root in (CGROUP_ROOT, os.path.join(CGROUP_ROOT, "unified")):
                folder = os.path.join(root, path.lstrip("/"))
                with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.subtree_control")) as f:
                    if "pids" in f.read().split() and os.access(folder, os.W_OK):
                        return folder
    return None
