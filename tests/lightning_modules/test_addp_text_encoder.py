"""ADDP's expression encoder: ``model.text_encoder=hash`` (the datamodule's bag-of-words hash, the
embedded stand-in) or ``bert`` (a pretrained transformers encoder, frozen by default, projected to the denoiser's
condition width). A tiny randomly initialised BertModel and a WordPiece tokenizer over a small vocabulary are saved
to a temporary folder and loaded through ``model.text_encoder_path``, as a user's local weights would be: no network.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning import Trainer

from core.errors import ConfigError
from datamodules.perception import PerceptionDataModule, embed_expression
from lightning_modules.addp import AddpLitModule
from suite.build import instantiate
from tests.conftest import compose_train

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["the", "a", "red", "green", "blue", "yellow", "square", "disc", "triangle", "object", "man", "on", "left"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """A tiny BERT (hidden 32, 2 layers, 2 heads) and its tokenizer, saved with ``save_pretrained``."""
    from transformers import BertConfig, BertModel, BertTokenizer

    path = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(path)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(path)
    return path


def _model(tmp_path: Path, *overrides: str) -> AddpLitModule:
    """The addp experiment's model, composed and instantiated as ``python -m train`` does (``suite.run``)."""
    cfg = compose_train(
        [
            "experiment=addp",
            "data.task=refseg",
            "model.net.channels=8",
            "model.net.emb_dim=16",
            "model.T=20",
            "model.n_steps=4",
            "model.restart_step=2",
            *overrides,
        ],
        tmp_path,
    )
    torch.manual_seed(0)
    return instantiate(cfg.model, "model")


def _batch(n: int = 6) -> dict:
    dm = PerceptionDataModule(task="refseg", image_size=8, n_train=n, n_val=n, n_test=n, batch_size=n)
    dm.setup()
    return next(iter(dm.loader("train", shuffle=False)))


def _bert(tmp_path: Path, bert_dir: Path, *overrides: str) -> AddpLitModule:
    return _model(tmp_path, "model.text_encoder=bert", f"model.text_encoder_path={bert_dir}", *overrides)


def test_embedded_items_carry_the_text_the_hash_was_made_of():
    b = _batch()
    assert isinstance(b["text"], list) and len(b["text"]) == 6 and all(isinstance(t, str) for t in b["text"])
    for i in range(6):
        assert torch.equal(b["cond"][i], embed_expression(b["text"][i], 64))
        assert torch.equal(b["refined"][i], embed_expression(b["refined_text"][i], 64))
        lines = b["obj_texts"][i].split("\n")
        assert len(lines) == 3 and lines[0] == b["refined_text"][i]
        assert all(torch.equal(b["obj_conds"][i, j], embed_expression(t, 64)) for j, t in enumerate(lines))
    dm = PerceptionDataModule(task="depth", image_size=8, n_train=4, n_val=4, n_test=4)
    dm.setup()
    assert dm.datasets["train"][0]["text"] == ""  # depth has no expression


def test_bert_loads_from_a_local_folder_and_conditions_the_module(tmp_path: Path, bert_dir: Path):
    m = _bert(tmp_path, bert_dir)
    assert type(m.text_encoder.encoder).__name__ == "BertModel" and m.hparams.text_encoder_trainable is False
    assert m.text_encoder.proj.in_features == 32 and m.text_encoder.proj.out_features == m.cond_dim == 64
    batch = _batch()
    x0, _, c = m.encode(batch)
    assert c["cond"].shape == (6, 64) and torch.isfinite(c["cond"]).all()
    assert m.expression(batch, "obj_conds").shape == (6, 3, 64)
    pred, calls = m.predict(c)
    assert pred.shape == x0.shape == (6, 1, 8, 8) and len(calls) == 4
    # one optimiser step moves the projection; the loss is finite
    opt = m.configure_optimizers()
    w0 = m.text_encoder.proj.weight.detach().clone()
    loss = m.training_step(batch, 0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and not torch.equal(w0, m.text_encoder.proj.weight)
    # and through Lightning: the strings collate and travel with the batch; the test's correction rounds encode the
    # objects' and the refined expressions
    dm = PerceptionDataModule(task="refseg", image_size=8, n_train=8, n_val=8, n_test=8, batch_size=4)
    trainer = Trainer(fast_dev_run=1, accelerator="cpu", logger=False, enable_progress_bar=False)
    trainer.fit(m, datamodule=dm)
    out = trainer.test(m, datamodule=dm, verbose=False)[0]
    assert {"test/iou_round1", "test/iou_round3"} <= set(out)


def test_different_expressions_give_different_conditioning(tmp_path: Path, bert_dir: Path):
    m = _bert(tmp_path, bert_dir)
    texts = ["the red disc", "the blue square", "the red disc", "the disc", ""]
    with torch.no_grad():
        e = m.text_encoder(texts)
    assert e.shape == (5, 64)
    assert torch.equal(e[0], e[2])  # the same expression, the same vector
    for i, j in [(0, 1), (0, 3), (1, 3)]:
        assert float((e[i] - e[j]).norm()) > 0.05 * float(e[i].norm()), (texts[i], texts[j])
    assert float(e[4].abs().sum()) == 0.0  # no expression: the null condition of classifier-free guidance
    # the denoiser's output follows the expression
    batch = _batch(2)
    batch = {**batch, "text": ["the red disc", "the blue square"]}
    _, _, c = m.encode(batch)
    x, sigma = torch.zeros(1, 1, 8, 8), torch.ones(1)
    img = c["cond_image"][:1]
    with torch.no_grad():
        d0 = m.precond(x, sigma, cond_image=img, cond=c["cond"][:1])
        d1 = m.precond(x, sigma, cond_image=img, cond=c["cond"][1:])
    assert float((d0 - d1).abs().max()) > 1e-4


@pytest.mark.parametrize("trainable", [False, True])
def test_frozen_encoder_gets_no_gradient_while_the_projection_trains(tmp_path: Path, bert_dir: Path, trainable):
    m = _bert(tmp_path, bert_dir, f"model.text_encoder_trainable={str(trainable).lower()}")
    m.train()
    enc = m.text_encoder.encoder
    assert enc.training is trainable  # frozen: eval mode (no dropout) even when the module trains
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    opt = m.configure_optimizers()
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    n_enc = sum(p.numel() for p in enc.parameters())
    assert n_opt == sum(p.numel() for p in m.parameters()) - (0 if trainable else n_enc)
    batch = {**_batch(), "text": ["the red disc", "the blue square", "the green triangle"] * 2}
    for _ in range(2):
        loss = m.training_step(batch, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert m.text_encoder.proj.weight.grad is not None and float(m.text_encoder.proj.weight.grad.abs().sum()) > 0
    grads = [p.grad for p in enc.parameters()]
    if trainable:
        assert any(g is not None and float(g.abs().sum()) > 0 for g in grads)
        assert any(not torch.equal(before[k], v) for k, v in enc.state_dict().items())
    else:
        assert all(g is None for g in grads) and not any(p.requires_grad for p in enc.parameters())
        assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())


def test_bad_path_or_encoder_is_a_one_line_config_error(tmp_path: Path, bert_dir: Path):
    no_weights = tmp_path / "no_weights"  # a config and a tokenizer, but no weights file
    no_weights.mkdir()
    for f in bert_dir.iterdir():
        if f.suffix != ".safetensors":
            (no_weights / f.name).write_bytes(f.read_bytes())
    cases = [
        (["model.text_encoder=bert", f"model.text_encoder_path={tmp_path / 'missing'}"], "no such folder"),
        (["model.text_encoder=bert", f"model.text_encoder_path={tmp_path}"], "has no config.json"),
        (["model.text_encoder=bert", f"model.text_encoder_path={no_weights}"], "does not load"),
        (["model.text_encoder=bert"], "needs model.text_encoder_path"),
        (["model.text_encoder=bert", f"model.text_encoder_path={bert_dir}", "model.text_pooling=max"], "max"),
    ]
    for overrides, why in cases:
        with pytest.raises(ConfigError) as err:
            _model(tmp_path, *overrides)
        msg = str(err.value)
        assert "\n" not in msg and why in msg, msg
        assert ("model.text_encoder_path" in msg) or ("model.text_pooling" in msg), msg
    with pytest.raises(ConfigError, match=r"model.text_encoder='clip' must be one of \['hash', 'bert'\]"):
        _model(tmp_path, "model.text_encoder=clip")
    m = _model(tmp_path)  # the default is the embedded stand-in: no encoder, the batch's hashed vectors
    batch = _batch()
    assert m.text_encoder is None and torch.equal(m.encode(batch)[2]["cond"], batch["cond"])
