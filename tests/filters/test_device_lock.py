"""The GPU lock: shared for checks up to its slots, exclusive for timings (which gather to drain the sharers
together), released by a dead holder, and reporting its holder's holds and waits. A timing that must drain the
sharers at once is made with `gather_s=0`."""


def _hold_and_die(path):
    import ctypes

    from opsynth.filters.device_lock import DeviceLock

    with DeviceLock(path):
        ctypes.string_at(0)


def test_a_device_lock_is_released_when_its_holder_crashes(tmp_path):
    import multiprocessing

    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    child = multiprocessing.get_context("spawn").Process(target=_hold_and_die, args=(path,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -11
    with DeviceLock(path):  # would block forever if the dead holder still held it
        pass


def _enter_in_thread(lock_context) -> tuple:
    """Enter a lock context in a thread; returns (entered event, release event, thread)."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def hold():
        with lock_context():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return entered, release, thread


def test_a_device_lock_lets_checks_share_up_to_its_slots_and_timings_hold_it_alone(tmp_path):
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")

    def lock():
        return DeviceLock(path, slots=2, gather_s=0)  # each holder its own, as each worker process has

    a, release_a, thread_a = _enter_in_thread(lambda: lock().shared())
    assert a.wait(5)
    b, release_b, thread_b = _enter_in_thread(lambda: lock().shared())
    assert b.wait(5), "two shared holders within the slots"
    c, release_c, thread_c = _enter_in_thread(lambda: lock().shared())
    assert not c.wait(0.3), "a third shared holder waits for a slot"
    release_b.set()
    thread_b.join(5)
    assert c.wait(5)
    # An exclusive holder waits for the shared ones inside, and a shared holder arriving after it waits for it.
    w, release_w, thread_w = _enter_in_thread(lock)
    assert not w.wait(0.3)
    d, release_d, thread_d = _enter_in_thread(lambda: lock().shared())
    assert not d.wait(0.3)
    release_a.set()
    release_c.set()
    assert w.wait(5) and not d.is_set()
    release_w.set()
    assert d.wait(5)
    release_d.set()
    for t in (thread_a, thread_c, thread_w, thread_d):
        t.join(5)


def _one_timing_then_the_other(one: tuple, other: tuple, sharer) -> None:
    """Two timings waiting for the GPU (each an entered and a release event) hold it one at a time, in either
    order, and both before the shared holder waiting (`sharer`, its entered event)."""
    import time

    deadline = time.monotonic() + 10
    while not (one[0].is_set() or other[0].is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    (first, release_first), (second, release_second) = (one, other) if one[0].is_set() else (other, one)
    assert first.is_set() and not second.is_set() and not sharer.is_set()
    release_first.set()
    assert second.wait(10)
    assert not sharer.wait(0.3), "the second timing went before the waiting shared holder"
    release_second.set()
    assert sharer.wait(5)


def test_exclusive_holders_waiting_together_go_before_any_new_shared_holder(tmp_path):
    """The GPU drains of shared work once for all the timings waiting, not once for each."""
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    a, release_a, thread_a = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert a.wait(5)
    w1, release_w1, thread_w1 = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0))
    w2, release_w2, thread_w2 = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0))
    assert not w1.wait(0.3) and not w2.is_set()
    r, release_r, thread_r = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert not r.wait(0.3), "a shared holder waits while timings are pending"
    release_a.set()
    _one_timing_then_the_other((w1, release_w1), (w2, release_w2), r)
    release_r.set()
    for t in (thread_a, thread_w1, thread_w2, thread_r):
        t.join(5)


def test_a_timing_that_finds_no_task_on_the_gpu_takes_it_at_once(tmp_path):
    from opsynth.filters.device_lock import DeviceLock

    lock = DeviceLock(str(tmp_path / "gpu0"), slots=3, gather_s=600)
    w, release_w, thread_w = _enter_in_thread(lambda: lock)
    assert w.wait(10), "it did not wait out its gathering: there was nothing to drain"
    release_w.set()
    thread_w.join(5)


def test_a_timing_lets_the_sharers_go_on_until_another_timing_drains_them_and_joins_that_drain(tmp_path):
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    a, release_a, thread_a = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert a.wait(5)
    w1, release_w1, thread_w1 = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=600))
    assert not w1.wait(0.3)
    r, release_r, thread_r = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert r.wait(5), "a shared holder enters while a timing gathers"
    release_r.set()
    thread_r.join(5)
    w2, release_w2, thread_w2 = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0))
    assert not w2.wait(0.3)
    s, release_s, thread_s = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert not s.wait(0.3), "a shared holder waits once a timing drains the GPU"
    release_a.set()
    _one_timing_then_the_other((w1, release_w1), (w2, release_w2), s)  # the gathering one joined the other's drain
    release_s.set()
    for t in (thread_a, thread_w1, thread_w2, thread_s):
        t.join(5)


def test_a_timing_drains_the_sharers_itself_once_its_gathering_is_over(tmp_path):
    import time

    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    sharer = DeviceLock(path, slots=3)
    with sharer.shared():
        w, release_w, thread_w = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0.05))
        deadline = time.monotonic() + 10
        while not sharer.timing_waits() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sharer.timing_waits() and not w.is_set(), "it drains the GPU: no new sharer enters, it waits"
    assert w.wait(5)
    release_w.set()
    thread_w.join(5)


def test_with_one_slot_a_device_locks_shared_mode_is_exclusive(tmp_path):
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    a, release_a, thread_a = _enter_in_thread(lambda: DeviceLock(path).shared())
    assert a.wait(5)
    b, release_b, thread_b = _enter_in_thread(lambda: DeviceLock(path).shared())
    assert not b.wait(0.3)
    release_a.set()
    assert b.wait(5)
    release_b.set()
    thread_a.join(5)
    thread_b.join(5)


def test_within_alone_a_processs_shared_holds_are_exclusive(tmp_path):
    """A task retried after running out of memory beside others: its device work shares the GPU with nobody."""
    import contextlib

    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")

    @contextlib.contextmanager
    def alone_shared():
        lock = DeviceLock(path, slots=3)
        with lock.alone(), lock.shared():
            yield

    a, release_a, thread_a = _enter_in_thread(alone_shared)
    assert a.wait(5)
    b, release_b, thread_b = _enter_in_thread(lambda: DeviceLock(path, slots=3).shared())
    assert not b.wait(0.3), "a shared holder waits while one holds the GPU alone"
    release_a.set()
    assert b.wait(5)
    release_b.set()
    thread_a.join(5)
    thread_b.join(5)


def test_a_device_lock_reports_its_holds_and_waits(tmp_path):
    from opsynth.filters.device_lock import (
        ALONE,
        HOLD_MODE,
        HOLD_SINCE,
        WAIT_MODE,
        WAIT_SINCE,
        WAITED_S,
        WATCH_FIELDS,
        DeviceLock,
    )

    path = str(tmp_path / "gpu0")
    a, release_a, thread_a = _enter_in_thread(lambda: DeviceLock(path))
    assert a.wait(5)
    watch = [0.0] * WATCH_FIELDS
    lock = DeviceLock(path)
    lock.watch(watch)
    b, release_b, thread_b = _enter_in_thread(lambda: lock)
    assert not b.wait(0.3)
    assert watch[WAIT_SINCE] > 0 and watch[HOLD_SINCE] == 0 and watch[WAIT_MODE] == ALONE
    release_a.set()
    assert b.wait(5)
    assert watch[WAITED_S] >= 0.3 and watch[WAIT_SINCE] == 0 and watch[HOLD_SINCE] > 0
    assert watch[WAIT_MODE] == 0 and watch[HOLD_MODE] == ALONE
    assert lock.held
    release_b.set()
    thread_b.join(5)
    thread_a.join(5)
    assert watch[HOLD_SINCE] == 0 and watch[HOLD_MODE] == 0 and not lock.held
    with lock.unwatched_holds(), lock:
        assert watch[HOLD_SINCE] == 0
        assert watch[HOLD_MODE] == ALONE  # how it holds is told even where since when is not


def test_a_shared_hold_and_a_wait_to_share_are_reported_as_such(tmp_path):
    from opsynth.filters.device_lock import HOLD_MODE, SHARING, WAIT_MODE, WATCH_FIELDS, DeviceLock

    path = str(tmp_path / "gpu0")
    a, release_a, thread_a = _enter_in_thread(lambda: DeviceLock(path))
    assert a.wait(5)
    watch = [0.0] * WATCH_FIELDS
    lock = DeviceLock(path, slots=3)
    lock.watch(watch)
    b, release_b, thread_b = _enter_in_thread(lambda: lock.shared())
    assert not b.wait(0.3)
    assert watch[WAIT_MODE] == SHARING and watch[HOLD_MODE] == 0
    release_a.set()
    assert b.wait(5)
    assert watch[WAIT_MODE] == 0 and watch[HOLD_MODE] == SHARING
    release_b.set()
    thread_b.join(5)
    thread_a.join(5)
    assert watch[HOLD_MODE] == 0


def test_a_sharer_steps_aside_for_a_waiting_timing_and_shares_again_after_it(tmp_path):
    """Between two device steps of its checks, a task sharing the GPU lets a waiting timing go first: the timing
    waits for that step, not for the whole of the sharer's checks."""
    import threading

    from opsynth.filters.device_holds import yield_to_timings
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    sharer = DeviceLock(path, slots=3)
    finished: list[str] = []
    with sharer.shared():
        assert not sharer.timing_waits()
        assert not yield_to_timings(sharer, lambda: finished.append("device work")), "nothing waits: it stays"
        w, release_w, thread_w = _enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0))
        assert not w.wait(0.3), "the timing waits for the sharer"
        assert sharer.timing_waits()
        stepped = threading.Event()

        def step():
            stepped.set()
            yield_to_timings(sharer, lambda: finished.append("device work"))

        thread_s = threading.Thread(target=step, daemon=True)
        thread_s.start()
        assert w.wait(5), "the timing went while the sharer stood aside"
        assert finished == ["device work"], "the sharer's device work was finished before it stood aside"
        assert stepped.is_set() and thread_s.is_alive(), "the sharer waits for the timing to end"
        release_w.set()
        thread_s.join(5)
        assert not thread_s.is_alive() and sharer.held and sharer.sharing
        thread_w.join(5)
    assert not sharer.held and not sharer.sharing


def test_only_a_shared_device_lock_steps_aside(tmp_path):
    import contextlib

    from opsynth.filters.device_holds import yield_to_timings
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    never = []
    assert not yield_to_timings(None, lambda: never.append(1))
    assert not yield_to_timings(contextlib.nullcontext(), lambda: never.append(1))
    lock = DeviceLock(path, slots=3)
    with lock:  # held alone (a timing): nothing to step aside for
        assert not yield_to_timings(lock, lambda: never.append(1))
    assert not never


def test_a_sharer_stepped_out_holds_nothing_keeps_its_slot_and_shares_again_behind_the_timings(tmp_path):
    """A task's host work that launches no kernel (a first forward's rehearsal) holds nothing: a timing goes at
    once, and the task shares the GPU again only once the timing is done, in the slot it had."""
    import contextlib
    import threading

    from opsynth.filters.device_holds import stepped_out
    from opsynth.filters.device_lock import DeviceLock

    path = str(tmp_path / "gpu0")
    sharer = DeviceLock(path, slots=2)
    with sharer.shared():
        slot = sharer._slot
        back = threading.Event()
        w, release_w, thread_w = _enter_in_thread(lambda: DeviceLock(path, slots=2, gather_s=0))
        assert not w.wait(0.3), "the timing waits for the sharer"

        waits: list[str] = []

        @contextlib.contextmanager
        def waiting():
            waits.append("lock_wait")
            yield

        def host_work():
            with stepped_out(sharer, waiting):
                assert not sharer.held
                assert w.wait(5), "the timing went while the sharer held nothing"
                assert DeviceLock(path, slots=2)._taken(f"slot{slot}"), "the slot is kept meanwhile"
            back.set()

        thread_s = threading.Thread(target=host_work, daemon=True)
        thread_s.start()
        assert w.wait(5)
        assert not back.wait(0.3), "the sharer shares again only behind the timing"
        release_w.set()
        assert back.wait(5)
        thread_s.join(5)
        thread_w.join(5)
        assert sharer.held and sharer.sharing and sharer._slot == slot
        assert waits == ["lock_wait"], "the wait to share again counts where the caller says"
    assert not sharer.held


def test_only_a_shared_device_lock_steps_out(tmp_path):
    from opsynth.filters.device_holds import stepped_out
    from opsynth.filters.device_lock import DeviceLock

    with stepped_out(None):
        pass
    lock = DeviceLock(str(tmp_path / "gpu0"), slots=3)
    with lock:  # held alone (a timing, or a task retried alone): it stays held
        with stepped_out(lock):
            assert lock.held
        assert lock.held


def test_a_models_building_and_forward_pause_between_its_modules_and_only_inside_the_block():
    import torch

    from opsynth.filters.device_holds import pausing_between_modules

    pauses = []

    def build():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.BatchNorm1d(4))

    with pausing_between_modules(lambda: pauses.append(1)):
        model = build().eval()
        built = len(pauses)
        out = model(torch.randn(2, 4))
    # three submodules registered, Linear's and BatchNorm's parameters and buffers; four modules' forwards
    assert built >= 3 + 4 + 3
    assert len(pauses) - built == 4
    assert out.shape == (2, 4)  # the forward pre-hook left the inputs alone
    total = len(pauses)
    build()(torch.randn(2, 4))
    assert len(pauses) == total  # the hooks went with the block


def test_device_work_that_comes_holding_nothing_takes_the_shared_hold_and_finishes_before_letting_go(tmp_path):
    """A benchmark of inductor's compiling holds nothing of its own: it takes the shared hold, its device work
    finished before it lets go; held already, the work only steps aside for a waiting timing; any other lock is
    left alone."""
    import contextlib

    from opsynth.filters.device_holds import holding_for_device_work
    from opsynth.filters.device_lock import DeviceLock

    lock = DeviceLock(str(tmp_path / "gpu0"), slots=3, gather_s=0)
    events = []
    with holding_for_device_work(lock, lambda: events.append(("finished", lock.held))):
        events.append(("working", lock.held, lock.sharing))
    assert events == [("working", True, True), ("finished", True)]
    assert not lock.held and not lock.sharing
    with lock.shared():
        with holding_for_device_work(lock, lambda: events.append("finished again")):
            assert lock.sharing  # the task's own hold, kept: no timing waits, nothing to finish
        assert lock.held
    assert events[-1] != "finished again"
    with holding_for_device_work(contextlib.nullcontext(), lambda: events.append("cpu")):
        pass
    assert events[-1] != "cpu"


def test_a_sharer_counts_the_other_tasks_sharing_the_gpu_and_a_first_trys_ceiling_grows_with_them(tmp_path):
    from opsynth.filters.device_lock import DeviceLock
    from opsynth.filters.window_checks import over_ceiling

    path = str(tmp_path / "gpu0")
    mine = DeviceLock(path, slots=3, gather_s=0)
    assert mine.sharers() == 0  # holding nothing
    with mine.shared():
        assert mine.sharers() == 0 and over_ceiling(9.0, 8.0, mine) == {
            "eager_ms": 9.0,
            "ceiling_ms": 8.0,
            "sharers": 0,
        }
        others = [_enter_in_thread(lambda: DeviceLock(path, slots=3, gather_s=0).shared()) for _ in range(2)]
        assert all(entered.wait(5) for entered, _, _ in others)
        assert mine.sharers() == 2
        # beside two others a forward may read three times long: a stop needs three times the ceiling
        assert over_ceiling(23.0, 8.0, mine) is None
        assert over_ceiling(25.0, 8.0, mine) == {"eager_ms": 25.0, "ceiling_ms": 8.0, "sharers": 2}
        _, release, thread = others.pop()
        release.set()
        thread.join(5)
        assert mine.sharers() == 1
    assert mine.sharers() == 0  # let go
    assert over_ceiling(7.0, 8.0, None) is None and over_ceiling(90.0, None, None) is None
    assert over_ceiling(9.0, 8.0, None)["sharers"] == 0  # no GPU lock (a CPU run's): nothing shares
    _, release, thread = others.pop()
    release.set()
    thread.join(5)


class _Clock:
    """A monotonic clock that moves only when slept on (the lock's `time`, in a test)."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_a_timing_waits_until_the_memory_freed_before_it_is_cleared_and_no_longer_than_the_cap(tmp_path, monkeypatch):
    import pytest

    import opsynth.filters.device_lock as dl

    clock = _Clock()
    monkeypatch.setattr(dl, "time", clock)
    path = str(tmp_path / "gpu0")
    freeing, other, timing = dl.DeviceLock(path, slots=3), dl.DeviceLock(path, slots=3), dl.DeviceLock(path, 3, 0)
    with freeing.briefly():
        freeing.clearing(0.05)
    with other.briefly():
        other.clearing(0.01)  # an earlier end than one already said: the later stays
    clock.now += 0.02
    with timing:
        pass
    assert clock.slept == [pytest.approx(0.03)]
    with timing:  # cleared by now: no wait
        pass
    with freeing, freeing.briefly():  # within a hold of its own, as it is
        freeing.clearing(0.01)
    with timing:
        pass
    assert clock.slept[1:] == [pytest.approx(0.01)]
    with freeing.briefly():
        freeing.clearing(1e9)  # as task code could write it
    with timing:
        pass
    assert clock.slept[2:] == [dl.CLEARING_WAIT_MAX_S]


def test_cached_memory_is_given_back_while_no_timing_runs_and_its_clearing_is_waited_for(tmp_path, monkeypatch):
    import pytest

    import opsynth.filters.device_lock as dl
    from opsynth.filters.device_holds import give_back_cached

    clock = _Clock()
    monkeypatch.setattr(dl, "time", clock)
    path = str(tmp_path / "gpu0")

    class Cuda:
        reserved, timing_could_enter = 3e9, None

        def memory_reserved(self):
            return self.reserved

        def empty_cache(self):
            self.timing_could_enter = not dl.DeviceLock(path)._taken("rw")
            self.reserved = 1e9

    lock, cuda = dl.DeviceLock(path, slots=3), Cuda()
    give_back_cached(lock, cuda)
    assert cuda.timing_could_enter is False and not lock.held
    assert not dl.DeviceLock(path)._taken("rw")  # let go after the free
    with dl.DeviceLock(path, slots=3, gather_s=0):
        pass
    assert clock.slept == [pytest.approx(2e9 / dl.FREED_CLEARING_BYTES_PER_S)]
    none = Cuda()
    give_back_cached(None, none)  # no lock (a CPU run's): freed all the same
    assert none.reserved == 1e9


def test_a_timing_waiting_for_freed_memorys_clearing_says_so_in_its_watch(tmp_path, monkeypatch):
    """The GPU idles while a timing that has it sleeps out a clearing: its watch tells that wait from one for the
    lock (the pool's sample reads `waiting_for_clearing`), and from holding once it is over."""
    from opsynth.filters import device_lock as dl

    clock = _Clock()
    monkeypatch.setattr(dl, "time", clock)
    path = str(tmp_path / "gpu0")
    freeing = dl.DeviceLock(path, slots=3)
    with freeing.briefly():
        freeing.clearing(0.5)
    watch = [0.0] * dl.WATCH_FIELDS
    timing = dl.DeviceLock(path, slots=1)  # no sharers to sleep it out beside: it does so holding the GPU
    timing.watch(watch)
    seen = []
    sleep = clock.sleep
    monkeypatch.setattr(clock, "sleep", lambda s: (seen.append((watch[dl.WAIT_MODE], watch[dl.HOLD_MODE])), sleep(s)))
    with timing:
        assert watch[dl.WAIT_MODE] == 0 and watch[dl.HOLD_MODE] == dl.ALONE
    assert seen == [(dl.CLEARING, 0.0)] and watch[dl.WAITED_S] == 0.5


def test_a_timing_sleeps_out_a_clearing_while_the_sharers_go_on_and_what_its_drain_saw_freed_holding_the_gpu(
    tmp_path, monkeypatch
):
    """Where no drain is on, a timing sleeps out the clearing of memory freed before it without draining the
    sharers: they go on, and new ones enter, the GPU busy meanwhile. Memory freed after that is cleared while it
    holds the GPU, before its work."""
    import contextlib

    import pytest

    from opsynth.filters import device_lock as dl

    clock = _Clock()
    monkeypatch.setattr(dl, "time", clock)
    path = str(tmp_path / "gpu0")
    freeing, sharer, newcomer = (dl.DeviceLock(path, slots=3) for _ in range(3))
    with freeing.briefly():
        freeing.clearing(0.05)
    timing = dl.DeviceLock(path, slots=3, gather_s=0)
    watch = [0.0] * dl.WATCH_FIELDS
    timing.watch(watch)
    seen = []
    sleep = clock.sleep

    def sleeping(seconds):
        if not seen:  # the sleep before the drain
            seen.append((watch[dl.WAIT_MODE], dl.DeviceLock(path, 3).timing_waits()))
            with newcomer.shared():
                seen.append(newcomer.sharers())  # a task entered beside the one sharing
            with freeing.briefly():
                freeing.clearing(0.08)  # memory freed as the sleep ends, cleared for longer
            held.close()  # the sharer leaves: the timing's drain is over at once
        else:
            seen.append((watch[dl.WAIT_MODE], dl.DeviceLock(path, 3)._taken("rw")))
        sleep(seconds)

    monkeypatch.setattr(clock, "sleep", sleeping)
    with contextlib.ExitStack() as held:
        held.enter_context(sharer.shared())
        with timing:
            pass
    assert seen == [(dl.CLEARING, False), 1, (dl.CLEARING, True)]
    assert clock.slept == [pytest.approx(0.05), pytest.approx(0.03)]  # 0.08 from the sleep's start
