"""Before/after figure of a test batch: the reference and longest exposure (exposure-normalised), the restored HDR
output and the ground truth, all as 16-bit mu-tonemapped linear sRGB (what the metrics score)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn.functional as F

from ops.isp.process import tonemapped_srgb


def save_examples(batch: dict[str, Any], path: Path) -> None:
    """Write ``path`` (PNG): one row per bracket, columns frame 0 / frame T-1 / output / ground truth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raws, out, gt, meta = batch["raws"], batch["out"], batch["gt"], batch["meta"]
    size = gt.shape[-2:]
    cols = {
        "frame 0 (shortest)": raws[:, 0],
        f"frame {raws.shape[1] - 1} (longest)": raws[:, -1],
        "output": out,
        "ground truth": gt,
    }
    n = gt.shape[0]
    fig, axes = plt.subplots(n, len(cols), figsize=(2.2 * len(cols), 2.2 * n), squeeze=False)
    for j, (title, x) in enumerate(cols.items()):
        x = F.interpolate(x.float(), size=size, mode="nearest") if x.shape[-2:] != size else x.float()
        img = tonemapped_srgb(x.detach().cpu(), {k: v.detach().cpu() for k, v in meta.items()})
        for i in range(n):
            ax = axes[i, j]
            ax.imshow(img[i].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
