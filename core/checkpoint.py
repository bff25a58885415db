"""Weights-only checkpoint loading: a checkpoint never executes pickled code, and a bad file is one line."""

from __future__ import annotations

import re
from typing import Any

import torch

from core.errors import CheckpointError


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load a checkpoint without executing pickled code (``weights_only=True``); clear error if truncated/unsafe."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as err:  # noqa: BLE001 - every failure mode gets the same one-line report
        raise CheckpointError(
            f"checkpoint {path} is truncated, corrupt or not weights-only loadable ({_load_reason(err)}); "
            "use a checkpoint the suite wrote (<run>/checkpoints/last.ckpt)"
        ) from None


def _load_reason(err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in a few words, never repeating torch's advice to retry with
    the unsafe setting (the suite never unpickles code)."""
    text = " ".join(str(err).split())
    if "Unsupported operand" in text or "invalid load key" in text:
        return "not a PyTorch checkpoint file"
    if "Unsupported global" in text or "Weights only load failed" in text:
        m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        return f"it holds pickled Python objects{f' ({m.group(1)})' if m else ''}, which are never loaded"
    if "invalid load key" in text or "not a zip" in text.lower() or "magic number" in text:
        return "not a PyTorch checkpoint file"
    if "failed finding central directory" in text or "unexpected EOF" in text or "EOF" in text:
        return "the file ends early"
    sentences = [s for s in re.split(r"(?<=[.;])\s+", text) if "weights_only" not in s]
    return (" ".join(sentences) or type(err).__name__)[:160]
