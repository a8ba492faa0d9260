"""A first forward's rehearsal: captured, never run, the generators and the allocator left as they were, and a model
or task module that its first forward changes told apart (loaded and built again by the execution)."""

import pytest
import torch

from opsynth.filters.rehearsal import model_state, rehearse


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x)).sum(dim=1)


class Caching(torch.nn.Module):
    """Makes a tensor on its first forward: a capture would leave it unset."""

    def __init__(self):
        super().__init__()
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = torch.ones_like(x)
        return x + self.cache


class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x):
        self.total.add_(1)
        return x * self.total


_CACHE: dict = {}


class GlobalCaching(torch.nn.Module):
    """Fills a cache of its module's on its first forward: a capture would leave it holding a tensor never made."""

    def forward(self, x):
        if x.shape not in _CACHE:
            _CACHE[x.shape] = torch.ones_like(x)
        return x + _CACHE[x.shape]


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x


class Random(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x) + torch.rand(1).item()


class Synchronizing(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum() * x.max().item()


class WritesItsInput(torch.nn.Module):
    def forward(self, x):
        return x.mul_(2)


def test_a_models_state_changes_with_what_a_forward_may_set_and_not_with_a_pure_forward():
    x = torch.randn(4, 8)
    pure = Plain()
    before = model_state(pure)
    pure(x)
    assert model_state(pure) == before
    for model in (Caching(), InPlace(), Counting(), GlobalCaching()):
        before = model_state(model)
        model(x)
        assert model_state(model) != before, type(model).__name__
    replaced = Plain()
    before = model_state(replaced)
    replaced.linear.weight = torch.nn.Parameter(torch.zeros(8, 8))
    assert model_state(replaced) != before


def test_the_execution_rehearses_holding_nothing_only_where_its_task_shares_the_gpu(tmp_path, monkeypatch):
    """The checks' rehearsal lets the GPU go meanwhile, gives memory back before it shares it again, and counts its
    wait to share it again as a wait for the lock; a task holding the GPU alone (retried for want of memory) is not
    rehearsed."""
    from opsynth.filters import rehearsal
    from opsynth.filters.device_lock import DeviceLock
    from opsynth.filters.timing import PhaseClock

    lock = DeviceLock(str(tmp_path / "gpu0"), slots=2)
    held_meanwhile: list[bool] = []
    monkeypatch.setattr(rehearsal, "rehearse", lambda model, inputs: held_meanwhile.append(lock.held) or False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    clock = PhaseClock()

    def release():
        held_meanwhile.append(lock.held)

    with lock.shared():
        assert rehearsal.rehearsed(torch.nn.Identity(), [], lock, clock, release) is False, "the rehearsal's answer"
        assert lock.held and lock.sharing
    assert held_meanwhile == [False, False], "rehearsed, then memory given back, holding nothing"
    assert {"rehearsal", "lock_wait"} <= set(clock.seconds)
    with lock.alone(), lock.shared():
        assert rehearsal.rehearsed(torch.nn.Identity(), [], lock, clock, release) is True
    assert held_meanwhile == [False, False], "held alone: not rehearsed"


@pytest.mark.gpu
def test_a_rehearsal_runs_no_kernel_and_tells_a_model_its_first_forward_changes():
    x = torch.randn(4, 8, device="cuda")
    kept = x.clone()
    assert rehearse(WritesItsInput().cuda(), [x])
    torch.cuda.synchronize()
    assert torch.equal(x, kept), "the captured in-place write never ran"
    assert rehearse(Plain().cuda(), [x])
    assert not rehearse(Caching().cuda(), [x])
    assert not rehearse(InPlace().cuda(), [x])
    _CACHE.clear()
    assert not rehearse(GlobalCaching().cuda(), [x])


@pytest.mark.gpu
def test_draws_after_a_rehearsal_good_or_failed_are_those_without_one():
    x = torch.randn(4, 8, device="cuda")

    def draws(model=None) -> tuple:
        torch.manual_seed(3)
        if model is not None:
            rehearse(model.cuda(), [x])
        return torch.rand(5, device="cuda").tolist(), torch.rand(5).tolist()

    expected = draws()
    assert draws(Random()) == expected
    assert draws(Synchronizing()) == expected
    assert draws(Random()) == expected, "a failed capture left the generator usable"
    assert torch.cuda.get_sync_debug_mode() == 0


class AllocatesThenSynchronizes(torch.nn.Module):
    """Stopped by torch before its synchronization reaches CUDA: the capture ends cleanly."""

    def forward(self, x):
        y = torch.cat([x] * 64)  # 256 MiB in the capture's pool before it stops
        return y.max().item()


class AllocatesThenQueries(torch.nn.Module):
    """Asks CUDA whether its stream is done, which a capture does not allow: the capture is spoilt."""

    def forward(self, x):
        y = torch.cat([x] * 64)
        torch.cuda.current_stream().query()
        return y


@pytest.mark.gpu
@pytest.mark.parametrize("model", [AllocatesThenSynchronizes, AllocatesThenQueries])
def test_a_failed_rehearsal_gives_its_memory_back_and_leaves_no_capture_behind(model):
    big = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    for _ in range(3):
        assert rehearse(model(), [big])
    assert not torch.cuda.is_current_stream_capturing()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == reserved
    assert torch.equal(torch.cat([big] * 2)[:1024], big), "allocations and kernels go on as before"
