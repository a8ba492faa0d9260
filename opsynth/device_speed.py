"""What a device sustains; with a forward's counted cost (bytes, operations, kernels) it predicts the forward's time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpeed:
    """What a device sustains: bytes per second through its memory, floating-point operations per second, and
    the device time of one small kernel."""

    bytes_per_s: float
    flops_per_s: float
    kernel_ms: float

    def scaled(self, k: float) -> DeviceSpeed:
        """The same device, every time it predicts multiplied by `k` (a correction from measured times)."""
        return DeviceSpeed(self.bytes_per_s / k, self.flops_per_s / k, self.kernel_ms * k)

    def fixed_ms(self, cost: dict) -> float:
        """The part of a forward's predicted time that does not grow with its sizes: its kernels' least time."""
        return cost["kernels"] * self.kernel_ms

    def predicted_ms(self, cost: dict) -> float:
        """A forward's device time: each byte moved and each operation at the sustained rates, and each kernel
        at least `kernel_ms`."""
        return 1e3 * (cost["bytes"] / self.bytes_per_s + cost["flops"] / self.flops_per_s) + cost["kernels"] * (
            self.kernel_ms
        )
