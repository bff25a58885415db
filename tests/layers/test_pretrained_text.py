"""PretrainedTextEncoder (ADDP's ``model.text_encoder=bert``): tiny random transformers encoders saved to a temporary
folder (no network): BERT's poolings, masked mean pooling independent of the padding, CLIP's text tower (alone or
inside a dual encoder), and a model without a pooled output refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from layers.vision_language.pretrained_text import PretrainedTextEncoder

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "red",
    "blue",
    "disc",
    "square",
    "man",
    "on",
    "left",
    "in",
]
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32}


def _save(path: Path, model) -> str:
    from transformers import BertTokenizer

    BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)}).save_pretrained(path)
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
def test_bert_poolings_and_padding_free_mean(tmp_path: Path, pooling: str):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, **SMALL)
    path = _save(tmp_path, BertModel(cfg))
    enc = PretrainedTextEncoder.from_pretrained(path, 16, pooling=pooling, cache_size=0)
    alone = enc(["the red disc"])
    padded = enc(["the red disc", "the blue square man on the left in the"])  # row 0 padded with 6 [PAD]
    assert alone.shape == (1, 16) and padded.shape == (2, 16)
    assert torch.allclose(alone[0], padded[0], atol=1e-5)  # padding changes no expression's vector
    cached = PretrainedTextEncoder.from_pretrained(path, 16, pooling=pooling)
    cached.proj.load_state_dict(enc.proj.state_dict())
    first = cached(["the blue square man on the left in the", "the red disc"])
    assert len(cached._cache) == 2 and torch.allclose(
        cached(["the red disc"])[0], first[1], atol=1e-6
    )  # from the cache
    assert torch.allclose(first[1], alone[0], atol=1e-5)
    if pooling == "mean":  # by hand: the masked mean of the token features, then the projection
        tok = enc.tokenizer(["the red disc"], return_tensors="pt")
        h = enc.encoder(**tok).last_hidden_state[0]
        assert torch.allclose(alone[0], enc.proj(h.mean(0)), atol=1e-5)


@pytest.mark.parametrize("dual", [False, True])
def test_clip_text_tower_loads_alone_or_from_a_dual_encoder(tmp_path: Path, dual: bool):
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    text = {
        "vocab_size": len(VOCAB),
        "hidden_size": 32,
        "intermediate_size": 64,
        "projection_dim": 16,
        **SMALL,
        "bos_token_id": 2,
        "eos_token_id": 3,
        "pad_token_id": 0,
    }  # pooler = the [SEP] (end-of-text) token
    if dual:
        vision = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
            "projection_dim": 16,
        }
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    else:
        model = CLIPTextModel(CLIPTextConfig(**text))
    enc = PretrainedTextEncoder.from_pretrained(_save(tmp_path, model), 8, pooling="pooler")
    assert not hasattr(enc.encoder, "vision_model")  # only the text tower is used
    e = enc(["the red disc", "the blue square", ""]).detach()
    assert e.shape == (3, 8) and float(e[2].abs().sum()) == 0.0 and not torch.allclose(e[0], e[1])


def test_an_encoder_without_a_pooled_output_refuses_pooler(tmp_path: Path):
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(
        vocab_size=len(VOCAB), dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=32
    )
    path = _save(tmp_path, DistilBertModel(cfg))
    with pytest.raises(ConfigError, match="text_pooling=pooler"):
        PretrainedTextEncoder.from_pretrained(path, 8, pooling="pooler")
    assert PretrainedTextEncoder.from_pretrained(path, 8, pooling="mean")(["the disc"]).shape == (1, 8)
