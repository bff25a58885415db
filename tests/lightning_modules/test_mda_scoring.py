"""The benchmark's scoring conventions: RISE as the official MDA test scores it, the raw AUC
beside it, negative monotonicity on the blur substrate, and the official pixel-step monotonicity; hand numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from lightning_modules.mda.evaluation import EXTRA, FAITHFULNESS, LOWER_IS_BETTER, score_map
from ops.attribution import metrics as M

# A 4x2 all-ones image scored by a linear two-class model. The saliency visits the pixels in raster order, two per
# step (step = W = 2), so the steps move the pixel pairs whose weights sum to +0.5, -0.3, +0.4, +0.1.
IMG = torch.ones(1, 4, 2, dtype=torch.float64)
WEIGHTS = torch.tensor([0.25, 0.25, -0.15, -0.15, 0.2, 0.2, 0.05, 0.05], dtype=torch.float64)
SAL = torch.arange(8, 0, -1, dtype=torch.float64).reshape(4, 2)
ROWS = torch.arange(4)[:, None].expand(4, 2)  # one segment per image row (= one step's pixel pair)


def linear(x: torch.Tensor) -> torch.Tensor:
    p0 = (0.1 + x.reshape(len(x), -1) @ WEIGHTS).clamp(0.0, 1.0)
    return torch.stack([p0, 1 - p0], 1)


def test_rise_is_scored_on_the_normalised_curve_with_the_raw_auc_beside_it():
    """Insertion (zero substrate) raw [0.1, 0.6, 0.3, 0.7, 0.8] -> normalised [0, 5/7, 2/7, 6/7, 1] -> running max
    [0, 5/7, 5/7, 6/7, 1]; deletion (black) raw [0.8, 0.3, 0.6, 0.2, 0.1] -> running min [1, 2/7, 2/7, 1/7, 0]."""
    out = score_map(linear, IMG, SAL, 0, torch.zeros_like(IMG), ROWS)
    assert out["rise_ins"] == pytest.approx((5 / 7 + 5 / 7 + 6 / 7 + 0.5) / 4)  # 0.696 (official)
    assert out["rise_del"] == pytest.approx((0.5 + 2 / 7 + 2 / 7 + 1 / 7) / 4)  # 0.304
    assert out["rise_insdel"] == pytest.approx(out["rise_ins"] - out["rise_del"])
    assert out["rise_ins_raw"] == pytest.approx((0.05 + 0.6 + 0.3 + 0.7 + 0.4) / 4)  # 0.5125 (Petsiuk)
    assert out["rise_del_raw"] == pytest.approx((0.4 + 0.3 + 0.6 + 0.2 + 0.05) / 4)  # 0.3875
    assert out["rise_insdel_raw"] == pytest.approx(out["rise_ins_raw"] - out["rise_del_raw"])
    # the official RISE score is the AUC of the curve mas_single_run returns last
    norm = M.mas_single_run(linear, IMG, SAL, "ins", torch.zeros_like(IMG), 2, 0)[4]
    assert out["rise_ins"] == pytest.approx(M.auc(norm))
    assert set(EXTRA) <= set(out) and set(FAITHFULNESS) <= set(out)
    assert "rise_del_raw" in LOWER_IS_BETTER and "rise_ins_raw" not in LOWER_IS_BETTER


def test_negative_monotonicity_deletes_into_blur_black_as_an_option():
    """Blur substrate 0 on rows 0, 2 and 3 and 1 on row 1 (deleting row 1 then changes nothing): the negative curve
    is [0.8, 0.3, 0.3, 0.0, 0.0] on blur and [0.8, 0.3, 0.6, 0.2, 0.1] on black (rho 0.9)."""
    blurred = torch.zeros_like(IMG)
    blurred[0, 1] = 1.0
    on_blur = score_map(linear, IMG, SAL, 0, blurred, ROWS)
    on_black = score_map(linear, IMG, SAL, 0, blurred, ROWS, mono_neg_substrate="black")
    raw_blur, rho_blur = M.monotonicity(linear, IMG, SAL, "negative", blurred, 0, ROWS)
    np.testing.assert_allclose(raw_blur, [0.8, 0.3, 0.3, 0.0, 0.0], atol=1e-12)
    assert on_blur["mono_neg"] == pytest.approx(rho_blur) and rho_blur == pytest.approx(np.sqrt(0.9))
    assert on_black["mono_neg"] == pytest.approx(0.9)
    # the pixel-step twins follow the same substrate; positive monotonicity is on blur either way
    assert on_blur["mono_pix_neg"] == pytest.approx(rho_blur) and on_black["mono_pix_neg"] == pytest.approx(0.9)
    assert on_blur["mono_pos"] == on_black["mono_pos"]
    with pytest.raises(ConfigError, match="mono_neg_substrate='grey'"):
        score_map(linear, IMG, SAL, 0, blurred, ROWS, mono_neg_substrate="grey")


def test_pixel_step_monotonicity_by_hand():
    """The official maskless form: ``step`` pixels per step in decreasing saliency, Spearman with a ramp."""
    zero = torch.zeros_like(IMG)
    raw, rho = M.pixel_monotonicity(linear, IMG, SAL, "positive", zero, 2, 0)
    np.testing.assert_allclose(raw, [0.1, 0.6, 0.3, 0.7, 0.8], atol=1e-12)
    assert rho == pytest.approx(0.9)  # ranks 1, 3, 2, 4, 5 against 1..5
    np.testing.assert_allclose(raw, M.rise_curve(linear, IMG, SAL, "ins", zero, 2, 0))  # = the raw insertion curve
    raw_n, rho_n = M.pixel_monotonicity(linear, IMG, SAL, "negative", zero, 4, 0)  # 4 pixels per step
    np.testing.assert_allclose(raw_n, [0.8, 0.6, 0.1], atol=1e-12)
    assert rho_n == pytest.approx(1.0)
    raw_rev, _ = M.pixel_monotonicity(linear, IMG, -SAL, "positive", zero, 2, 0)  # the reversed pixel order
    np.testing.assert_allclose(raw_rev, [0.1, 0.2, 0.6, 0.3, 0.8], atol=1e-12)
    assert M.ramp_spearman(np.array([0.3, 0.3, 0.3]), "negative") == 0.0
    with pytest.raises(ConfigError, match="mode"):
        M.pixel_monotonicity(linear, IMG, SAL, "up", zero, 2, 0)


def test_bad_substrate_fails_at_construction():
    from timm.models.vision_transformer import VisionTransformer

    from lightning_modules.mda import MdaLitModule

    net = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=16, depth=1, num_heads=2)
    with pytest.raises(ConfigError, match="mono_neg_substrate='white'"):
        MdaLitModule(net, num_classes=3, attribution={"enabled": True, "methods": [], "mono_neg_substrate": "white"})
    MdaLitModule(net, num_classes=3, attribution={"enabled": True, "methods": [], "mono_neg_substrate": "black"})
