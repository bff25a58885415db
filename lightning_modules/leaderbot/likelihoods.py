"""Paired-comparison likelihoods of Ameli et al. (ICLR 2025), in float64 PyTorch.

Three outcome models (Bradley-Terry, Rao-Kupper, Davidson), each with an optional Thurstonian covariance
(none / diagonal / diagonal + rank ``k_cov``) and, for the two tie models, a scalar or factored tie threshold
(rank ``k_tie`` with a fixed DCT-IV basis). Everything is a pure function of one flat parameter vector ``w`` whose
layout is the one of the ``leaderbot`` package, so the two can be compared entry by entry:

* no covariance (``k_cov=None``): ``w = [x (m) | tie]``
* covariance (``k_cov >= 0``):    ``w = [x (m) | t (m) | Lambda (m * k_cov, row-major) | tie]``
* ``tie`` is one scalar (``k_tie = 0``) or ``G`` (``m * k_tie``, row-major); Bradley-Terry has no tie block.

Notation (paper, Sec. 3): for a pair ``(i, j)`` the standardised score difference is

    z_ij = (x_i - x_j) / sqrt(S_ii + S_jj - 2 S_ij),   S = diag(t^2) + Lambda Lambda^T      (Thurstonian covariance)

(``z_ij = x_i - x_j`` without covariance) and the pair's tie threshold is

    mu_ij = eta                                    (k_tie = 0)
    mu_ij = g_i^T phi_j + g_j^T phi_i = (G Phi^T + Phi G^T)_ij   (factored tie model, Phi = DCT-IV basis)

The negative log-likelihood is normalised by the total number of votes ``N`` (so it is the mean cross entropy per
vote, the package's ``loss``); counts of zero contribute exactly zero (never ``0 * log 0 = NaN``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.errors import ConfigError

KINDS = ("bradley_terry", "rao_kupper", "davidson")
#: Rao-Kupper's tie threshold is clipped to |eta| >= this value (package ``min_eta``).
RK_MIN_ETA = 1e-2


@dataclass(frozen=True)
class Layout:
    """Where each block of the flat parameter vector lives.

    Args:
        kind: ``bradley_terry``, ``rao_kupper`` or ``davidson``.
        m: Number of competitors (models in the arena).
        k_cov: ``None`` (no covariance), ``0`` (diagonal) or the rank of the low-rank covariance factor.
        k_tie: ``0`` (one scalar tie threshold) or the rank of the factored tie model. Must be 0 for Bradley-Terry.
    """

    kind: str
    m: int
    k_cov: int | None
    k_tie: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"model.kind={self.kind!r} must be one of {list(KINDS)} (or 'elo')")
        if self.m < 2:
            raise ConfigError(f"need at least 2 competitors, got m={self.m}")
        if self.k_cov is not None and not 0 <= self.k_cov <= self.m:
            raise ConfigError(f"model.k_cov={self.k_cov} must be null or an integer in [0, m={self.m}]")
        if not 0 <= self.k_tie <= self.m:
            raise ConfigError(f"model.k_tie={self.k_tie} must be an integer in [0, m={self.m}]")
        if self.kind == "bradley_terry" and self.k_tie != 0:
            raise ConfigError(f"model.k_tie={self.k_tie} must be 0 for kind=bradley_terry (it has no tie model)")

    @property
    def has_cov(self) -> bool:
        return self.k_cov is not None

    @property
    def has_tie(self) -> bool:
        return self.kind != "bradley_terry"

    @property
    def n_cov(self) -> int:
        """Parameters of ``t`` and ``Lambda``."""
        return 0 if self.k_cov is None else self.m * (1 + self.k_cov)

    @property
    def n_tie(self) -> int:
        return 0 if not self.has_tie else max(1, self.m * self.k_tie)

    @property
    def n_param(self) -> int:
        return self.m + self.n_cov + self.n_tie

    def blocks(self) -> dict[str, slice]:
        """Named slices of ``w``: ``x`` and, where present, ``t``, ``Lambda``, ``tie``."""
        m, out = self.m, {"x": slice(0, self.m)}
        start = m
        if self.k_cov is not None:
            out["t"] = slice(m, 2 * m)
            out["Lambda"] = slice(2 * m, 2 * m + m * self.k_cov)
            start = 2 * m + m * self.k_cov
        if self.has_tie:
            out["tie"] = slice(start, start + self.n_tie)
        return out


def dct_basis(m: int, k: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Orthonormal DCT-IV basis of the factored tie model, ``Phi[a, b] = sqrt(2/m) cos(pi/m (a - 1/2)(b - 1/2))``.

    Args:
        m: Rows (competitors).
        k: Columns (rank of the tie factor).

    Returns:
        ``[m, k]`` tensor (``[m, 0]`` for ``k = 0``).
    """
    a = torch.arange(1, m + 1, dtype=dtype)[:, None] - 0.5
    b = torch.arange(1, k + 1, dtype=dtype)[None, :] - 0.5
    return math.sqrt(2.0 / m) * torch.cos(math.pi / m * a * b)


def unpack(w: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Views of the blocks of ``w`` with their natural shapes: ``x [m]``, ``t [m]``, ``Lambda [m, k_cov]``,
    ``G [m, k_tie]`` or ``eta [1]``."""
    b, m, out = layout.blocks(), layout.m, {}
    out["x"] = w[b["x"]]
    if layout.has_cov:
        out["t"] = w[b["t"]]
        out["Lambda"] = w[b["Lambda"]].reshape(m, layout.k_cov)
    if layout.has_tie:
        tie = w[b["tie"]]
        out["G" if layout.k_tie > 0 else "eta"] = tie.reshape(m, layout.k_tie) if layout.k_tie > 0 else tie
    return out


def standardized_difference(p: dict[str, torch.Tensor], pairs: torch.Tensor) -> torch.Tensor:
    """``z_ij``: score difference divided by the Thurstonian standard deviation of the difference.

    Args:
        p: Output of :func:`unpack`.
        pairs: ``[n, 2]`` competitor indices ``(i, j)``.

    Returns:
        ``[n]``.
    """
    i, j = pairs[:, 0], pairs[:, 1]
    diff = p["x"][i] - p["x"][j]
    if "t" not in p:
        return diff
    lam = p["Lambda"]
    # S_ii + S_jj - 2 S_ij = t_i^2 + t_j^2 + |lambda_i - lambda_j|^2
    var = p["t"][i] ** 2 + p["t"][j] ** 2 + ((lam[i] - lam[j]) ** 2).sum(-1)
    return diff / torch.sqrt(var)


def tie_threshold(p: dict[str, torch.Tensor], pairs: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``mu_ij``: scalar ``eta`` or the factored threshold ``g_i^T phi_j + g_j^T phi_i``.

    Args:
        p: Output of :func:`unpack`.
        pairs: ``[n, 2]``.
        basis: ``[m, k_tie]`` DCT-IV basis ``Phi``.

    Returns:
        ``[n]``.
    """
    i, j = pairs[:, 0], pairs[:, 1]
    if "eta" in p:
        return p["eta"].expand(pairs.shape[0])
    g = p["G"]
    return (g[i] * basis[j]).sum(-1) + (g[j] * basis[i]).sum(-1)


def log_probs(w: torch.Tensor, pairs: torch.Tensor, layout: Layout, basis: torch.Tensor) -> torch.Tensor:
    """Log of ``[P(i beats j), P(j beats i), P(tie)]`` for each pair.

    * Bradley-Terry: ``P_win = sigmoid(z)``, ``P_loss = sigmoid(-z)``, ``P_tie = 0`` (log = -inf).
    * Rao-Kupper: ``P_win = sigmoid(z - |eta|)``, ``P_loss = sigmoid(-z - |eta|)``,
      ``P_tie = (exp(2|eta|) - 1) P_win P_loss``, with ``|eta|`` clipped to ``>= 1e-2`` as in the package
      (``k_tie = 0``: ``eta = max(w_eta, 1e-2)``; factored: entries with ``|eta| < 1e-2`` become ``1e-2``).
    * Davidson (generalised): ``u = z/2 - mu``, ``v = -z/2 - mu`` and
      ``P_win = 1/(1 + e^-z + e^-u)``, ``P_loss = 1/(1 + e^z + e^-v)``, ``P_tie = 1/(1 + e^u + e^v)``; this is
      Davidson's ``pi_i / (pi_i + pi_j + nu sqrt(pi_i pi_j))`` with ``nu = e^mu``.

    All forms are evaluated as log-sum-exp / log-sigmoid, so they stay finite for any finite ``w``.

    Args:
        w: ``[n_param]`` float64 parameters.
        pairs: ``[n, 2]`` int64.
        layout: Parameter layout.
        basis: ``[m, k_tie]`` DCT-IV basis.

    Returns:
        ``[n, 3]`` log-probabilities.
    """
    p = unpack(w, layout)
    z = standardized_difference(p, pairs)
    mu = tie_threshold(p, pairs, basis) if layout.has_tie else None
    return outcome_log_probs(z, mu, layout)


def outcome_log_probs(z: torch.Tensor, mu: torch.Tensor | None, layout: Layout) -> torch.Tensor:
    """``[n, 3]`` log-probabilities of the outcomes from the standardised difference ``z [n]`` and the tie
    threshold ``mu [n]`` (``None`` for Bradley-Terry); the formulas are those of :func:`log_probs`."""
    if layout.kind == "bradley_terry":
        return torch.stack([F.logsigmoid(z), F.logsigmoid(-z), torch.full_like(z, -math.inf)], -1)
    if layout.kind == "rao_kupper":
        eta = _rk_eta(mu, layout)
        lw, ll = F.logsigmoid(z - eta), F.logsigmoid(-z - eta)
        return torch.stack([lw, ll, torch.log(torch.expm1(2.0 * eta)) + lw + ll], -1)
    u, v = 0.5 * z - mu, -0.5 * z - mu
    zero = torch.zeros_like(z)
    lw = -torch.logsumexp(torch.stack([zero, -z, -u], -1), -1)
    ll = -torch.logsumexp(torch.stack([zero, z, -v], -1), -1)
    lt = -torch.logsumexp(torch.stack([zero, u, v], -1), -1)
    return torch.stack([lw, ll, lt], -1)


def _rk_eta(mu: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Rao-Kupper's ``|eta|`` after the package's clipping (done on a copy: no in-place edit of a graph node)."""
    floor = torch.full_like(mu, RK_MIN_ETA)
    if layout.k_tie == 0:
        return torch.maximum(mu, floor)
    return torch.where(mu.abs() < RK_MIN_ETA, floor, mu.abs())


def probabilities(w: torch.Tensor, pairs: torch.Tensor, layout: Layout, basis: torch.Tensor) -> torch.Tensor:
    """``[n, 3]`` outcome probabilities ``[win, loss, tie]`` (Bradley-Terry: tie column 0)."""
    return log_probs(w, pairs, layout, basis).exp()


def effective_counts(counts: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Counts the likelihood uses: Bradley-Terry has no tie outcome, so each tie counts half a win and half a loss.

    Args:
        counts: ``[n, 3]`` observed ``[wins_i, wins_j, ties]``.

    Returns:
        ``[n, 3]`` (Bradley-Terry: ``[w + t/2, l + t/2, 0]``).
    """
    if layout.kind != "bradley_terry":
        return counts
    half = 0.5 * counts[:, 2:3]
    return torch.cat([counts[:, :2] + half, torch.zeros_like(half)], -1)


def pair_nll(
    w: torch.Tensor, pairs: torch.Tensor, counts: torch.Tensor, layout: Layout, basis: torch.Tensor
) -> torch.Tensor:
    """Per-pair negative log-likelihood ``-sum_o n_o log P_o`` (not normalised).

    Args:
        w: ``[n_param]``.
        pairs: ``[n, 2]``.
        counts: ``[n, 3]`` float64 observed counts.
        layout: Parameter layout.
        basis: ``[m, k_tie]``.

    Returns:
        ``[n]``; a zero count contributes exactly 0 (no ``0 * -inf``).
    """
    lp = log_probs(w, pairs, layout, basis)
    n = effective_counts(counts, layout)
    terms = torch.where(n > 0, n * torch.where(n > 0, lp, torch.zeros_like(lp)), torch.zeros_like(lp))
    return -terms.sum(-1)


def constraint_penalty(w: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Penalties that remove the non-uniqueness of the parameters (paper, Sec. 3.3):

    * ``(1^T x)^2`` fixes the translation of the scores;
    * with covariance, ``(tr(C S C) - 1)^2`` with ``C = I - J/m`` fixes the scale of ``S`` relative to the scores;
    * with ``k_cov > 0``, ``1^T Lambda Lambda^T 1`` removes the component of the factors along ``1``.

    Args:
        w: ``[n_param]``.
        layout: Parameter layout.

    Returns:
        Scalar.
    """
    p = unpack(w, layout)
    pen = p["x"].sum() ** 2
    if layout.has_cov:
        m = layout.m
        t, lam = p["t"], p["Lambda"]
        # tr(C S C) = tr(S) - 1^T S 1 / m, S = diag(t^2) + Lambda Lambda^T
        col = lam.sum(0)
        tr_csc = (t**2).sum() + (lam**2).sum() - ((t**2).sum() + (col**2).sum()) / m
        pen = pen + (tr_csc - 1.0) ** 2
        if layout.k_cov > 0:
            pen = pen + (col**2).sum()
    return pen


def objective(
    w: torch.Tensor,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    layout: Layout,
    basis: torch.Tensor,
    total: float | torch.Tensor,
    constraint: bool = True,
) -> torch.Tensor:
    """Mean NLL per vote plus (optionally) the identifiability penalties: the package's ``loss(w, constraint)``.

    Args:
        w: ``[n_param]``.
        pairs: ``[n, 2]``.
        counts: ``[n, 3]``.
        layout: Parameter layout.
        basis: ``[m, k_tie]``.
        total: Number of votes ``N`` that normalises the NLL (the sum of all counts of the full data set, so
            shards of pairs can be summed).
        constraint: Add :func:`constraint_penalty`.

    Returns:
        Scalar.
    """
    loss = pair_nll(w, pairs, counts, layout, basis).sum() / total
    return loss + constraint_penalty(w, layout) if constraint else loss


def competitor_counts(pairs: torch.Tensor, counts: torch.Tensor, m: int) -> torch.Tensor:
    """``[m, 3]`` total wins, losses and ties of each competitor over all its pairs."""
    out = torch.zeros(m, 3, dtype=counts.dtype)
    out.index_add_(0, pairs[:, 0], counts)
    out.index_add_(0, pairs[:, 1], counts[:, [1, 0, 2]])
    return out


def initial_params(layout: Layout, pairs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The package's deterministic starting point.

    ``x`` = win rate + half the tie rate, centred (0 for a competitor without games); ``t = sqrt(1/(m-1))``;
    ``Lambda`` = the DCT-IV basis with centred columns; tie block 0.

    Deviation for Rao-Kupper: its tie threshold is clipped to ``|eta| >= 1e-2``, and at the package's start (0) the
    likelihood is flat in the tie block, so an exact gradient never moves it (the package only escapes through
    its wrong analytic gradient there). We start ``eta`` at the value whose tie probability at ``z = 0`` equals
    the observed tie rate, ``tanh(eta / 2) = tau``; for the factored model through the first (all-positive)
    DCT-IV column, so that every pair's ``mu_ij`` is about that ``eta``.

    Returns:
        ``[n_param]`` float64.
    """
    m = layout.m
    c = competitor_counts(pairs, counts.to(torch.float64), m)
    games = c.sum(-1)
    score = torch.where(games > 0, (c[:, 0] + 0.5 * c[:, 2]) / games.clamp_min(1), torch.zeros_like(games))
    w = torch.zeros(layout.n_param, dtype=torch.float64)
    b = layout.blocks()
    w[b["x"]] = score - score.mean()
    if layout.has_cov:
        w[b["t"]] = math.sqrt(1.0 / (m - 1.0))
        if layout.k_cov > 0:
            lam = dct_basis(m, layout.k_cov)
            w[b["Lambda"]] = (lam - lam.mean(0, keepdim=True)).reshape(-1)
    if layout.kind == "rao_kupper":
        tau = float(counts[:, 2].sum() / counts.sum().clamp_min(1.0))
        eta = 2.0 * math.atanh(min(max(tau, 0.05), 0.9))
        if layout.k_tie == 0:
            w[b["tie"]] = eta
        else:
            phi = dct_basis(m, layout.k_tie)[:, 0]
            g = torch.zeros(m, layout.k_tie, dtype=torch.float64)
            g[:, 0] = eta / (2.0 * float(phi.mean()))
            w[b["tie"]] = g.reshape(-1)
    return w


def covariance(w: torch.Tensor, layout: Layout, centered: bool = False) -> torch.Tensor | None:
    """``S = diag(t^2) + Lambda Lambda^T`` (``[m, m]``), doubly centred ``C S C`` if asked; ``None`` without
    covariance."""
    if not layout.has_cov:
        return None
    p = unpack(w, layout)
    s = torch.diag(p["t"] ** 2) + p["Lambda"] @ p["Lambda"].T
    if centered:
        c = torch.eye(layout.m, dtype=s.dtype) - 1.0 / layout.m
        s = c @ s @ c
    return s


def preconditioner(layout: Layout, pairs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Diagonal change of variables ``w = s * u`` for the optimiser: ``s_k = sqrt(mean share / share_k)`` for every
    parameter owned by competitor ``k`` (``x_k``, ``t_k``, row ``k`` of ``Lambda`` and ``G``), ``share_k`` being
    its fraction of the votes; 1 for the scalar tie parameter.

    The Fisher information of a competitor's parameters is proportional to its number of votes, which spans four
    orders of magnitude on the Arena data; rescaling by it makes the problem far better conditioned for L-BFGS
    (about 3x fewer iterations for Davidson(0, 1)). It changes the optimiser's path only, not the objective.

    Returns:
        ``[n_param]`` float64, positive.
    """
    m = layout.m
    games = competitor_counts(pairs, counts.to(torch.float64), m).sum(-1)
    share = games / games.sum().clamp_min(1.0)
    s_comp = torch.sqrt(share.mean() / share.clamp_min(1e-8)).clamp(max=1e3)
    parts = [s_comp]
    if layout.has_cov:
        parts += [s_comp, s_comp.repeat_interleave(layout.k_cov)]
    if layout.has_tie:
        parts.append(s_comp.repeat_interleave(layout.k_tie) if layout.k_tie > 0 else torch.ones(1, dtype=torch.float64))
    return torch.cat(parts)


# -- exact Hessian -------------------------------------------------------------------------------------------------
# A pair (i, j) touches only the parameters of competitors i and j (and the scalar tie threshold), so the Hessian of
# the NLL is a sum of small per-pair blocks: H = sum_pairs P_ij^T H_ij P_ij, with P_ij the selection of the pair's
# ``d = 2 r (+ 1)`` local parameters, r = 1 + [1 + k_cov] + k_tie per competitor. The blocks come from forward-over-
# reverse autodiff of the per-pair NLL, d Hessian-vector products over all pairs at once.


def local_index(layout: Layout, pairs: torch.Tensor) -> torch.Tensor:
    """``[n, d]`` positions in ``w`` of each pair's local parameters: competitor i's row ``[x_i, t_i, Lambda_i,
    G_i]`` (blocks that exist), then competitor j's row, then the scalar tie parameter when ``k_tie = 0``."""
    b, m = layout.blocks(), layout.m

    def row(k: torch.Tensor) -> list[torch.Tensor]:
        cols = [k[:, None]]
        if layout.has_cov:
            cols.append(m + k[:, None])
            cols.append(b["Lambda"].start + k[:, None] * layout.k_cov + torch.arange(layout.k_cov))
        if layout.has_tie and layout.k_tie > 0:
            cols.append(b["tie"].start + k[:, None] * layout.k_tie + torch.arange(layout.k_tie))
        return cols

    pairs = pairs.long()
    cols = row(pairs[:, 0]) + row(pairs[:, 1])
    if layout.has_tie and layout.k_tie == 0:
        cols.append(torch.full((pairs.shape[0], 1), b["tie"].start, dtype=torch.long))
    return torch.cat(cols, -1)


def local_pair_nll(
    theta: torch.Tensor, phi_i: torch.Tensor, phi_j: torch.Tensor, counts: torch.Tensor, layout: Layout
) -> torch.Tensor:
    """Per-pair NLL (like :func:`pair_nll`) from the pair's local parameters ``theta [n, d]`` (the columns of
    :func:`local_index`) and the basis rows ``phi_i, phi_j [n, k_tie]``; ``z_ij`` and ``mu_ij`` as in
    :func:`standardized_difference` and :func:`tie_threshold`. Returns ``[n]``."""
    kc, kt = (layout.k_cov if layout.has_cov else None), (layout.k_tie if layout.has_tie else 0)
    r = 1 + (0 if kc is None else 1 + kc) + kt
    ri, rj = theta[:, :r], theta[:, r : 2 * r]
    z = ri[:, 0] - rj[:, 0]
    if kc is not None:
        lam_d = ri[:, 2 : 2 + kc] - rj[:, 2 : 2 + kc]
        z = z / torch.sqrt(ri[:, 1] ** 2 + rj[:, 1] ** 2 + (lam_d**2).sum(-1))
    mu = None
    if layout.has_tie and kt == 0:
        mu = theta[:, 2 * r]
    elif layout.has_tie:
        mu = (ri[:, r - kt :] * phi_j).sum(-1) + (rj[:, r - kt :] * phi_i).sum(-1)
    lp = outcome_log_probs(z, mu, layout)
    n = effective_counts(counts, layout)
    terms = torch.where(n > 0, n * torch.where(n > 0, lp, torch.zeros_like(lp)), torch.zeros_like(lp))
    return -terms.sum(-1)


def hessian(
    w: torch.Tensor,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    layout: Layout,
    basis: torch.Tensor,
    total: float | torch.Tensor,
    constraint: bool = True,
) -> torch.Tensor:
    """Exact Hessian of :func:`objective` at ``w``: ``[n_param, n_param]``, symmetric.

    Per-pair blocks (see :func:`local_index`) scattered into the full matrix, plus the Hessian of
    :func:`constraint_penalty` (``torch.func.hessian``, it is cheap). Equal to
    ``torch.autograd.functional.hessian(objective)`` (tested to 1e-12), at a few hundredths of its cost.

    Args: as :func:`objective`.

    Returns:
        ``[n_param, n_param]`` float64.
    """
    w = w.detach()
    p_dim = layout.n_param
    idx = local_index(layout, pairs)
    d = idx.shape[1]
    pi, pj = pairs[:, 0].long(), pairs[:, 1].long()
    phi_i, phi_j = basis[pi], basis[pj]
    counts = counts.to(w.dtype)
    theta = w[idx].requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(local_pair_nll(theta, phi_i, phi_j, counts, layout).sum(), theta, create_graph=True)
        # pairs are independent in theta: column k of every block is d(g[:, k])/d(theta) summed over pairs
        cols = [torch.autograd.grad(g[:, k].sum(), theta, retain_graph=k < d - 1)[0] for k in range(d)]
    blocks = torch.stack(cols, -1) / total  # [n, d, d]
    flat = (idx[:, :, None] * p_dim + idx[:, None, :]).reshape(-1)
    h = torch.zeros(p_dim * p_dim, dtype=w.dtype).index_add_(0, flat, blocks.reshape(-1)).view(p_dim, p_dim)
    if constraint:
        h = h + constraint_hessian(w, layout)
    return 0.5 * (h + h.T)


def constraint_hessian(w: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Analytic Hessian of :func:`constraint_penalty` (tested against ``torch.func.hessian``).

    With ``T = tr(C S C) = (1 - 1/m) |t|^2 + |Lambda|^2 - |1^T Lambda|^2 / m``: ``(1^T x)^2`` gives ``2 * 1 1^T``
    on the ``x`` block; ``(T - 1)^2`` gives ``2 grad T grad T^T + 2 (T - 1) Hess T`` with
    ``grad_t T = 2 (1 - 1/m) t``, ``grad_Lambda T = 2 (Lambda - 1 1^T Lambda / m)``, ``Hess T`` block diagonal
    (``2 (1 - 1/m) I`` on ``t``, ``2 (I - J/m)`` within each column of ``Lambda``); ``|1^T Lambda|^2`` gives
    ``2 J`` within each column of ``Lambda``.

    Returns:
        ``[n_param, n_param]``.
    """
    w = w.detach()
    m, b = layout.m, layout.blocks()
    h = torch.zeros(layout.n_param, layout.n_param, dtype=w.dtype)
    h[b["x"], b["x"]] = 2.0
    if not layout.has_cov:
        return h
    p, kc = unpack(w, layout), layout.k_cov
    t, lam = p["t"], p["Lambda"]
    col = lam.sum(0)
    tr_csc = (1.0 - 1.0 / m) * (t**2).sum() + (lam**2).sum() - (col**2).sum() / m
    cov = slice(b["t"].start, b["Lambda"].stop)  # t and Lambda are contiguous
    grad_t = torch.cat([2.0 * (1.0 - 1.0 / m) * t, (2.0 * (lam - col / m)).reshape(-1)])
    h[cov, cov] += 2.0 * torch.outer(grad_t, grad_t)
    h[b["t"], b["t"]] += 2.0 * (tr_csc - 1.0) * 2.0 * (1.0 - 1.0 / m) * torch.eye(m, dtype=w.dtype)
    if kc > 0:
        # Lambda row-major: entry (k, c) at k * kc + c; "same column" = kron(J_m or I_m, I_kc)
        eye_c = torch.eye(kc, dtype=w.dtype)
        same_col = torch.kron(torch.ones(m, m, dtype=w.dtype), eye_c)
        diag = torch.kron(torch.eye(m, dtype=w.dtype), eye_c)
        h[b["Lambda"], b["Lambda"]] += 2.0 * (tr_csc - 1.0) * 2.0 * (diag - same_col / m) + 2.0 * same_col
    return h
