"""Results-page hook of the sgm_lipschitz claim (``report: reports.sgm_lipschitz:claim_report``).

Mooney, Wang, Xin & Yu (ICLR 2025). ``make claim METHOD=sgm_lipschitz`` trains EDM MLP denoisers on the ring
mixture, the segment and the log-concave law; :func:`claim_report` computes the exact Lipschitz constants
(quadrature, :mod:`ops.scores.lipschitz`) and the bounds over OU time, and sets the learned constants logged by the
runs (``test/lip_learned_<i>`` at ``model.lipschitz_sigmas[i]``) beside them.

The three verdicts are exact computations (quadrature of the posterior covariance, no training, no seed): stated
verdicts with their criterion, no interval, since there is no noise to estimate. The learned constants come from one
seed per law and are context, not verdicts: a one-seed comparison of a trained model has no interval.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean

import numpy as np
import torch

from ops.scores.lipschitz import (
    blowup_time,
    heat_hessian_1d,
    heat_hessian_points,
    logconcave_bounds,
    logconcave_logp,
    ou_to_heat,
    piecewise_quadratic_logp,
    semiconvex_bound,
    spectral_norm_sym,
)
from suite import stats
from suite.claims import ClaimSpec, Figure, HookResult, Table, stated

D64 = torch.float64

# What each plot checks (the page's notes). The paper's equations were not recoverable offline: the bounds are our
# derivation of the stated results (docs/methods/sgm_lipschitz.md).
SGM_CONTEXT = (
    "Caveat: the paper's equations were not recoverable offline (the HTML lost its math); the bounds plotted are our "
    'derivation of the stated results (`docs/methods/sgm_lipschitz.md`). "Exact" = quadrature of the posterior '
    "covariance, grad^2 log q_v = Cov[X_0 | y] / v^2 - I / v (OU time t, heat time v = e^{2t} - 1), or the closed form "
    'for mixtures; "learned" = the spectral norm of the Jacobian of the score implied by the EDM MLP denoiser trained '
    "by the suite run of the same name, max over 64 test draws, times e^{2t}.",
    "(a) Theorem 3.1 (semiconvexity bound on the optimal time interval) and its optimality: the example whose score "
    "Lipschitz constant is bounded at t = 0 but blows up in finite time. log p_0 has curvature +K on a stretch of "
    "length 2R and -K outside (|grad^2 log p_0| <= K for every R); the bound K e^{2t} / (1 - K (e^{2t} - 1)) is finite "
    "only for t < t* = ln(1 + 1/K)/2, and the exact supremum at t* grows without bound with R.",
    "(b) The non-smooth case, data on a compact manifold with boundary, optimal O(1/t): uniform law on a segment in "
    "R^2; L(t) ~ 1/(2t), slope -1 on a log-log plot, exact and learned.",
    "(c) The smooth log-concave case (bounded for all t; the lower bound -L e^{2t} / (1 + L v) holds globally in "
    "time): p_0 ∝ exp(-x^2/4 - log cosh x), -1.5 <= (log p_0)'' <= -0.5, the exact Hessian against the band.",
    "Ring mixture: learned vs exact (closed form) Lipschitz constant of a trained model on the suite's default data.",
    "Not checked: the KL convergence rate of the uniform exponential-integrator scheme (the follow-up result).",
)


def _learned(records: list, name: str) -> tuple[list[float], list[float]]:
    """(OU times t, learned OU Lipschitz e^{2t} max_i |lambda(J s)|) from a run's test/lip_learned_<i> (seed mean)."""
    recs = [r for r in records if r.name == name]
    if not recs:
        return [], []
    sigmas = recs[0].config.get("model", {}).get("lipschitz_sigmas") or []
    ts, vals = [], []
    for i, s in enumerate(sigmas):
        v = [r.metrics[f"test/lip_learned_{i}"] for r in recs if f"test/lip_learned_{i}" in r.metrics]
        if v:
            t = 0.5 * math.log1p(s * s)
            ts.append(t)
            vals.append(math.exp(2 * t) * mean(v))
    return ts, vals


def claim_report(records: list, spec: ClaimSpec, out_dir: Path) -> HookResult:
    """Claim hook of sgm_lipschitz: the exact constants and bounds over OU time (stated verdicts), the learned
    constants from the runs (context tables) and the four-panel figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.set_num_threads(1)
    tables: list[Table] = []
    readings: list[str] = []
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.6))

    # (a) blow-up in finite time: curvature +-K, a convex stretch of length 2R.
    k = 1.0
    t_star = blowup_time(k)
    ts = np.linspace(0.0, 1.3 * t_star, 40)
    rows_a = []
    ax = axes[0]
    ratios_a, at_star = [], []
    for r in (1.0, 2.0, 4.0, 8.0):
        x0 = torch.arange(-2 * r - 10, 2 * r + 10, 0.01, dtype=D64)
        lp = piecewise_quadratic_logp(x0, k, r)
        y = torch.linspace(-2 * r, 2 * r, 161, dtype=D64)

        def sup_at(t: float, x0: torch.Tensor = x0, lp: torch.Tensor = lp, y: torch.Tensor = y) -> float:
            if t == 0:
                return k
            return math.exp(2 * t) * float(heat_hessian_1d(x0, lp, y, float(ou_to_heat(t))).max())

        vals = [sup_at(float(t)) for t in ts]
        ax.semilogy(ts, vals, label=f"exact, R={r:g}")
        below = [v / float(semiconvex_bound(k, t)) for v, t in zip(vals, ts, strict=True) if 0 < t < t_star]
        ratios_a.append(max(below))
        at_star.append(sup_at(t_star))
        rows_a.append(
            [f"{r:g}", *(f"{sup_at(f * t_star):.3g}" for f in (0.0, 0.5, 0.9, 1.0, 1.2)), f"{max(below):.3f}"]
        )
    grows = all(b > 2 * a for a, b in zip(at_star[1:], at_star[2:], strict=False))
    tables.append(
        Table(
            f"(a) Finite-time blow-up (K = {k}, t* = ln(1 + 1/K)/2 = {t_star:.4f})",
            ["R", "t = 0", "0.5 t*", "0.9 t*", "t*", "1.2 t*", "max ratio to bound on t < t*"],
            rows_a,
            "sup_x lambda_max(grad^2 log p_t) (exact, quadrature) against the semiconvexity bound "
            "K e^{2t} / (1 - K (e^{2t} - 1)).",
        )
    )
    tb = np.linspace(0, 0.995 * t_star, 200)
    ax.semilogy(tb, [float(semiconvex_bound(k, t)) for t in tb], "k--", label="bound K e^{2t}/(1-Kv)")
    ax.axvline(t_star, color="gray", ls=":")
    ax.set_title("(a) blow-up: sup lambda_max grad^2 log p_t", fontsize=9)
    ax.set_xlabel("OU time t")
    ax.legend(fontsize=7)

    # (b) uniform law on the segment [-1, 1] x {0} in R^2 (a manifold with boundary).
    s = torch.linspace(-1, 1, 4001, dtype=D64)
    pts = torch.stack([s, torch.zeros_like(s)], 1)
    logw = torch.zeros(4001, dtype=D64)
    gx, gy = torch.meshgrid(
        torch.linspace(-1.3, 1.3, 27, dtype=D64), torch.linspace(-0.3, 0.3, 13, dtype=D64), indexing="ij"
    )
    extra = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0], [0.999, 0.0]], dtype=D64)
    qy = torch.cat([torch.stack([gx, gy], -1).reshape(-1, 2), extra])

    def exact_segment(t: float) -> float:
        return math.exp(2 * t) * float(
            spectral_norm_sym(heat_hessian_points(pts, logw, qy, float(ou_to_heat(t)))).max()
        )

    tb_ = np.logspace(-4, 0, 17)
    exact_b = [exact_segment(float(t)) for t in tb_]
    slope = float(np.polyfit(np.log(tb_[:9]), np.log(exact_b[:9]), 1)[0])
    tl, learned_b = _learned(records, "segment")
    ax = axes[1]
    ax.loglog(tb_, exact_b, "o-", label="exact (quadrature)")
    if tl:
        ax.loglog(tl, learned_b, "s-", label="learned (EDM MLP, suite run)")
    ax.loglog(tb_, 1 / (2 * tb_), "k--", label="1/(2t)")
    ax.set_title("(b) segment in R^2: Lipschitz constant of the score", fontsize=9)
    ax.set_xlabel("OU time t")
    ax.legend(fontsize=7)
    tables.append(
        Table(
            "(b) Uniform law on the segment [-1, 1] x {0} in R^2 (manifold with boundary)",
            ["t", "exact L(t)", "2t L(t)"],
            [[f"{t:.1e}", f"{e:.4g}", f"{2 * t * e:.3f}"] for t, e in zip(tb_, exact_b, strict=True)],
            f"log-log slope of the exact L(t) for t in [1e-4, 1e-2]: {slope:.3f} (O(1/t) predicts -1).",
        )
    )
    if tl:
        exact_at = [exact_segment(t) for t in tl]
        rb = [lv / ev for lv, ev in zip(learned_b, exact_at, strict=True)]
        readings.append(
            f"(b) learned / exact on the segment from t = {tl[0]:.1e} to {tl[-1]:.1e}: "
            f"{', '.join(f'{v:.2f}' for v in rb)} (1 = the trained model has the exact constant; one seed, context)."
        )
        tables.append(
            Table(
                "(b) Segment: learned (max over 64 test draws) vs exact (sup over the probe grid) per noise level",
                ["t", "learned L(t)", "exact L(t)", "learned / exact"],
                [
                    [f"{t:.2e}", f"{lv:.4g}", f"{ev:.4g}", f"{lv / ev:.3f}"]
                    for t, lv, ev in zip(tl, learned_b, exact_at, strict=True)
                ],
            )
        )

    # (c) smooth strongly log-concave: -(m+1) <= grad^2 log p_0 <= -m.
    m = 0.5
    x0 = torch.linspace(-20, 20, 8001, dtype=D64)
    lp = logconcave_logp(x0, m)
    tc = np.logspace(-3, 0.5, 15)
    yq = torch.linspace(-4, 4, 81, dtype=D64)
    hmin, hmax = [], []
    for t in tc:
        h = math.exp(2 * t) * heat_hessian_1d(x0, lp, yq, float(ou_to_heat(t)))
        hmin.append(float(h.min()))
        hmax.append(float(h.max()))
    lo = [float(logconcave_bounds(m, m + 1, t)[0]) for t in tc]
    hi = [float(logconcave_bounds(m, m + 1, t)[1]) for t in tc]
    tlc, learned_c = _learned(records, "logconcave")
    ax = axes[2]
    ax.semilogx(tc, [-v for v in hmin], "o-", label="exact sup |grad^2 log p_t|")
    ax.semilogx(tc, [-v for v in lo], "k--", label="bound (m+1) e^{2t}/(1+(m+1)v)")
    ax.semilogx(tc, [-v for v in hi], "k:", label="lower m e^{2t}/(1+mv)")
    if tlc:
        ax.semilogx(tlc, learned_c, "s-", label="learned (suite run)")
    ax.set_title("(c) log-concave: bounded for all t", fontsize=9)
    ax.set_xlabel("OU time t")
    ax.legend(fontsize=7)
    ok = all(a >= b - 1e-6 and c <= d + 1e-6 for a, b, c, d in zip(hmin, lo, hmax, hi, strict=True))
    tables.append(
        Table(
            f"(c) Smooth strongly log-concave p_0 ∝ exp(-{m} x^2/2 - log cosh x)",
            ["t", "exact min", "exact max", "band lo", "band hi"],
            [
                [f"{t:.2e}", f"{a:.4f}", f"{b:.4f}", f"{c:.4f}", f"{d:.4f}"]
                for t, a, b, c, d in zip(tc, hmin, hmax, lo, hi, strict=True)
            ],
            f"Exact Hessian inside the band [-(m+1)e^(2t)/(1+(m+1)v), -m e^(2t)/(1+mv)] at every t: {ok}.",
        )
    )
    if tlc:
        sup = [-float(logconcave_bounds(m, m + 1, t)[0]) for t in tlc]
        inside = [lv <= b * 1.05 for lv, b in zip(learned_c, sup, strict=True)]
        readings.append(
            f"(c) learned constant within 5% of the band's upper end or below at {sum(inside)} of {len(inside)} times "
            f"(max learned {max(learned_c):.3g} vs band sup {-lo[0]:.3g}; one seed, context)."
            + (
                " The excess is at the smallest noise levels: the score (D - x) / sigma^2 multiplies any error in the "
                "learned denoiser's Jacobian by 1 / sigma^2, so a learned constant there bounds the model, not the law."
                if learned_c[0] > -lo[0] * 1.05
                else ""
            )
        )
        tables.append(
            Table(
                "(c) Log-concave: learned (max |eigenvalue| over 64 test draws) at the run's noise levels",
                ["t", "learned", "band sup (m+1) e^{2t}/(1+(m+1)v)"],
                [[f"{t:.2e}", f"{lv:.4f}", f"{b:.4f}"] for t, lv, b in zip(tlc, learned_c, sup, strict=True)],
            )
        )

    # Ring mixture: learned vs exact (closed-form GMM Hessian) at the run's noise levels.
    ring = [r for r in records if r.name == "ring"]
    ax = axes[3]
    if ring:
        sig = ring[0].config.get("model", {}).get("lipschitz_sigmas") or []
        rows = []
        for i, s_ in enumerate(sig):
            lv = [r.metrics[f"test/lip_learned_{i}"] for r in ring if f"test/lip_learned_{i}" in r.metrics]
            ev = [r.metrics[f"test/lip_exact_{i}"] for r in ring if f"test/lip_exact_{i}" in r.metrics]
            if lv and ev:
                rows.append((s_, mean(lv), float(np.std(lv)), mean(ev)))
        readings.append(
            "Ring: learned / exact at sigma = "
            + ", ".join(f"{r_[0]:g}: {r_[1] / r_[3]:.2f}" for r_ in rows)
            + " (below 1: the trained MLP under-estimates the sharp curvature at small sigma; context)."
        )
        ax.loglog([r[0] for r in rows], [r[3] for r in rows], "o-", label="exact (closed form)")
        ax.loglog([r[0] for r in rows], [r[1] for r in rows], "s-", label="learned (EDM MLP)")
        tables.append(
            Table(
                "Ring of 8 Gaussians (the suite's default mixture): learned vs exact score Lipschitz constant",
                ["sigma", "learned (mean ± sd)", "exact", "learned / exact"],
                [[f"{s_:g}", f"{lv:.4g} ± {sd:.2g}", f"{ev:.4g}", f"{lv / ev:.3f}"] for s_, lv, sd, ev in rows],
                f"max over 64 test draws of |lambda(grad^2 log p_sigma)| (EDM noise level sigma), {len(ring)} seed(s).",
            )
        )
    ax.set_title("ring mixture: learned vs exact (EDM sigma)", fontsize=9)
    ax.set_xlabel("sigma")
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "sgm_lipschitz_study.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    exact = "exact quadrature, deterministic: no seed noise to estimate"
    verdicts = [
        stated(
            "blowup_at_tstar",
            "(a) The semiconvexity bound holds for t < t*, and the score's Lipschitz constant can blow up at t*",
            stats.REPRODUCED if max(ratios_a) <= 1.001 and grows else stats.NOT_REPRODUCED,
            f"{exact}; criterion: exact/bound <= 1.001 on t < t* and the sup at t* more than doubles per doubling of R",
            evidence=f"max exact/bound {max(ratios_a):.3f}; sup at t* for R = 1, 2, 4, 8: "
            + ", ".join(f"{v:.3g}" for v in at_star),
            primary=True,
        ),
        stated(
            "manifold_one_over_t",
            "(b) Data on a manifold with boundary: the Lipschitz constant grows as O(1/t)",
            stats.REPRODUCED if abs(slope + 1) < 0.1 else stats.NOT_REPRODUCED,
            f"{exact}; criterion: the log-log slope within 0.1 of -1",
            evidence=f"exact log-log slope {slope:.3f} on t in [1e-4, 1e-2]",
            primary=True,
        ),
        stated(
            "logconcave_band",
            "(c) Smooth strongly log-concave data: the Hessian stays inside the band for all t",
            stats.REPRODUCED if ok else stats.NOT_REPRODUCED,
            f"{exact}; criterion: inside the band at every one of {len(tc)} times",
            evidence=f"exact Hessian inside the band at all {len(tc)} times: {ok}",
            primary=True,
        ),
    ]
    notes = [*SGM_CONTEXT, *readings]
    return HookResult(verdicts=verdicts, tables=tables, figures=[Figure("Lipschitz over time", path)], notes=notes)
