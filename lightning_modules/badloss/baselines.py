"""Single-attack backdoor defences BaDLoss is compared with (paper Sec. 5), as poison detectors.

* Spectral Signatures (Tran et al., 2018): per class ``c``, centre the penultimate features ``R_c``, take the top
  right-singular vector ``v``; outlier score ``(R_c v)^2``; remove the ``1.5 * eps * n_c`` highest (``eps = 0.1``).
* Activation Clustering (Chen et al., 2019): per class, drop the all-zero feature columns, reduce the features to
  10 independent components with ``sklearn.decomposition.FastICA`` (as Chen et al. and the official BaDLoss
  ``defenses/activation_clustering.py``), 2-means; the smaller cluster is poison when it holds less than 35% of the
  class. ICA rather than PCA: PCA keeps the raw scales, so 2-means splits the widest direction even when the
  poisons sit apart along a narrow one.
* Anti-Backdoor Learning isolation (Li et al., 2021): train with the local gradient ascent loss
  ``sign(L - gamma) * L`` (``gamma = 0.5``) and isolate the ``15%`` lowest-loss examples (backdoored examples are
  learnt fastest).

Each returns a per-example suspicion score ``[N]`` (higher = more suspicious) and a boolean removal mask ``[N]``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning

from core.errors import ConfigError


def spectral_signatures(
    features: torch.Tensor, labels: torch.Tensor, eps: float = 0.1, factor: float = 1.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral-signature scores and removals. ``features``: ``[N, D]``, ``labels``: ``[N]``."""
    if not 0.0 <= eps * factor <= 1.0:
        raise ConfigError(f"model.ss_eps={eps}: eps * {factor} must be in [0, 1]")
    f = features.double()
    scores = torch.zeros(len(f), dtype=torch.float64)
    remove = torch.zeros(len(f), dtype=torch.bool)
    for c in labels.unique():
        idx = torch.nonzero(labels == c).squeeze(1)
        if len(idx) < 2:
            continue
        r = f[idx] - f[idx].mean(0)
        v = torch.linalg.svd(r, full_matrices=False).Vh[0]
        s = (r @ v) ** 2
        scores[idx] = s / s.max().clamp_min(1e-12)  # per-class scale so scores compare across classes
        n_rm = min(len(idx), int(round(factor * eps * len(idx))))
        remove[idx[torch.argsort(s, descending=True)[:n_rm]]] = True
    return scores, remove


def reduce_features(x: np.ndarray, n_components: int, seed: int = 0) -> np.ndarray:
    """One class's features ``[n, D]`` -> ``[n, d]`` by FastICA (all-zero columns dropped first, as the official
    code does, since they make the whitening degenerate)."""
    x = x[:, np.any(x != 0, axis=0)]
    dims = min(n_components, x.shape[1], len(x) - 1)
    ica = FastICA(n_components=dims, whiten="unit-variance", random_state=seed, max_iter=400, tol=1e-4)
    with warnings.catch_warnings():  # a non-converged unmixing still separates; sklearn warns, we do not fail
        warnings.simplefilter("ignore", ConvergenceWarning)
        return ica.fit_transform(x)


def activation_clustering(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_components: int = 10,
    size_threshold: float = 0.35,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation-clustering scores (1 - relative size of the example's cluster) and removals (FastICA, then
    2-means, per class; Chen et al.)."""
    if not 0.0 < size_threshold <= 0.5:
        raise ConfigError(f"model.ac_size_threshold={size_threshold} must be in (0, 0.5]")
    f = features.double().cpu().numpy()
    y = labels.cpu().numpy()
    scores = np.zeros(len(f))
    remove = np.zeros(len(f), dtype=bool)
    for c in np.unique(y):
        idx = np.nonzero(y == c)[0]
        if len(idx) < 4 or not np.any(f[idx] != 0):
            continue
        z = reduce_features(f[idx], n_components, seed)
        assign = KMeans(n_clusters=2, n_init=5, random_state=seed).fit_predict(z)
        sizes = np.bincount(assign, minlength=2) / len(idx)
        scores[idx] = 1.0 - sizes[assign]
        small = int(np.argmin(sizes))
        if sizes[small] < size_threshold:
            remove[idx[assign == small]] = True
    return torch.from_numpy(scores), torch.from_numpy(remove)


def abl_lga_loss(loss: torch.Tensor, gamma: float = 0.5) -> torch.Tensor:
    """ABL local gradient ascent: ``sign(L - gamma) * L`` on the batch-mean loss (flooding at ``gamma``)."""
    return torch.sign(loss - gamma) * loss


def abl_isolation(losses: torch.Tensor, isolation_frac: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """Isolate the ``isolation_frac`` lowest-loss examples. ``losses``: ``[N]`` -> (score = -loss, mask)."""
    if not 0.0 <= isolation_frac < 1.0:
        raise ConfigError(f"model.abl_isolation={isolation_frac} must be in [0, 1)")
    n_iso = int(round(isolation_frac * len(losses)))
    remove = torch.zeros(len(losses), dtype=torch.bool)
    remove[torch.argsort(losses.double(), stable=True)[:n_iso]] = True
    return -losses.double(), remove
