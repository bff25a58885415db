"""End-to-end known answer: a classifier whose decision provably depends on one patch only.

Hand-set weights: class 0's logit is ``5 * sum(pixels of patch K) - 12`` and every other weight is zero, so no other
pixel can move the output. On an image where patch K is bright, MDA (from a prior that does not put K first) and
integrated gradients must rank K first, and the official RISE insertion AUC of a map must beat the same map with
its patch values shuffled. The indicator of K passes; the same map with its sign flipped must fail.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_modules.mda.baselines import integrated_gradients
from lightning_modules.mda.evaluation import model_probs, score_map
from ops.attribution.mda import calibrate_blur, mda
from ops.attribution.metrics import segment_means

K = 10  # patch row 2, column 2 of the 4x4 grid of 2x2 patches: pixels [4:6, 4:6]
GRID = torch.arange(16).reshape(4, 4).repeat_interleave(2, 0).repeat_interleave(2, 1)  # [8, 8] patch labels
PERM = (torch.arange(16) + 5) % 16  # the shuffle: patch i takes patch i + 5's value (K's value moves to patch 5)


class OnePatch(nn.Module):
    """Logits ``[B, 3]`` of ``[B, 1, 8, 8]`` images, reading the pixels of patch ``K`` only."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 3).double()
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[0, (GRID == K).reshape(-1)] = 5.0
            self.fc.bias.copy_(torch.tensor([-12.0, 0.0, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(len(x), -1).double())


def _setup():
    model = OnePatch().eval()
    img = torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.5
    img[0, GRID == K] = 1.0
    fn = model_probs(model)
    blurred = calibrate_blur(fn, img, 0, 3, 2, 9, max_conf=0.05)
    assert blurred is not None
    return model, fn, img, blurred


def shuffled(sal: torch.Tensor) -> torch.Tensor:
    return segment_means(sal, GRID)[PERM][GRID]


def insertion_auc(fn, img, sal, blurred) -> float:
    return score_map(fn, img, sal, 0, blurred, GRID)["rise_ins"]  # the official (normalised) convention


def passes(fn, img, sal, blurred) -> bool:
    """The known-answer test: K is the strict top patch and the insertion AUC beats the shuffled map's."""
    v = segment_means(sal, GRID)
    order = torch.sort(-v, stable=True).indices
    first = int(order[0]) == K and float(v[K]) > float(v[order[1]])
    return first and insertion_auc(fn, img, sal, blurred) > insertion_auc(fn, img, shuffled(sal), blurred)


def test_the_classifier_depends_on_patch_k_only():
    model, fn, img, (b, _) = _setup()
    other = img.clone()
    other[0, GRID != K] = torch.rand(60, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(model(other[None]), model(img[None]), rtol=0, atol=0)
    assert float(fn(img[None])[0, 0]) > 0.99 and float(fn(b[None])[0, 0]) <= 0.05


def test_mda_and_integrated_gradients_rank_the_known_patch_first():
    model, fn, img, cal = _setup()
    b = cal[0]
    truth = (GRID == K).double()
    assert passes(fn, img, truth, b)
    assert not passes(fn, img, -truth, b)  # a sign-flipped map fails ...
    # ... on the AUC criterion alone too: K inserted last loses to K inserted mid-way
    assert insertion_auc(fn, img, -truth, b) < insertion_auc(fn, img, shuffled(-truth), b)
    assert insertion_auc(fn, img, truth, b) > 0.9  # K first: the curve is at the top after one step

    # MDA from a prior that ranks K third (inside the first candidate window of 8, not at its head)
    prior_vals = torch.rand(16, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.5
    prior_vals[[3, 7, K]] = torch.tensor([1.0, 0.9, 0.8], dtype=torch.float64)
    res = mda(fn, img, prior_vals[GRID], 16, target=0, segments=GRID, blurred=cal, gammas=(0.0, 1.0))
    assert res.insertion_prefix == [K]
    for gamma in (0.0, 1.0):
        assert passes(fn, img, res.maps[gamma], b), gamma
        assert not passes(fn, img, -res.maps[gamma], b), gamma
    assert not passes(fn, img, prior_vals[GRID], b)  # the prior alone does not pass: MDA found K

    ig = integrated_gradients(model, img[None], 0, n_steps=32)
    assert float(ig[GRID != K].abs().max()) == 0.0  # no gradient reaches the other pixels
    assert passes(fn, img, ig, b)
    assert not passes(fn, img, -ig, b)
