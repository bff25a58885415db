"""core.rng.fixed_draws: seeded evaluation draws that leave the global stream where it was."""

from __future__ import annotations

import torch

from core.rng import EVAL_SEED, fixed_draws


def test_fixed_draws_repeat_and_restore_the_stream():
    torch.manual_seed(0)
    with fixed_draws(3):
        a = torch.randn(4)
    after = torch.randn(4)
    torch.manual_seed(0)
    assert torch.equal(torch.randn(4), after)  # the block did not consume the outer stream
    torch.manual_seed(123)
    with fixed_draws(3):
        b = torch.randn(4)
    assert torch.equal(a, b)  # independent of the outer state
    with fixed_draws(4):
        c = torch.randn(4)
    assert not torch.equal(a, c)  # the offset changes the draws
    torch.manual_seed(EVAL_SEED + 3)
    assert torch.equal(torch.randn(4), a)  # seed + offset, as documented
