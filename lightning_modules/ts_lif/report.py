"""Claim-check report hook for TS-LIF (``conf/claim/ts_lif.yaml``): robustness table, verdicts and the
frequency-response plot of the learned two-compartment neurons (Eq. (13))."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from layers.spiking.neurons import TSLIF_INIT_DECAY, TSLIF_INIT_GAMMA_DS, TSLIF_INIT_KAPPA
from layers.spiking.stability import frequency_response, system_matrix


def _mean(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def _group(records: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(r.name, []).append(r)
    return out


def _gains(d: list[float], kappa: float, gamma_ds: float, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = system_matrix(torch.tensor(d, dtype=torch.float64), kappa, gamma_ds)
    h_d, h_s = frequency_response(a, b, omega)
    return h_d.abs(), h_s.abs()


def plot_frequency_responses(groups: dict[str, list[Any]], path: Path) -> Path | None:
    """|H_d| and |H_s| over omega for each run group's learned coefficients (mean over seeds) and the init."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    omega = torch.linspace(0, math.pi, 128, dtype=torch.float64)
    curves = {"init": (list(TSLIF_INIT_DECAY), TSLIF_INIT_KAPPA, TSLIF_INIT_GAMMA_DS)}
    for name, recs in groups.items():
        coeffs = [r.metrics for r in recs if "neuron/d0" in r.metrics]
        if not coeffs:
            continue
        d = [statistics.fmean(m[f"neuron/d{i}"] for m in coeffs) for i in range(4)]
        curves[name] = (
            d,
            statistics.fmean(m["neuron/kappa"] for m in coeffs),
            statistics.fmean(m["neuron/gamma_ds"] for m in coeffs),
        )
    if len(curves) == 1:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for name, (d, kappa, gamma_ds) in curves.items():
        h_d, h_s = _gains(d, kappa, gamma_ds, omega)
        style = "k--" if name == "init" else "-"
        axes[0].plot(omega.numpy(), h_d.numpy(), style, label=name)
        axes[1].plot(omega.numpy(), h_s.numpy(), style, label=name)
    axes[0].set_title("dendrite |H_d(e^{jw})|")
    axes[1].set_title("soma |H_s(e^{jw})|")
    for ax in axes:
        ax.set_xlabel("omega (rad / step)")
        ax.set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def claim_report(records: list[Any], out_dir: str | Path) -> str:
    """Markdown: robustness (R^2 at 0/10/30% missing inputs), verdicts vs each baseline, learned-neuron gains."""
    out_dir = Path(out_dir)
    groups = _group(records)
    lines = [
        "## Robustness to missing inputs (R^2, mean ± std over seeds)",
        "",
        "| run | R^2 | R^2 @10% | R^2 @30% | drop 0 -> 30% | spectral radius |",
        "|---|---|---|---|---|---|",
    ]
    stats: dict[str, dict[str, tuple[float, float]]] = {}
    for name, recs in groups.items():
        row = {
            k: _mean([r.metrics.get(k, float("nan")) for r in recs])
            for k in ("test/r2", "test/r2_miss10", "test/r2_miss30", "neuron/spectral_radius")
        }
        row["drop"] = _mean(
            [r.metrics.get("test/r2", float("nan")) - r.metrics.get("test/r2_miss30", float("nan")) for r in recs]
        )
        stats[name] = row
        cells = [f"{row[k][0]:.4f} ± {row[k][1]:.3f}" for k in ("test/r2", "test/r2_miss10", "test/r2_miss30", "drop")]
        rho = row["neuron/spectral_radius"][0]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'—' if math.isnan(rho) else f'{rho:.3f}'} |")
    lines += ["", "## Verdicts (TS-LIF minus baseline, mean R^2 over seeds)", ""]
    gaps: dict[str, dict[str, float]] = {}
    for name in groups:
        if not name.startswith("ts_lif_h"):
            continue
        suffix = name[len("ts_lif") :]
        for base in ("lif", "tc_lif", "gru", "ts_lif_no_soma", "ts_lif_no_dspike"):
            other = f"{base}{suffix}"
            if other not in stats:
                continue
            diff = stats[name]["test/r2"][0] - stats[other]["test/r2"][0]
            gaps.setdefault(base, {})[suffix] = diff
            lines.append(
                f"- {name} vs {other}: ΔR^2 = {diff:+.4f} ({'TS-LIF better' if diff > 0 else 'TS-LIF NOT better'}); "
                f"R^2 change from 0% to 30% missing inputs: TS-LIF {-stats[name]['drop'][0]:+.4f}, "
                f"{other} {-stats[other]['drop'][0]:+.4f}"
            )
    for base, by_h in gaps.items():
        if len(by_h) > 1:
            items = sorted(by_h.items(), key=lambda kv: int(kv[0].lstrip("_h")))
            rises = items[-1][1] > items[0][1]
            sign = "positive" if all(g > 0 for _, g in items) else "not positive at every horizon"
            text = ", ".join(f"{h.lstrip('_')}: {g:+.4f}" for h, g in items)
            lines.append(
                f"- ΔR^2 vs {base} by horizon ({text}): {'rises' if rises else 'does NOT rise'} with horizon; {sign}"
            )
    plot = plot_frequency_responses(groups, out_dir / "ts_lif_freq.png")
    if plot is not None:
        lines += [
            "",
            "## Frequency response of the learned neurons (Eq. (13))",
            "",
            f"![frequency response]({plot.name})",
            "",
            "Dashed: the official initialisation (dendrite low-pass, soma band/high-pass).",
        ]
    return "\n".join(lines)
