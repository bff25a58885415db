"""Tabular SEMDICE: stationary distributions, the dual with the chi^2 conjugate, policy recovery, MLE model.

Shapes: ``T`` ``[S, A, S]`` (``T[s, a, s']`` = P(s' | s, a)), ``p0`` ``[S]``, a policy ``pi`` ``[S, A]``,
a state-action distribution ``d`` ``[S, A]``, the dual variables ``nu``, ``mu`` ``[S]``. Float64 throughout.

The primal of SEMDICE (paper, Sec. 3)::

    max_{d >= 0, dbar}  H(dbar) - alpha * D_f(d || d_D)
    s.t.  sum_a d(s, a) = (1 - gamma) p0(s) + gamma sum_{s', a'} T(s | s', a') d(s', a')     (Bellman flow)
          sum_a d(s, a) = dbar(s)                                                           (marginal)

With multipliers ``nu`` (flow) and ``mu`` (marginal), ``max_dbar H(dbar) - mu^T dbar = logsumexp(-mu)`` and the
f-divergence term gives its convex conjugate, so the dual is (chi^2: ``f(x) = (x - 1)^2 / 2``)::

    L(nu, mu) = (1 - gamma) p0^T nu + alpha E_{d_D}[ f*_+(e_{nu,mu}(s, a) / alpha) ] + logsumexp(-mu)     (dual)
    e_{nu,mu}(s, a) = mu(s) + gamma sum_{s'} T(s' | s, a) nu(s') - nu(s)                                  (residual)
    f*_+(y) = max(0, y + 1)^2 / 2 - 1/2                                                                   (chi^2)

and the optimal primal is recovered as ``d*(s, a) = d_D(s, a) max(0, e / alpha + 1)``, ``pi*(a|s) ∝ d*(s, a)``
(an optimal SEM policy is stationary Markov).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from core.errors import ConfigError

#: Pseudo-count of the count bonus ``(N + 1e-4)^{-1/2}`` (official code); the suite's ``exact`` baseline update also
#: smooths its (unscaled) ``-log p_D(s)`` with it (the official ``pb_s`` reward is different:
#: :func:`official_density_reward`).
COUNT_EPS = 1e-4
#: Initial value of every transition count in the official code (``np.zeros(...) + 1e-10``), discounted counts too.
OFFICIAL_COUNT_INIT = 1e-10
#: Added to the recovered weights ``w`` before normalising (official code).
WEIGHT_EPS = 1e-10


# -- validation ------------------------------------------------------------------------------------------------------
def check_gamma(gamma: float, name: str = "gamma") -> None:
    """Raise :class:`ConfigError` unless ``0 < gamma < 1``."""
    if not (isinstance(gamma, int | float) and 0.0 < float(gamma) < 1.0):
        raise ConfigError(f"{name}={gamma!r} must lie in (0, 1)")


def check_alpha(alpha: float, name: str = "alpha") -> None:
    """Raise :class:`ConfigError` unless ``alpha > 0`` (the f-divergence weight)."""
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"{name}={alpha!r} must be > 0")


def check_transition(T: torch.Tensor, atol: float = 1e-6, name: str = "T") -> None:
    """Raise :class:`ConfigError` unless ``T`` is ``[S, A, S]``, non-negative and each row ``T[s, a]`` sums to 1."""
    if T.dim() != 3 or T.shape[0] != T.shape[2]:
        raise ConfigError(f"{name} has shape {tuple(T.shape)}; a transition tensor is [S, A, S]")
    if not torch.isfinite(T).all() or (T < 0).any():
        raise ConfigError(f"{name} has negative or non-finite entries")
    sums = T.sum(-1)
    bad = (sums - 1).abs() > atol
    if bad.any():
        s, a = (int(i) for i in bad.nonzero()[0])
        raise ConfigError(f"{name}[{s}, {a}, :] sums to {float(sums[s, a]):.6g}, not 1 (rows must be distributions)")


def check_distribution(p: torch.Tensor, atol: float = 1e-6, name: str = "p0") -> None:
    """Raise :class:`ConfigError` unless ``p`` is a non-negative vector summing to 1."""
    if not torch.isfinite(p).all() or (p < 0).any() or abs(float(p.sum()) - 1) > atol:
        raise ConfigError(f"{name} must be a non-negative vector summing to 1 (sums to {float(p.sum()):.6g})")


# -- MDP generation and models ---------------------------------------------------------------------------------------
def random_mdp(
    num_states: int = 20, num_actions: int = 4, num_successors: int = 4, concentration: float = 1.0, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's random MDP: each ``(s, a)`` moves to ``K`` distinct states drawn uniformly, with probabilities
    from ``Dirichlet(concentration)``; ``p0`` = one-hot(state 0).

    Returns:
        ``(T [S, A, S], p0 [S])`` in float64.
    """
    if num_states < 2 or num_actions < 1 or not 1 <= num_successors <= num_states:
        raise ConfigError(
            f"random MDP needs num_states >= 2, num_actions >= 1, 1 <= num_successors <= num_states "
            f"(got {num_states}, {num_actions}, {num_successors})"
        )
    rng = np.random.default_rng(int(seed))
    T = np.zeros((num_states, num_actions, num_states))
    for s in range(num_states):
        for a in range(num_actions):
            succ = rng.choice(num_states, size=num_successors, replace=False)
            T[s, a, succ] = rng.dirichlet(np.full(num_successors, float(concentration)))
    T = torch.from_numpy(T)
    p0 = torch.zeros(num_states, dtype=torch.float64)
    p0[0] = 1.0
    return T, p0


def mle_model(counts: torch.Tensor) -> torch.Tensor:
    """Maximum-likelihood transition model from transition counts ``N [S, A, S]``: ``T(s'|s,a) = N(s,a,s')/N(s,a)``.

    A pair never tried gets the uniform next-state distribution (a choice: its row is irrelevant to the paper's
    dual, whose weights ``d_D(s, a)`` vanish there, but it keeps the model a valid MDP for ``d_D = d^pi_{T_hat}``).
    """
    n_sa = counts.sum(-1, keepdim=True)
    uniform = torch.full_like(counts, 1.0 / counts.shape[-1])
    return torch.where(n_sa > 0, counts / n_sa.clamp_min(1e-300), uniform)


def epsilon_soft(pi: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``(1 - eps) pi + eps / A``: the data-collection policy (eps = 1/(i+1) before trajectory ``i``)."""
    return (1.0 - epsilon) * pi + epsilon / pi.shape[-1]


# -- stationary distributions ----------------------------------------------------------------------------------------
def state_transition(T: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """``P_pi[s, s'] = sum_a pi(a|s) T(s'|s, a)``, ``[S, S]``."""
    return torch.einsum("sa,sat->st", pi, T)


def stationary_distribution(T: torch.Tensor, p0: torch.Tensor, pi: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted stationary distribution ``d^pi(s, a)`` by one linear solve (differentiable).

    ``d_s = (1 - gamma) (I - gamma P_pi^T)^{-1} p0`` (the Bellman flow constraint with equality), ``d(s, a) =
    d_s(s) pi(a|s)``. Returns ``[S, A]``.
    """
    S = T.shape[0]
    eye = torch.eye(S, dtype=T.dtype, device=T.device)
    d_s = torch.linalg.solve(eye - gamma * state_transition(T, pi).T, (1.0 - gamma) * p0)
    return d_s[:, None] * pi


def stationary_distribution_series(
    T: torch.Tensor, p0: torch.Tensor, pi: torch.Tensor, gamma: float, tol: float = 1e-15
) -> torch.Tensor:
    """Naive twin of :func:`stationary_distribution`: ``d_s = (1 - gamma) sum_t gamma^t (P_pi^T)^t p0``, summed
    until ``gamma^t < tol``."""
    P = state_transition(T, pi)
    term, d_s, t = p0.clone(), torch.zeros_like(p0), 0
    while gamma**t >= tol:
        d_s = d_s + (1.0 - gamma) * gamma**t * term
        term = P.T @ term
        t += 1
    return d_s[:, None] * pi


# -- the SEMDICE dual ------------------------------------------------------------------------------------------------
def dual_residual(nu: torch.Tensor, mu: torch.Tensor, T: torch.Tensor, gamma: float) -> torch.Tensor:
    """``e(s, a) = mu(s) + gamma sum_{s'} T(s'|s, a) nu(s') - nu(s)`` (residual, Sec. 3), ``[S, A]``."""
    return mu[:, None] + gamma * torch.einsum("sat,t->sa", T, nu) - nu[:, None]


def chisq_conjugate(y: torch.Tensor) -> torch.Tensor:
    """``f*_+(y) = max(0, y + 1)^2 / 2 - 1/2``: conjugate of ``f(x) = (x - 1)^2 / 2`` restricted to ``x >= 0``."""
    return 0.5 * torch.relu(y + 1.0) ** 2 - 0.5


def semdice_dual(
    nu: torch.Tensor,
    mu: torch.Tensor,
    d_b: torch.Tensor,
    T: torch.Tensor,
    p0: torch.Tensor,
    gamma: float,
    alpha: float,
) -> torch.Tensor:
    """The SEMDICE dual ``L(nu, mu)`` (see the module docstring), a scalar; minimised over ``(nu, mu)``.

    Args:
        nu: Flow multiplier ``[S]``.
        mu: Marginal multiplier ``[S]``.
        d_b: Weights of the f-divergence expectation ``[S, A]`` (the data distribution ``d_D``).
        T: Transition model ``[S, A, S]`` (the MLE model in the off-policy setting).
        p0: Initial distribution ``[S]``.
        gamma: Discount in (0, 1).
        alpha: f-divergence weight > 0.
    """
    e = dual_residual(nu, mu, T, gamma)
    return (1.0 - gamma) * (p0 @ nu) + alpha * (d_b * chisq_conjugate(e / alpha)).sum() + torch.logsumexp(-mu, dim=0)


def semdice_dual_grad(
    nu: torch.Tensor,
    mu: torch.Tensor,
    d_b: torch.Tensor,
    T: torch.Tensor,
    p0: torch.Tensor,
    gamma: float,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form gradient of :func:`semdice_dual`: with ``r = d_b max(0, e / alpha + 1)`` (the recovered ``d``),

    ``dL/dnu = (1 - gamma) p0 + gamma sum_{s,a} r(s, a) T(.|s, a) - sum_a r(., a)`` (flow violation of ``r``),
    ``dL/dmu = sum_a r(., a) - softmax(-mu)`` (marginal violation).
    """
    r = d_b * torch.relu(dual_residual(nu, mu, T, gamma) / alpha + 1.0)
    r_s = r.sum(1)
    g_nu = (1.0 - gamma) * p0 + gamma * torch.einsum("sa,sat->t", r, T) - r_s
    g_mu = r_s - torch.softmax(-mu, dim=0)
    return g_nu, g_mu


def semdice_policy(
    nu: torch.Tensor, mu: torch.Tensor, d_b: torch.Tensor, T: torch.Tensor, gamma: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Policy recovery: ``w = max(0, e / alpha + 1) + 1e-10``, ``d ∝ w d_b``, ``pi(a|s) = d(s, a) / sum_a d(s, a)``.

    States where ``d`` has no mass (never in the data) get the uniform policy. Returns ``(pi [S, A], d [S, A])``
    with ``d`` normalised to sum to 1.
    """
    w = torch.relu(dual_residual(nu, mu, T, gamma) / alpha + 1.0) + WEIGHT_EPS
    d = w * d_b
    d = d / d.sum().clamp_min(1e-300)
    d_s = d.sum(1, keepdim=True)
    uniform = torch.full_like(d, 1.0 / d.shape[1])
    pi = torch.where(d_s > 0, d / d_s.clamp_min(1e-300), uniform)
    return pi, d


# -- entropy, rewards, policy gradient -------------------------------------------------------------------------------
def state_entropy(d_s: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``-sum_s d(s) log d(s)`` (nats, ``0 log 0 = 0``) of a distribution ``[S]``."""
    return -torch.special.xlogy(d_s, d_s).sum()


def normalized_entropy(h: float, h_uniform: float, h_opt: float) -> float:
    """``(H(d^pi) - H(d^unif)) / (H(d^opt) - H(d^unif))``: 0 for the uniform policy, 1 for the MaxEnt optimum."""
    return (h - h_uniform) / (h_opt - h_uniform)


def count_bonus(counts: torch.Tensor) -> torch.Tensor:
    """Count-based exploration reward ``(N + 1e-4)^{-1/2}``, min-max normalised to [0, 1] (constant: zeros)."""
    r = (counts + COUNT_EPS) ** -0.5
    span = r.max() - r.min()
    return (r - r.min()) / span if span > 0 else torch.zeros_like(r)


def state_density_reward(state_counts: torch.Tensor) -> torch.Tensor:
    """``-log p_D(s)`` with ``p_D`` the empirical state distribution, smoothed by the count pseudo-count."""
    p = (state_counts + COUNT_EPS) / (state_counts + COUNT_EPS).sum()
    return -torch.log(p)


def expected_reward(
    logits: torch.Tensor, T: torch.Tensor, p0: torch.Tensor, gamma: float, reward: torch.Tensor
) -> torch.Tensor:
    """``J(theta) = sum_{s,a} d^{pi_theta}(s, a) r(s, a)`` for a softmax policy ``pi_theta = softmax(logits)``
    (normalised discounted return); ``reward`` is ``[S]`` (state reward) or ``[S, A]``. Its autograd gradient is
    the exact policy gradient under the model ``T``."""
    d = stationary_distribution(T, p0, torch.softmax(logits, dim=1), gamma)
    r = reward[:, None] if reward.dim() == 1 else reward
    return (d * r).sum()


# -- the official code's baseline update (the baselines as strong as the official ones) ------------------------------
def discounted_state_distribution(discounted_counts: torch.Tensor) -> torch.Tensor:
    """``p_s [S]``: the *discounted* data state distribution of the official code, from the transition counts weighted
    by ``gamma^t`` (``t`` the step within its trajectory) ``[S, A, S]``, each initialised at
    :data:`OFFICIAL_COUNT_INIT` (so a state never visited keeps a tiny positive mass)."""
    n = discounted_counts + OFFICIAL_COUNT_INIT
    d_sa = n.sum(-1)
    return (d_sa / d_sa.sum()).sum(-1)


def minmax(r: torch.Tensor) -> torch.Tensor:
    """Min-max normalisation to [0, 1] (a constant reward becomes zeros)."""
    span = r.max() - r.min()
    return (r - r.min()) / span if span > 0 else torch.zeros_like(r)


def official_density_reward(p_s: torch.Tensor) -> torch.Tensor:
    """The official ``pb_s`` reward: ``-log p_s`` (``p_s`` the discounted data state distribution, ``+1e-100`` against
    log 0) min-max normalised to [0, 1] ``[S]``."""
    return minmax(-torch.log(p_s + 1e-100))


def policy_evaluation(T: torch.Tensor, pi: torch.Tensor, gamma: float, reward: torch.Tensor):
    """Unnormalised values of ``pi`` under ``T``: ``V = (I - gamma P_pi)^{-1} r_pi`` ``[S]`` and ``Q = r + gamma T V``
    ``[S, A]`` (the official ``policy_evaluation_mdp``); ``reward`` is ``[S]`` or ``[S, A]``."""
    S, A, _ = T.shape
    r = reward[:, None].expand(S, A) if reward.dim() == 1 else reward
    V = torch.linalg.solve(torch.eye(S, dtype=T.dtype) - gamma * state_transition(T, pi), (pi * r).sum(1))
    return V, r + gamma * (T @ V)


def official_pg_ascent(
    logits: torch.Tensor,
    T: torch.Tensor,
    gamma: float,
    reward: torch.Tensor,
    p_s: torch.Tensor,
    lr: float,
    steps: int,
) -> torch.Tensor:
    """The official baselines' policy update (``compute_pb_entropy_policy`` / ``compute_cb_exploration_policy``):
    ``steps`` ascent steps ``theta <- theta + lr p_s(s) Q^{pi_theta}(s, a)`` (``Q`` unnormalised under the MLE model
    ``T``, ``p_s`` the discounted data state distribution), then the logits reset to ``log(pi + 1e-100)``. This is not
    the policy gradient (which weighs by ``d^pi(s) pi(a|s) (Q - V)``): each state's logits move along its own ``Q``,
    weighted by how often the data visited it. The readable twin of :func:`ops.semdice.fused.official_pg_ascent`."""
    theta = logits.clone()
    for _ in range(steps):
        _, Q = policy_evaluation(T, torch.softmax(theta, 1), gamma, reward)
        theta = theta + lr * p_s[:, None] * Q
    return torch.log(torch.softmax(theta, 1) + 1e-100)
