"""Shared fixtures: the `../shared` data beside the repository (skipped, saying why, where it is absent),
small task programs, and a CPU execution config for the worker-pool tests."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"

# The test processes run beside each other (pytest-xdist) and beside the workers they start, on a few cores: one
# intra-op thread each, as a run gives its workers, so that a check timed in a test's own process does not wait out
# the scheduler's ticks (a 0.15 ms forward on two threads took 5-14 ms with the cores busy, on one 0.05-0.17 ms).
torch.set_num_threads(1)


def shared_file(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"{relative} not found under {SHARED}: these tests need the project's shared data beside the clone")
    return path


@pytest.fixture(scope="session")
def kernelbench_parquet() -> Path:
    return shared_file("kernelbench/kernelbench.parquet")


@pytest.fixture(scope="session")
def ops6k_examples() -> Path:
    return shared_file("reference/ops6k_examples.parquet")


@pytest.fixture(scope="session")
def ops6k_vocabulary() -> Path:
    return shared_file("reference/ops6k_torch_vocabulary.tsv")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ops6k_transformers() -> Path:
    return shared_file("reference/ops6k_transformers_classes.tsv")


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory) -> Path:
    """The fault suite's uninterrupted tiny run (bench.faults.RUN_ARGS): what every broken and resumed run must end
    with. Made once for all of a session's xdist workers: the first to ask makes it under a lock in their common
    temporary folder, the others wait for it and read it (the tests copy it, never change it)."""
    from opsynth.bench.faults import reference_run

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # each worker's base folder lies in the session's
    made = root / "tiny-reference" / "made"
    with open(root / "tiny-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            shutil.rmtree(root / "tiny-reference", ignore_errors=True)  # what a failed attempt left
            out, _ = reference_run(root / "tiny-reference")
            made.write_text(str(out))
    return Path(made.read_text())


@pytest.fixture()
def pools_made(monkeypatch) -> list:
    """The worker pools that the run driver and the stages make while a test runs, in the order made."""
    import opsynth.pipeline.execution_stage
    import opsynth.pipeline.run
    import opsynth.pipeline.stages
    from opsynth.filters.workers import WorkerPool

    made: list[WorkerPool] = []

    class CountedPool(WorkerPool):
        def __init__(self, cfg, **kwargs):
            super().__init__(cfg, **kwargs)
            made.append(self)

    for module in (opsynth.pipeline.run, opsynth.pipeline.stages, opsynth.pipeline.execution_stage):
        monkeypatch.setattr(module, "WorkerPool", CountedPool)
    return made
