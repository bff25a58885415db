"""The shared outlier-census callback (systematic_outliers): hooks, planted outliers, CSV/PNG over a short fit."""

from __future__ import annotations

import csv
from functools import partial

import lightning as L
import pytest
import torch
from torch import nn

from callbacks.outlier_census import OutlierCensus, run_census, summarize
from core.errors import ConfigError
from layers.attention.outlier_variants import OutlierVariantAttention
from layers.lm import CausalLM
from lightning_modules.systematic_outliers import CausalLMLitModule


class Planted(nn.Module):
    """Two 'blocks'; block 1 writes a massive value into channel 3 of token 0, its o_proj has one big weight."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
        self.o_proj = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.o_proj.weight.fill_(0.1)
            self.o_proj.weight[0, 0] = 5.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        y = x.clone()
        y[:, 0, 3] = 1e4
        return self.blocks[1](y)


def test_run_census_on_planted_model():
    x = torch.full((2, 8, 4), 0.5)
    m = Planted()
    rows = run_census(m, lambda: m(x), activation_pattern=r"^blocks\.\d+$", weight_pattern=r"o_proj$", k=[10.0])
    get = {(r["name"], r["metric"]): r["value"] for r in rows}
    assert get[("blocks.0", "token_frac_k10")] == 0.0
    assert get[("blocks.1", "token_frac_k10")] == pytest.approx(2 / 16)
    assert get[("blocks.1", "dims_k10")] == "3"
    assert get[("blocks.1", "top1")] == 1e4
    assert get[("blocks.1", "ratio")] == pytest.approx(1e4 / 0.5)
    assert get[("o_proj", "ratio")] == pytest.approx(50.0)
    s = summarize(rows)
    assert s["census/act_ratio_max"] == pytest.approx(2e4) and s["census/weight_ratio_max"] == pytest.approx(50.0)


def test_bad_config():
    with pytest.raises(ConfigError, match="every_n_steps"):
        OutlierCensus(every_n_steps=0)
    with pytest.raises(ConfigError, match="activation_pattern"):
        OutlierCensus(activation_pattern="(")
    m = Planted()
    with pytest.raises(ConfigError, match="matches no module"):
        run_census(m, lambda: m(torch.ones(1, 2, 4)), activation_pattern="^nothing$")


def test_callback_over_a_short_fit(tmp_path):
    torch.manual_seed(0)
    mixer = partial(OutlierVariantAttention, num_heads=2, variant="softmax")
    net = CausalLM(vocab_size=16, d_model=16, n_layers=2, mixer=[mixer], pos_embedding="learned", max_len=8)
    module = CausalLMLitModule(net, optimizer=partial(torch.optim.AdamW, lr=1e-2))
    ids = torch.randint(0, 16, (32, 9))
    data = [{"input_ids": r[:-1], "labels": r[1:]} for r in ids]
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    cb = OutlierCensus(every_n_steps=2, k=[10.0])
    trainer = L.Trainer(
        max_steps=4,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    steps = sorted({r["step"] for r in cb.history})
    assert steps == [0, 2, 4]
    names = {r["name"] for r in cb.history if r["kind"] == "act"}
    assert names == {"net.blocks.0", "net.blocks.1"}
    sinks = [r["value"] for r in cb.history if r["kind"] == "attn"]
    assert len(sinks) == 2 * 3 and all(0.0 < s < 1.0 for s in sinks)
    weights = {r["name"] for r in cb.history if r["kind"] == "weight"}
    assert weights == {f"net.blocks.{i}.{p}" for i in (0, 1) for p in ("mixer.o_proj", "mlp.down_proj")}
    with open(tmp_path / "outlier_census.csv") as f:
        assert len(list(csv.DictReader(f))) == len(cb.history)
    assert (tmp_path / "outlier_census.png").stat().st_size > 1000
    assert module.net.blocks[0].mixer.record_attention is False  # restored after each census
