"""TULIP's tiny CLIP towers: the sizes ``layers.vision_language.build_open_clip`` takes in the tests (a 16-wide
ViT with one layer on 16x16 images, a 16-wide text transformer with a 12-token context), and the same sizes as the
``model.net.*`` overrides of a ``python -m train experiment=tulip`` run."""

from __future__ import annotations

TOWERS = dict(
    embed_dim=16,
    image_size=16,
    patch_size=8,
    vision_width=16,
    vision_layers=1,
    vision_head_width=8,
    context_length=12,
    text_width=16,
    text_heads=2,
    text_layers=1,
)

#: The tower sizes a run sets under ``model.net`` (the image size and context come from ``data.*``).
RUN_KEYS = (
    "embed_dim",
    "patch_size",
    "vision_width",
    "vision_layers",
    "vision_head_width",
    "text_width",
    "text_layers",
)


def net_overrides() -> list[str]:
    """``model.net.<key>=<value>`` for :data:`RUN_KEYS` of :data:`TOWERS`."""
    return [f"model.net.{k}={TOWERS[k]}" for k in RUN_KEYS]
