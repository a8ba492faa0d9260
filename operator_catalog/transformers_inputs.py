"""The input shapes of a standalone transformers module, within the workload's element budget: images, token
sequences, attention's tokens (its unseen scores budgeted too), channels-last patch grids.
"""

from __future__ import annotations

import math
import random

from opsynth.operator_catalog.entry import within_input_budget
from opsynth.workload import Workload


def image_shape(rng: random.Random, wl: Workload, channels: int) -> tuple[int, ...]:
    """(batch, channels, side, side), the largest of batch and side cut until it fits the input budget."""
    side = rng.choice(wl.spatial[4])
    return within_input_budget((rng.choice(wl.batch_sizes), channels, side, side), wl)


def sequence_shape(rng: random.Random, wl: Workload, hidden: int) -> tuple[int, ...]:
    """(batch, tokens, hidden): batch or tokens cut to fit the input budget, the hidden size the module's own."""
    return within_input_budget((rng.choice(wl.batch_sizes), rng.choice(wl.spatial[3]), hidden), wl, fixed=(2,))


def head_count(rng: random.Random, hidden: int) -> int:
    return rng.choice([h for h in (1, 2, 4, 8) if hidden % h == 0 and hidden // h >= 8] or [1])


def attention_tokens(wl: Workload, batch: int) -> int:
    """The most tokens an attention module may see: its (batch, heads <= 8, tokens, tokens) scores, which its
    output does not show, stay within the workload's element budget."""
    return max(4, math.isqrt(wl.max_elements // (8 * batch)))


def token_shape(rng: random.Random, wl: Workload, hidden: int, length: int | None = None) -> tuple[int, ...]:
    """(batch, tokens, hidden) for attention; `length` fixes the token count where the module ties it to its
    config."""
    if length is None:
        batch, tokens, _ = sequence_shape(rng, wl, hidden)
        return (batch, min(tokens, attention_tokens(wl, batch)), hidden)
    return within_input_budget((rng.choice(wl.batch_sizes), length, hidden), wl, fixed=(1, 2))


def grid_shape(rng: random.Random, wl: Workload, hidden: int) -> tuple[int, ...]:
    """(batch, height, width, hidden): channels-last patch grids of ViT-style attention over all patches."""
    batch = rng.choice(wl.batch_sizes)
    side = min(rng.choice(wl.spatial[4]) // 2, math.isqrt(attention_tokens(wl, batch)))
    return within_input_budget((batch, side, side, hidden), wl, fixed=(1, 2, 3))


def small_image_shape(rng: random.Random, wl: Workload, channels: int, divisor: int = 1) -> tuple[int, ...]:
    """(batch, channels, side, side) with a side divisible by `divisor`, only the batch cut to fit the budget."""
    side = max(divisor, rng.choice(wl.spatial[4]) // divisor * divisor)
    return within_input_budget((rng.choice(wl.batch_sizes), channels, side, side), wl, fixed=(1, 2, 3))
