"""The shared quantization-calibration callback (ostquant) inside a real fit + test, on a tiny LM."""

from __future__ import annotations

import json
import math
from functools import partial

import lightning as L
import torch

from callbacks.quant_calibration import QuantCalibration
from layers.attention.outlier_variants import OutlierVariantAttention
from layers.lm import CausalLM
from lightning_modules.ostquant import CausalLMLitModule


class TinyLM(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        text = torch.arange(16).repeat(40)  # a periodic sequence: learnable in a few steps
        rows = text.unfold(0, 17, 7)[:32]
        self.data = [{"input_ids": r[:-1], "labels": r[1:]} for r in rows]

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=8)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.data[:16], batch_size=8)

    test_dataloader = val_dataloader


def test_fit_then_quantize_w4a4kv4(tmp_path):
    torch.manual_seed(0)
    mixer = partial(OutlierVariantAttention, num_heads=2)
    net = CausalLM(vocab_size=16, d_model=16, n_layers=1, mixer=[mixer], pos_embedding="learned", max_len=16)
    module = CausalLMLitModule(net, optimizer=partial(torch.optim.AdamW, lr=1e-2))
    cb = QuantCalibration(methods=["fp", "rtn", "quarot", "ostquant"], steps=3, calib_batches=2, w_quantizer="gptq")
    trainer = L.Trainer(
        max_steps=20,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        enable_model_summary=False,
    )
    dm = TinyLM()
    trainer.fit(module, dm)
    metrics = trainer.test(module, dm, verbose=False)[0]
    res = cb.results
    assert set(res) == {"fp", "rtn", "quarot", "ostquant"}
    assert res["fp"]["kl"] == 0.0 and res["fp"]["ppl_gap"] == 0.0
    assert abs(res["fp"]["loss"] - metrics["test/loss"]) < 1e-4  # the fp reference is the trained model
    for m in ("rtn", "quarot", "ostquant"):
        assert res[m]["kl"] > 0 and math.isfinite(res[m]["ppl"]) and "log_qsur" in res[m]
        assert abs(metrics[f"quant/{m}_ppl_gap"] - res[m]["ppl_gap"]) < 1e-5
    saved = json.loads((tmp_path / "quant_calibration.json").read_text())
    assert saved["bits"] == {"w_bits": 4, "a_bits": 4, "kv_bits": 4} and set(saved["results"]) == set(res)


def test_loss_ablation_methods_learn_with_their_loss(monkeypatch):
    """``ostquant_kl`` / ``ostquant_ce`` run OSTQuant with the full-KL / label-CE loss (the paper's ablation)."""
    torch.manual_seed(0)
    net = CausalLM(
        16, 16, 1, mixer=[partial(OutlierVariantAttention, num_heads=2)], pos_embedding="learned", max_len=16
    )
    ids = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(0))
    calib = [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]
    cb = QuantCalibration(methods=["ostquant", "ostquant_kl", "ostquant_ce", "spinquant"], steps=2, w_quantizer="rtn")
    seen = []
    monkeypatch.setattr(
        cb, "_learn", lambda net, t, calib, steps, learn_scales, loss: seen.append((loss, learn_scales))
    )
    for m in cb.methods:
        assert cb.build(net, m, calib, steps=2) is not None
    assert seen == [("kl_top", True), ("kl", True), ("ce", True), ("ce", False)]
