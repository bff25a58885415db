"""Results-page hook of the TS-LIF claim (``report: reports.ts_lif:claim_report``), after "TS-LIF: A Temporal
Segment Spiking Neuron Network for Time Series Forecasting" (ICLR 2025).

The comparisons on test R^2 are the spec's declared claims (``conf/claim/ts_lif.yaml``). This hook judges the claims
on derived values, which a spec cannot declare: TS-LIF loses less R^2 than LIF / TC-LIF when inputs go missing
(clean-trained at the longest horizon, and trained with missing inputs), and its R^2 gain over each grows with the
horizon. It also supplies the 4x checks' convergence (``<entry>_long`` runs, when the spec has them), the robustness
and margins tables, the learned two-compartment coefficients with their frequency response (Eq. (13)) and the
validation R^2 curves.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from layers.spiking.neurons import TSLIF_INIT_DECAY, TSLIF_INIT_GAMMA_DS, TSLIF_INIT_KAPPA
from layers.spiking.stability import frequency_response, system_matrix
from suite import stats
from suite.claims import (
    Claim,
    ClaimResult,
    ClaimSpec,
    Figure,
    HookResult,
    Table,
    default_paired,
    fmt,
    judge_values,
    seed_values,
)
from suite.compare import RunRecord
from suite.report import apply_longer_checks, longer_checks, main_runs, mean_sd

BASELINES = ("lif", "tc_lif", "gru", "ts_lif_no_soma", "ts_lif_no_dspike")
SPIKING = {"lif": "LIF", "tc_lif": "TC-LIF"}
# the smallest effect of interest of the derived claims, as the declared ones (conf/claim/ts_lif.yaml: stated,
# the paper's tables were not recovered)
DELTA = 0.01
DELTA_WHY = "as ts_vs_lif_h24: ~4% of TS-LIF's R^2 at h24 here (paper's tables not recovered)"


def _ratios(records: list[RunRecord]) -> list[int]:
    """Test-time missing ratios (percent) present in the metrics, from keys ``test/r2_miss<p>``."""
    found = {int(m.group(1)) for r in records for k in r.metrics if (m := re.fullmatch(r"test/r2_miss(\d+)", k))}
    return sorted(found)


def drops(records: list[RunRecord], name: str, key: str) -> dict[str, float]:
    """``{seed: test R^2 minus key}`` of entry ``name``: the R^2 lost when more inputs are zeroed (non-finite seeds
    dropped)."""
    full, less = seed_values(records, name, "test/r2"), seed_values(records, name, key)
    return {s: full[s] - less[s] for s in full if s in less}


def _gains(d: list[float], kappa: float, gamma_ds: float, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = system_matrix(torch.tensor(d, dtype=torch.float64), kappa, gamma_ds)
    h_d, h_s = frequency_response(a, b, omega)
    return h_d.abs(), h_s.abs()


def _names(records: list[RunRecord]) -> list[str]:
    return list(dict.fromkeys(r.name for r in records))


def _learned(records: list[RunRecord]) -> dict[str, tuple[list[float], float, float]]:
    """Mean learned ``(d, kappa, gamma_ds)`` over seeds of every entry that logged ``neuron/*``."""
    out = {}
    for name in _names(records):
        coeffs = [r.metrics for r in records if r.name == name and "neuron/d0" in r.metrics]
        if coeffs:
            out[name] = (
                [statistics.fmean(m[f"neuron/d{i}"] for m in coeffs) for i in range(4)],
                statistics.fmean(m["neuron/kappa"] for m in coeffs),
                statistics.fmean(m["neuron/gamma_ds"] for m in coeffs),
            )
    return out


def plot_frequency_responses(records: list[RunRecord], path: Path) -> Path | None:
    """|H_d| and |H_s| over omega for each entry's learned coefficients (mean over seeds) and the init."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    omega = torch.linspace(0, math.pi, 128, dtype=torch.float64)
    curves = {"init (TS-LIF)": (list(TSLIF_INIT_DECAY), TSLIF_INIT_KAPPA, TSLIF_INIT_GAMMA_DS), **_learned(records)}
    if len(curves) == 1:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for name, (d, kappa, gamma_ds) in curves.items():
        h_d, h_s = _gains(d, kappa, gamma_ds, omega)
        style = "k--" if name.startswith("init") else "-"
        axes[0].plot(omega.numpy(), h_d.numpy(), style, label=name)
        axes[1].plot(omega.numpy(), h_s.numpy(), style, label=name)
    axes[0].set_title("dendrite |H_d(e^{jw})|")
    axes[1].set_title("soma |H_s(e^{jw})|")
    for ax in axes:
        ax.set_xlabel("omega (rad / step)")
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-2)  # TC-LIF: H_d(omega = 0) is exactly 0
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_val_curves(records: list[RunRecord], path: Path, key: str = "val/r2") -> Path | None:
    """Validation R^2 against the optimisation step, mean over seeds, one line per entry."""
    series = {}
    for name in _names(records):
        by_step: dict[int, list[float]] = {}
        for r in (r for r in records if r.name == name):
            for step, v in (getattr(r, "curves", {}) or {}).get(key, []):
                by_step.setdefault(step, []).append(v)
        if by_step:
            steps = sorted(by_step)
            series[name] = (steps, [statistics.fmean(by_step[s]) for s in steps])
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (steps, vals) in series.items():
        ax.plot(steps, vals, "--" if name.startswith("gru") else "-", marker=".", label=name)
    ax.set_xlabel("optimisation step")
    ax.set_ylabel(f"{key} (mean over seeds)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def convergence(records: list[RunRecord], spec: ClaimSpec) -> tuple[dict[str, tuple[bool, str]], dict]:
    """``(entry -> (converged, reading), the 4x checks)``: the spec's rule on the sizing metric (validation R^2; the
    early-stopping rule with ``sizing_patience``), and where an entry has a 4x run (``<entry>_long``) its check on
    test R^2 decides (:func:`suite.report.apply_longer_checks` with ``passed_settles``): a run at a constant learning
    rate moves its validation R^2 from checkpoint to checkpoint, so the rule can read a flat curve as rising; the 4x
    run shows what more training does to the test R^2."""
    checks = longer_checks(records, "test/r2", higher_is_better=True)
    return apply_longer_checks(spec.convergence(records), checks, passed_settles=True), checks


def _unconverged(judged: dict[str, tuple[bool, str]], *names: str) -> dict[str, str]:
    return {n: judged.get(n, (False, "no validation curve logged"))[1] for n in names if not judged.get(n, (False,))[0]}


def _judge(claim: Claim, a: dict, b: dict, paired: bool, judged: dict, *names: str) -> ClaimResult:
    return judge_values(claim, a, b, paired=paired, unconverged=_unconverged(judged, *names))


def derived_verdicts(records: list[RunRecord], judged: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """The claims on derived values: TS-LIF loses less R^2 with missing inputs (the most inputs zeroed at test, at
    the longest horizon; and, trained with m% missing, from m% to the most), and its R^2 gain over each spiking
    neuron grows from the shortest to the longest horizon (per-seed gains, seed s of TS-LIF minus seed s of the
    neuron, compared across horizons by Welch). Each is judged only when the entries it reads converged; each names
    the baseline entries it is read against, for the weak-baseline rule."""
    ratios = _ratios(records)
    top = ratios[-1] if ratios else None
    horizons = sorted({int(m.group(1)) for r in records if (m := re.fullmatch(r"ts_lif_h(\d+)", r.name))})
    out: list[ClaimResult] = []
    for base, label in SPIKING.items():
        by_h = [h for h in horizons if seed_values(records, f"{base}_h{h}", "test/r2")]
        if len(by_h) > 1:
            h0, h1 = by_h[0], by_h[-1]
            gaps = []
            for h in (h1, h0):
                ts, other = (seed_values(records, f"{n}_h{h}", "test/r2") for n in ("ts_lif", base))
                gaps.append({s: ts[s] - other[s] for s in ts if s in other})
            claim = Claim(
                id=f"growth_vs_{base}",
                text=f"TS-LIF's R^2 gain over {label} grows with the horizon (h{h0} to h{h1})",
                metric=f"test/r2 of TS-LIF minus {label}, per seed",
                entries=(f"gain h{h1}", f"gain h{h0}"),
                higher_is_better=True,
                delta=DELTA,
                delta_why=DELTA_WHY,
            )
            names = (f"ts_lif_h{h1}", f"{base}_h{h1}", f"ts_lif_h{h0}", f"{base}_h{h0}")
            res = _judge(claim, *gaps, False, judged, *names)
            out.append(replace(res, against=(f"{base}_h{h0}", f"{base}_h{h1}")))
        if top and horizons:
            h = horizons[-1]
            a, b = f"ts_lif_h{h}", f"{base}_h{h}"
            da, db = drops(records, a, f"test/r2_miss{top}"), drops(records, b, f"test/r2_miss{top}")
            if da and db:
                claim = Claim(
                    id=f"robust_vs_{base}_h{h}",
                    text=f"TS-LIF degrades less than {label} with missing inputs (h{h})",
                    metric=f"R^2 lost at {top}% missing inputs (test/r2 - test/r2_miss{top})",
                    entries=(a, b),
                    higher_is_better=False,
                    delta=DELTA,
                    delta_why=DELTA_WHY,
                )
                out.append(_judge(claim, da, db, default_paired(records, a, b), judged, a, b))
    # trained (and tested) with m% of the inputs zeroed, as the official missing-data mode: `<neuron>_h<h>_m<m>`
    trained_missing = sorted(
        {(int(m.group(1)), int(m.group(2))) for r in records if (m := re.fullmatch(r"ts_lif_h(\d+)_m(\d+)", r.name))}
    )
    for hm, miss in trained_missing:
        if not top or top <= miss:
            continue
        for base, label in SPIKING.items():
            a, b = f"ts_lif_h{hm}_m{miss}", f"{base}_h{hm}_m{miss}"
            da, db = (drops(records, n, f"test/r2_miss{top}") for n in (a, b))
            if not da or not db:
                continue
            claim = Claim(
                id=f"m{miss}_robust_vs_{base}",
                text=f"Trained with {miss}% missing inputs, TS-LIF loses less R^2 than {label} at {top}% (h{hm})",
                metric=f"R^2 lost from {miss}% to {top}% missing (test/r2 - test/r2_miss{top})",
                entries=(a, b),
                higher_is_better=False,
                delta=DELTA,
                delta_why=DELTA_WHY,
            )
            out.append(_judge(claim, da, db, default_paired(records, a, b), judged, a, b))
    return out


def robustness_table(records: list[RunRecord]) -> Table:
    """Test R^2 clean and at each missing ratio, the R^2 lost at the largest, and the learned neuron's spectral
    radius (mean ± sd over seeds)."""
    ratios = _ratios(records)
    top = ratios[-1] if ratios else None
    rows = []
    for name in _names(records):
        cells = [mean_sd(list(seed_values(records, name, "test/r2").values()))]
        cells += [mean_sd(list(seed_values(records, name, f"test/r2_miss{p}").values())) for p in ratios]
        cells += [mean_sd(list(drops(records, name, f"test/r2_miss{top}").values()))] if top else []
        rho = list(seed_values(records, name, "neuron/spectral_radius").values())
        cells.append(f"{statistics.fmean(rho):.3f}" if rho else "—")
        rows.append([name, *cells])
    head = ["R^2", *(f"R^2 @{p}%" for p in ratios), *([f"drop 0 -> {top}%"] if top else []), "spectral radius"]
    return Table(
        "Robustness to missing inputs (test R^2, mean ± sd over seeds)",
        ["run", *head],
        rows,
        "Each trained model is tested on the clean test windows and with each input entry zeroed at the given ratio.",
    )


def _diff(records: list[RunRecord], a: str, b: str, va: dict, vb: dict, sign: float = 1.0) -> str:
    try:
        iv = stats.interval(va, vb, paired=default_paired(records, a, b), sign=sign)
    except ValueError:
        return "—"
    return f"{fmt(iv.diff)} [{fmt(iv.lo)}, {fmt(iv.hi)}] ({iv.method})"


def margins_table(records: list[RunRecord]) -> Table | None:
    """Every TS-LIF entry against every baseline, ablation and the GRU reference in the same setting: the
    difference of test R^2 and of the R^2 lost at the largest missing ratio, with 95% intervals."""
    ratios = _ratios(records)
    top = ratios[-1] if ratios else None
    names = set(_names(records))
    rows = []
    for name in _names(records):
        if not (m := re.fullmatch(r"ts_lif_h(\d+)(_m\d+)?", name)):  # ts_lif_h<H>, or trained with P% missing
            continue
        for base in BASELINES:
            other = f"{base}_h{m.group(1)}{m.group(2) or ''}"
            if other not in names:
                continue
            r2 = _diff(records, name, other, *(seed_values(records, n, "test/r2") for n in (name, other)))
            row = [name, other, r2]
            if top:
                lost = (drops(records, n, f"test/r2_miss{top}") for n in (name, other))
                row.append(_diff(records, name, other, *lost))
            rows.append(row)
    if not rows:
        return None
    columns = [
        "TS-LIF",
        "vs",
        "ΔR^2 [95% CI]",
        *([f"Δ R^2 lost at {top}% [95% CI] (negative: TS-LIF loses less)"] if top else []),
    ]
    return Table("Margins (TS-LIF minus the other entry)", columns, rows)


def neurons_table(records: list[RunRecord]) -> Table | None:
    """The learned two-compartment coefficients (mean over seeds), the spectral radius of A and the gains of
    (I - A z^-1)^-1 B at three frequencies (Eqs. (11)-(13)), beside the official initialisation."""
    learned = _learned(records)
    if not learned:
        return None
    omega = torch.tensor([0.0, math.pi / 8, math.pi], dtype=torch.float64)
    rows = []
    init = {"init (TS-LIF)": (list(TSLIF_INIT_DECAY), TSLIF_INIT_KAPPA, TSLIF_INIT_GAMMA_DS)}
    for name, (d, kappa, gamma_ds) in {**init, **learned}.items():
        a, _ = system_matrix(torch.tensor(d, dtype=torch.float64), kappa, gamma_ds)
        rho = float(torch.linalg.eigvals(a).abs().max())
        h_d, h_s = _gains(d, kappa, gamma_ds, omega)
        hd, hs = (", ".join(f"{v:.3f}" for v in h.tolist()) for h in (h_d, h_s))
        rows.append([name, *(f"{v:.3f}" for v in (*d, kappa, gamma_ds, rho)), hd, hs])
    columns = ["run", "d0", "d1", "d2", "d3", "κ", "γ_ds", "ρ(A)", "abs H_d at 0, π/8, π", "abs H_s at 0, π/8, π"]
    return Table("Learned two-compartment neurons (mean over seeds; Eqs. (11)-(13))", columns, rows)


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The derived claims' verdicts, the 4x checks' convergence, the robustness / margins / neuron tables and the
    validation-curve and frequency-response figures."""
    out_dir = Path(out_dir)
    judged, checks = convergence(records, spec)
    records = main_runs(records)  # the 4x runs enter only their checks
    tables = [t for t in (robustness_table(records), margins_table(records), neurons_table(records)) if t]
    figures = []
    if (curves := plot_val_curves(records, out_dir / "ts_lif_val_r2.png")) is not None:
        figures.append(Figure("Validation R^2 during training (mean over seeds)", curves))
    if (freq := plot_frequency_responses(records, out_dir / "ts_lif_freq.png")) is not None:
        figures.append(Figure("Frequency response of the learned neurons (Eq. (13); dashed: the official init)", freq))
    notes = []
    if checks:
        notes.append(
            "4x checks (the same entry trained 4x the steps, on test R^2): an entry with one counts as converged when "
            "it passes, even where the convergence rule read its validation curve as still rising; a failed check "
            "makes it underfit whatever its curve. On one seed the check compares two final test values, each with "
            "its run's final-checkpoint noise: a weak test near its threshold."
        )
    return HookResult(
        verdicts=derived_verdicts(records, judged), tables=tables, figures=figures, notes=notes, convergence=judged
    )
