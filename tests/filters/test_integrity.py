"""A worker's watch over its own state: what a task changed is found after each task, as the whole snapshot's
comparison finds it, and the quick comparison that spares it where nothing changed misses nothing."""

import threading

import pytest
import torch

from opsynth.filters import comparison, integrity


@pytest.fixture
def whole_snapshots(monkeypatch):
    """Counts the whole snapshots taken (the quick comparison's fallback)."""
    taken = []
    real = integrity.snapshot

    def counted():
        taken.append(1)
        return real()

    monkeypatch.setattr(integrity, "snapshot", counted)
    return taken


def test_nothing_changed_is_found_without_a_whole_snapshot(whole_snapshots):
    watch = integrity.Watch()
    whole_snapshots.clear()
    assert [watch.changes() for _ in range(3)] == [[], [], []]
    assert whole_snapshots == []


def test_a_rebound_function_is_found_and_named(monkeypatch):
    watch = integrity.Watch()
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    assert watch.changes() == ["torch.allclose"]
    monkeypatch.undo()
    assert watch.changes() == []


def test_a_function_changed_in_place_is_found(monkeypatch):
    watch = integrity.Watch()
    monkeypatch.setattr(comparison.outputs_close, "__code__", (lambda *a, **k: True).__code__)
    assert watch.changes() == ["opsynth.filters.comparison.outputs_close"]


def test_a_registry_filled_in_place_is_found():
    watch = integrity.Watch()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)
    try:
        assert "torch.nn.modules.module._global_forward_hooks" in watch.changes()
    finally:
        handle.remove()
    assert watch.changes() == []


def test_a_global_setting_is_found(monkeypatch):
    watch = integrity.Watch()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert "torch.get_default_dtype()" in watch.changes()
    finally:
        torch.set_default_dtype(before)


def test_a_changed_sync_debug_mode_is_found(monkeypatch):
    """A task that leaves CUDA's synchronizations raising (or warning) changes what every later task runs into."""
    mode = [0]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode[0])
    watch = integrity.Watch()
    assert not watch.changes()
    mode[0] = 2
    assert "torch.cuda.get_sync_debug_mode()" in watch.changes()


def test_a_thread_left_running_is_found():
    watch = integrity.Watch()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert watch.changes() == ["threads (1 new)"]
    finally:
        stop.set()
        thread.join()
    assert watch.changes() == []


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc")
def test_a_child_process_left_running_or_one_ended_is_found():
    import subprocess

    kept = subprocess.Popen(["sleep", "60"])  # running at the snapshot, as a worker's compile pool is
    watch = integrity.Watch()
    left = subprocess.Popen(["sleep", "60"])
    try:
        assert watch.changes() == ["child processes (1 new)"]
        kept.kill()
        kept.wait()
        assert watch.changes() == ["child processes (1 new, 1 ended)"]
    finally:
        left.kill()
        left.wait()
    assert watch.changes() == ["child processes (1 ended)"]


def test_an_added_attribute_is_no_change_and_costs_one_whole_comparison(monkeypatch, whole_snapshots):
    watch = integrity.Watch()
    whole_snapshots.clear()
    monkeypatch.setattr(torch, "opsynth_test_added", object(), raising=False)  # as a task importing a submodule
    assert watch.changes() == []
    assert watch.changes() == []
    assert len(whole_snapshots) == 1
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)  # a change after it is still found
    assert watch.changes() == ["torch.allclose"]


def test_an_attribute_rebound_to_an_equal_value_is_no_change(monkeypatch):
    watch = integrity.Watch()
    equal = int(str(comparison.PROBE_ELEMENTS))
    assert equal is not comparison.PROBE_ELEMENTS
    monkeypatch.setattr(comparison, "PROBE_ELEMENTS", equal)
    assert watch.changes() == []
