"""A pretrained transformers text encoder (BERT-style) with a learned projection: expressions -> condition vectors.

ADDP (Pang, Xu & Wang, ICLR 2025) conditions its InstructPix2Pix-style referring-segmentation denoiser on a pretrained
text encoder's embedding of the expression, and, as InstructPix2Pix / Stable Diffusion fine-tuning does, keeps that
encoder frozen. :class:`PretrainedTextEncoder` wraps any ``transformers`` encoder that returns token features
(``AutoModel``: BERT, RoBERTa, DistilBERT, ...; for a dual encoder such as ``CLIPModel`` its ``text_model``), pools
the token features of each expression and projects them with a learned linear map to the denoiser's condition width.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from core.errors import ConfigError

POOLINGS = ("mean", "cls", "pooler")


class PretrainedTextEncoder(nn.Module):
    """Texts -> ``[B, out_dim]``: a pretrained encoder's pooled token features through a learned ``nn.Linear``.

    An empty (or all-whitespace) text is "no expression" and maps to the zero vector, the null condition that
    classifier-free guidance trains with. When the encoder is frozen it stays in eval mode (no dropout), runs
    without autograd, and the pooled features of each distinct text are cached (up to ``cache_size`` texts): only the
    projection trains.

    Args:
        encoder: A ``transformers`` model whose output has ``last_hidden_state [B, L, H]`` (and ``pooler_output
            [B, H]`` for ``pooling=pooler``).
        tokenizer: Its tokenizer (called with ``padding``, ``truncation``, ``max_length``, ``return_tensors="pt"``).
        out_dim: Width of the condition vector.
        pooling: ``mean`` (attention-masked mean of the token features), ``cls`` (the first token, BERT's
            ``[CLS]``) or ``pooler`` (the model's own pooled output: BERT's tanh-dense ``[CLS]``, CLIP's EOT token).
        trainable: Fine-tune the encoder too (default frozen).
        max_length: Tokens kept per text.
        cache_size: Distinct texts whose frozen features are cached (0: no cache).
    """

    def __init__(
        self,
        encoder: nn.Module,
        tokenizer: Any,
        out_dim: int,
        pooling: str = "mean",
        trainable: bool = False,
        max_length: int = 64,
        cache_size: int = 20000,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"model.text_pooling={pooling!r} must be one of {list(POOLINGS)}")
        if out_dim < 1 or max_length < 2:
            raise ConfigError(f"text encoder needs out_dim >= 1 and max_length >= 2, got {out_dim}, {max_length}")
        self.encoder, self.tokenizer = encoder, tokenizer
        self.pooling, self.trainable, self.max_length, self.cache_size = pooling, trainable, max_length, cache_size
        self.encoder.requires_grad_(trainable)
        self._cache: dict[str, Tensor] = {}
        with torch.no_grad():
            width = self.features(["a"]).shape[-1]  # the pooled width, and a check that this pooling exists
        self.proj = nn.Linear(width, out_dim)
        self.train(self.training)

    @classmethod
    def from_pretrained(cls, path: str, out_dim: int, key: str = "model.text_encoder_path", **kwargs: Any):
        """Load the tokenizer and encoder of ``path`` (a local folder or a hub name) with ``transformers``' ``Auto``
        classes; any failure is a one-line :class:`ConfigError` naming ``key`` and ``path``."""
        hint = "a local folder with config.json, weights and tokenizer files, or a hub name (e.g. bert-base-uncased)"
        looks_local = path.startswith((".", "/", "~")) or Path(path).expanduser().exists()
        if looks_local and not Path(path).expanduser().is_dir():
            raise ConfigError(f"{key}={path!r}: no such folder (need {hint})")
        if looks_local and not (Path(path).expanduser() / "config.json").is_file():
            raise ConfigError(f"{key}={path!r}: the folder has no config.json (need {hint})")
        try:
            from transformers import AutoModel, AutoTokenizer

            where = str(Path(path).expanduser()) if looks_local else path
            encoder = AutoModel.from_pretrained(where)
            tokenizer = AutoTokenizer.from_pretrained(where)
        except Exception as err:  # noqa: BLE001 - any loader failure (missing files, no network, bad JSON) is one line
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(
                f"{key}={path!r} does not load as a transformers text encoder ({first}); need {hint}"
            ) from None
        if hasattr(encoder, "text_model") and hasattr(encoder, "vision_model"):  # CLIP / SigLIP: the text tower
            encoder = encoder.text_model
        return cls(encoder, tokenizer, out_dim, **kwargs)

    def train(self, mode: bool = True) -> PretrainedTextEncoder:
        super().train(mode)
        if not self.trainable:
            self.encoder.eval()  # frozen features: no dropout, the same vector for the same text
        return self

    def features(self, texts: Sequence[str]) -> Tensor:
        """Pooled token features of ``texts`` (non-empty): ``[B, H]`` on the encoder's device."""
        device = next(self.encoder.parameters()).device
        tok = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        mask = tok["attention_mask"].to(device)
        out = self.encoder(input_ids=tok["input_ids"].to(device), attention_mask=mask)
        if self.pooling == "pooler":
            if getattr(out, "pooler_output", None) is None:
                raise ConfigError("model.text_pooling=pooler: this encoder has no pooled output (use mean or cls)")
            return out.pooler_output
        h = out.last_hidden_state  # [B, L, H]
        if self.pooling == "cls":
            return h[:, 0]
        m = mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1).clamp_min(1)

    def _frozen_features(self, texts: list[str]) -> Tensor:
        device = next(self.encoder.parameters()).device
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        fresh: dict[str, Tensor] = {}
        if todo:
            with torch.no_grad():
                fresh = dict(zip(todo, self.features(todo)))
            for t, f in fresh.items():
                if len(self._cache) < self.cache_size:
                    self._cache[t] = f
        return torch.stack([(fresh[t] if t in fresh else self._cache[t]).to(device) for t in texts])

    def forward(self, texts: Sequence[str]) -> Tensor:
        """``texts`` (B strings) -> ``[B, out_dim]``; empty texts give zero rows."""
        texts = [str(t).strip() for t in texts]
        out = self.proj.weight.new_zeros(len(texts), self.proj.out_features)
        keep = [i for i, t in enumerate(texts) if t]
        if not keep:
            return out
        chosen = [texts[i] for i in keep]
        feats = self.features(chosen) if self.trainable else self._frozen_features(chosen)
        rows = torch.tensor(keep, device=out.device)
        return out.index_copy(0, rows, self.proj(feats.to(out.dtype)))
