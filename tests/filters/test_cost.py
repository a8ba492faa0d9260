import pytest
import torch

from opsynth.device_speed import DeviceSpeed
from opsynth.filters.cost import ForwardCost


def test_a_forward_is_counted_by_its_computing_operators_on_meta():
    with torch.device("meta"), torch.no_grad():
        linear, x = torch.nn.Linear(1024, 2048), torch.empty(256, 1024)
        with ForwardCost() as counted:
            torch.relu(linear(x)).view(-1).sum()  # the view computes nothing
    cost = counted.cost
    assert cost["flops"] == 2 * 256 * 1024 * 2048
    assert cost["kernels"] == 3  # the matrix product with its bias, relu, sum
    out = 256 * 2048 * 4
    read_by_linear = (256 * 1024 + 2048 * 1024 + 2048) * 4
    assert cost["bytes"] == read_by_linear + out + 2 * out + (out + 4)  # each read and written once per kernel


def test_a_speed_predicts_bytes_operations_and_kernels_and_scales():
    speed = DeviceSpeed(bytes_per_s=1e12, flops_per_s=1e13, kernel_ms=0.005)
    cost = {"bytes": 2e9, "flops": 1e10, "kernels": 4}
    assert speed.predicted_ms(cost) == pytest.approx(2.0 + 1.0 + 0.02)
    assert speed.scaled(1.5).predicted_ms(cost) == pytest.approx(1.5 * 3.02)


@pytest.mark.parametrize(
    "layer",
    [
        lambda: torch.nn.LSTM(32, 48, num_layers=2, batch_first=True, bidirectional=True),
        lambda: torch.nn.LSTM(32, 48, proj_size=16),
        lambda: torch.nn.GRU(32, 48, num_layers=3, bias=False, batch_first=True),
        lambda: torch.nn.RNN(32, 48, nonlinearity="relu"),
    ],
)
def test_a_recurrence_costs_what_its_unrolled_steps_cost_and_keeps_its_shapes(layer, monkeypatch):
    import opsynth.filters.cost

    def counted():
        with torch.device("meta"), torch.no_grad():
            x = torch.empty(4, 9, 32)
            with ForwardCost() as counting:
                out, state = layer()(x)
                out.sum()
        states = state if isinstance(state, tuple) else (state,)
        return counting.cost, [tuple(t.shape) for t in (out, *states)]

    extended = counted()
    monkeypatch.setattr(opsynth.filters.cost, "MIN_EXTENDED_STEPS", 10**6)  # every step run
    assert extended == counted()
