"""Gaussian mixtures in 2 and d dimensions with an exact score (rx_dpm, sgm_lipschitz).

The embedded default is generated (no files): a mixture whose noisy marginals, score and denoiser are known in
closed form (:mod:`ops.scores.gmm`), so samplers can be judged against the exact probability-flow ODE and samples
against the exact law. Presets:

* ``ring2d``: 8 equal-weight isotropic components on a circle of radius ``scale`` (the classic 2-D benchmark).
* ``grid2d``: 9 components on a 3x3 grid.
* ``random``: ``n_components`` components in ``dim`` dimensions, seeded means ~ N(0, scale^2 I), random SPD covs.

``source=real`` reads a mixture definition from ``<data_dir>/mixture.json``:
``{"weights": [K floats], "means": [[d floats] x K], "covs": [[[d floats] x d] x K]}``, validated with errors
naming the file and the offending field/row. The mixture is exposed as :attr:`GaussianMixtureDataModule.mixture`
(a ``(weights [K], means [K, d], covs [K, d, d])`` triple) for analytic-score models.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError, DataFormatError
from datamodules._base import SuiteDataModule, require_files
from ops.scores.gmm import gmm_sample  # ops is a leaf dependency, not a paper module

PRESETS = ("ring2d", "grid2d", "random")
#: Non-Gaussian laws of the sgm_lipschitz study (no closed-form score; ``mixture`` is None for them).
OTHER_LAWS = ("segment2d", "logconcave1d")


def sample_other_law(preset: str, n: int, generator: torch.Generator, curvature: float = 0.5) -> torch.Tensor:
    """Exact draws [n, d] (float64) of the sgm_lipschitz laws.

    * ``segment2d``: uniform on the segment [-1, 1] x {0} in R^2 (a 1-D manifold with boundary).
    * ``logconcave1d``: p(x) ∝ exp(-m x^2 / 2 - log cosh x), m = ``curvature`` (strongly log-concave,
      -(m + 1) <= (log p)'' <= -m), by rejection from N(0, 1/m) with acceptance 1 / cosh(x).
    """
    if preset == "segment2d":
        s = torch.rand(n, generator=generator, dtype=torch.float64) * 2 - 1
        return torch.stack([s, torch.zeros_like(s)], 1)
    if preset == "logconcave1d":
        if curvature <= 0:
            raise ConfigError(f"data.curvature={curvature} must be > 0")
        out: list[torch.Tensor] = []
        while sum(o.numel() for o in out) < n:
            x = torch.randn(2 * n, generator=generator, dtype=torch.float64) / math.sqrt(curvature)
            keep = torch.rand(2 * n, generator=generator, dtype=torch.float64) < 1 / torch.cosh(x)
            out.append(x[keep])
        return torch.cat(out)[:n, None]
    raise ConfigError(f"data.preset={preset!r} must be one of {list(PRESETS + OTHER_LAWS)}")


def make_mixture(
    preset: str, dim: int = 2, n_components: int = 8, scale: float = 2.0, component_std: float = 0.3, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build a mixture (weights [K], means [K, d], covs [K, d, d]) in float64."""
    if preset not in PRESETS:
        raise ConfigError(f"data.preset={preset!r} must be one of {list(PRESETS)}")
    if component_std <= 0 or scale <= 0:
        raise ConfigError(f"data.component_std={component_std} and data.scale={scale} must be > 0")
    if preset == "ring2d":
        if dim != 2:
            raise ConfigError(f"data.dim={dim} must be 2 for preset ring2d")
        ang = torch.arange(n_components, dtype=torch.float64) * 2 * math.pi / n_components
        means = scale * torch.stack([torch.cos(ang), torch.sin(ang)], 1)
        covs = (component_std**2) * torch.eye(2, dtype=torch.float64).expand(n_components, 2, 2).clone()
        weights = torch.full((n_components,), 1.0 / n_components, dtype=torch.float64)
        return weights, means, covs
    if preset == "grid2d":
        if dim != 2:
            raise ConfigError(f"data.dim={dim} must be 2 for preset grid2d")
        g = torch.linspace(-scale, scale, 3, dtype=torch.float64)
        means = torch.cartesian_prod(g, g)
        covs = (component_std**2) * torch.eye(2, dtype=torch.float64).expand(9, 2, 2).clone()
        return torch.full((9,), 1 / 9, dtype=torch.float64), means, covs
    if dim < 1 or n_components < 1:
        raise ConfigError(f"data.dim={dim} and data.n_components={n_components} must be >= 1")
    gen = torch.Generator().manual_seed(seed)
    means = scale * torch.randn(n_components, dim, generator=gen, dtype=torch.float64)
    a = torch.randn(n_components, dim, dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)
    covs = component_std**2 * (0.5 * torch.eye(dim, dtype=torch.float64) + a @ a.transpose(1, 2) / 2)
    w = torch.rand(n_components, generator=gen, dtype=torch.float64) + 0.5
    return w / w.sum(), means, covs


def read_mixture_json(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read and validate ``mixture.json``; raises DataFormatError naming the file and the bad field or row."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    for key in ("weights", "means", "covs"):
        if key not in obj:
            raise DataFormatError(f"{path}: missing field {key!r} (need weights, means, covs)")
    try:
        weights = torch.tensor(obj["weights"], dtype=torch.float64)
        means = torch.tensor(obj["means"], dtype=torch.float64)
    except (TypeError, ValueError) as err:
        raise DataFormatError(f"{path}: weights/means must be numeric arrays ({err})") from None
    if weights.ndim != 1 or means.ndim != 2 or means.shape[0] != weights.shape[0]:
        raise DataFormatError(
            f"{path}: need weights [K] and means [K, d], got {list(weights.shape)}, {list(means.shape)}"
        )
    k, d = means.shape
    if len(obj["covs"]) != k:
        raise DataFormatError(f"{path}: field 'covs' has {len(obj['covs'])} rows, expected K={k}")
    covs = []
    for i, c in enumerate(obj["covs"]):
        try:
            ct = torch.tensor(c, dtype=torch.float64)
        except (TypeError, ValueError):
            raise DataFormatError(f"{path}: covs row {i} is not a numeric matrix") from None
        if ct.shape != (d, d) or not torch.allclose(ct, ct.T) or bool((torch.linalg.eigvalsh(ct) <= 0).any()):
            raise DataFormatError(f"{path}: covs row {i} must be a symmetric positive-definite {d}x{d} matrix")
        covs.append(ct)
    if bool((weights <= 0).any()) or not math.isclose(float(weights.sum()), 1.0, rel_tol=1e-6):
        raise DataFormatError(f"{path}: field 'weights' must be > 0 and sum to 1, got {weights.tolist()}")
    return weights, means, torch.stack(covs)


class GaussianMixtureDataModule(SuiteDataModule):
    """Samples of a Gaussian mixture; batches are ``(x [B, d],)`` in float32.

    Args:
        preset: ``ring2d``, ``grid2d`` or ``random`` (embedded source), or one of the non-Gaussian laws
            ``segment2d`` / ``logconcave1d`` of :func:`sample_other_law` (no exact mixture; ``dim`` is ignored).
        dim, n_components, scale, component_std: Mixture shape (see :func:`make_mixture`).
        n_train, n_val, n_test: Number of exact draws per split.
        source, data_dir, batch_size, num_workers, seed: See :class:`datamodules._base.SuiteDataModule`.
    """

    def __init__(
        self,
        preset: str = "ring2d",
        dim: int = 2,
        n_components: int = 8,
        scale: float = 2.0,
        component_std: float = 0.3,
        n_train: int = 4096,
        n_val: int = 512,
        n_test: int = 1024,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        for key, val in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
            if val < 1:
                raise ConfigError(f"data.{key}={val} must be >= 1")
        self.n_splits = {"train": n_train, "val": n_val, "test": n_test}
        self.mixture: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.preset = preset
        if preset in OTHER_LAWS:
            if source != "embedded":
                raise ConfigError(f"data.preset={preset!r} is generated: it needs data.source=embedded")
        elif source == "embedded":
            self.mixture = make_mixture(preset, dim, n_components, scale, component_std, seed)

    def _sample_splits(self) -> dict[str, Any]:
        out = {}
        for j, (split, n) in enumerate(self.n_splits.items()):
            gen = torch.Generator().manual_seed(self.seed * 1000 + j)
            if self.preset in OTHER_LAWS:
                out[split] = TensorDataset(sample_other_law(self.preset, n, gen).float())
                continue
            assert self.mixture is not None
            out[split] = TensorDataset(gmm_sample(n, *self.mixture, generator=gen).float())
        return out

    def load_embedded(self) -> dict[str, Any]:
        return self._sample_splits()

    def load_real(self) -> dict[str, Any]:
        (path,) = require_files(
            self.data_dir, ["mixture.json"], "Write a mixture definition {weights, means, covs} as mixture.json."
        )
        self.mixture = read_mixture_json(path)
        return self._sample_splits()
