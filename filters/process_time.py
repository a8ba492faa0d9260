"""A process's CPU time as the kernel counts it (Linux `/proc`), read from outside the process.

A worker runs task code, so what it says of itself is a hint at best; the kernel's count is not the task's to
change. CPU time, unlike the wall clock, does not grow when other processes take the cores: the pool's time
limit counts it, so that a verdict does not depend on the machine's load (see worker_budgets.overdue).
"""

from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses): the state
    first, then the parent's pid, ...; None where the process is gone or /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    return fields if len(fields) > 14 else None


def cpu_seconds(pid: int) -> float | None:
    """User and system time of process `pid`, all its threads and the children it has waited for, in seconds."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + cutime + cstime) / CLOCK_TICKS


def only_child(pid: int) -> int | None:
    """The pid of the one process whose parent is `pid`, as this process sees it; None where there is none, or
    more than one, or /proc cannot be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    children = []
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[1] == str(pid):
                children.append(int(entry))
    return children[0] if len(children) == 1 else None
