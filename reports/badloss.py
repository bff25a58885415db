"""Claim-check report for BaDLoss: per-attack ASR table and loss-trajectory plots (clean vs each attack).

Called by ``suite/claim.py`` as ``claim_report(records, out_dir)``; reads each run's ``metrics.json`` (via the
records) and the ``badloss_detection.npz`` that :class:`BadlossLitModule` writes at detection time. The hand-written
set-up notes and verdict live in ``docs/results/badloss_notes.md``, which ``suite/claim.py`` appends to every page it
builds, so that ``python -m suite.claim badloss --report-only`` rebuilds the whole page.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from suite import report as rep


def _mean_std(values: list[float]) -> str:
    """``mean ± std`` in %, the sample standard deviation over seeds (n - 1), as the page's other tables use."""
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if len(v) == 0:
        return "—"
    return f"{100 * v.mean():.2f} ± {100 * (v.std(ddof=1) if len(v) > 1 else 0.0):.2f}"


def asr_table(records: list[Any]) -> str:
    """Markdown table: clean accuracy, mean ASR, per-attack ASR and detection AUC (in %, mean ± std over seeds)."""
    by_name: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        by_name[r.name].append(r.metrics)
    attacks = sorted(
        {k[len("test/asr_") :] for r in records for k in r.metrics if k.startswith("test/asr_")} - {"mean"}
    )
    cols = ["test/acc", "test/asr_mean", *[f"test/asr_{a}" for a in attacks], "detect/auc"]
    head = ["defence", "clean acc", "mean ASR", *[f"ASR {a}" for a in attacks], "detection AUC"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, ms in by_name.items():
        cells = [_mean_std([m.get(c, float("nan")) for m in ms]) for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(records: list[Any], reference: str = "none") -> str:
    """Markdown: mean ASR and clean-accuracy cost (vs ``reference``, paired by seed) per defence, in points."""
    by_name: dict[str, dict[Any, dict[str, float]]] = defaultdict(dict)
    for r in records:
        by_name[r.name][r.seed] = r.metrics
    ref = by_name.get(reference, {})
    head = ["defence", "seeds", "mean ASR (%)", "clean acc (%)", f"clean-acc cost vs {reference} (points)",
            "poisons removed (%)", "clean removed (%)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, runs in by_name.items():
        cost = [ref[s]["test/acc"] - m["test/acc"] for s, m in runs.items() if s in ref and "test/acc" in m]
        cells = [
            str(len(runs)),
            _mean_std([m.get("test/asr_mean", float("nan")) for m in runs.values()]),
            _mean_std([m.get("test/acc", float("nan")) for m in runs.values()]),
            _mean_std(cost) if name != reference else "0",
            _mean_std([m.get("detect/poison_removed", float("nan")) for m in runs.values()]),
            _mean_std([m.get("detect/clean_removed", float("nan")) for m in runs.values()]),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detection_table(records: list[Any]) -> str:
    """Markdown: detection AUC per attack (scores of that attack's poisons vs the clean examples), mean ± std."""
    by_name: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        if any(k.startswith("detect/auc") for k in r.metrics):
            by_name[r.name].append(r.metrics)
    attacks = sorted(
        {k[len("detect/auc_") :] for ms in by_name.values() for m in ms for k in m if k.startswith("detect/auc_")}
    )
    head = ["defence", "AUC (all)", *[f"AUC {a}" for a in attacks]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, ms in by_name.items():
        cols = ["detect/auc", *[f"detect/auc_{a}" for a in attacks]]
        lines.append(f"| {name} | " + " | ".join(_mean_std([m.get(c, float("nan")) for m in ms]) for c in cols) + " |")
    return "\n".join(lines)


def plot_trajectories(npz: Path, out_png: Path, max_per_group: int = 40) -> Path:
    """Loss trajectories of clean examples vs each attack's poisons (thin lines) and their medians (thick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = np.load(npz)
    traj, attack, kind, names = d["trajectories"], d["poison_attack"], d["probe_kind"], list(d["attack_names"])
    groups = {"clean": (attack < 0) & (kind == 0), "clean probes": kind == 1}
    groups.update({n: attack == i for i, n in enumerate(names)})
    fig, axes = plt.subplots(1, len(groups), figsize=(2.6 * len(groups), 2.6), sharey=True)
    rng = np.random.default_rng(0)
    epochs = np.arange(1, traj.shape[1] + 1)
    for ax, (name, mask) in zip(np.atleast_1d(axes), groups.items()):
        rows = np.nonzero(mask)[0]
        for i in rng.permutation(rows)[:max_per_group]:
            ax.plot(epochs, traj[i], color="tab:gray" if "clean" in name else "tab:red", alpha=0.25, lw=0.6)
        if len(rows):
            ax.plot(epochs, np.median(traj[rows], 0), color="k", lw=2)
        ax.set_title(f"{name} (n={len(rows)})", fontsize=8)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_yscale("symlog", linthresh=0.01)
    np.atleast_1d(axes)[0].set_ylabel("training loss")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


IMPLANTED = 0.5  # an attack is implanted when the undefended model's ASR on it is at least 50%
MODEST = 0.05  # "a modest clean-accuracy cost": at most 5 points below the undefended model


def convergence(records: list[Any], spec: dict | None = None) -> tuple[dict[str, tuple[bool, str]], dict]:
    """Per-entry convergence: the plateau rule on the sizing metric (main runs), settled or overridden by the 4x
    check of an entry that has a ``<entry>_long`` run (``none_long``: the undefended model trained 4x the epochs;
    ``abl_long``: ABL's same detection, then 4x the retraining), on clean test accuracy paired by seed (allowed:
    the seed spread of the entry's test accuracy) and, for a defence, on its mean ASR too. These runs keep a
    constant learning rate, and the clean validation loss moves by about +-0.03 from one epoch to the next, more
    than the seed spread of its final value, so the endpoint rule can read a flat curve as still improving; the 4x
    run measures what more training does to the test metric the claim compares
    (:func:`suite.report.apply_longer_checks` with ``passed_settles``). Returns ``(judged, checks)``."""
    metric, hib = rep.sizing_spec(spec or "badloss")
    plateaued = rep.sizing(rep.main_runs(records), metric or "val/loss", higher_is_better=hib)
    checks = rep.longer_checks(records, "test/acc", higher_is_better=True)
    # a defence's verdicts compare its mean ASR, which a longer retraining can move either way (the poisons it kept
    # get more epochs to implant; or the clean data wins): its 4x run must also leave the mean ASR within the seed
    # spread, in both directions; both checks must pass
    asr = rep.longer_checks(records, "test/asr_mean", higher_is_better=False, two_sided=True)
    for name, (ok, why) in asr.items():
        if name == "none":
            continue
        acc_ok, acc_why = checks.get(name, (True, "no paired accuracy"))
        checks[name] = (acc_ok and ok, f"clean accuracy: {acc_why}; mean ASR: {why}")
    return rep.apply_longer_checks(plateaued, checks, passed_settles=True), checks


def verdicts(records: list[Any], spec: dict | None = None) -> list[rep.Verdict]:
    """BaDLoss's claims as verdicts. ``inconclusive: phenomenon absent`` when no attack is implanted in the
    undefended model; ``inconclusive: underfit`` unless the compared entries converged (:func:`convergence`)."""
    judged, _ = convergence(records, spec)
    records = rep.main_runs(records)
    names = list(dict.fromkeys(r.name for r in records))
    attacks = sorted(
        {k[len("test/asr_") :] for r in records for k in r.metrics if k.startswith("test/asr_")} - {"mean"}
    )
    none = {a: rep.values(records, "none", f"test/asr_{a}") for a in attacks}
    implanted = [a for a, v in none.items() if v and sum(v) / len(v) >= IMPLANTED]
    out: list[rep.Verdict] = []
    bad = rep.values(records, "badloss", "test/asr_mean")
    others = {n: rep.values(records, n, "test/asr_mean") for n in names if n not in ("none", "badloss")}
    others = {n: v for n, v in others.items() if v}
    if bad and others:
        best = min(others, key=lambda n: sum(others[n]) / len(others[n]))
        ok = [judged.get(n, (False, ""))[0] for n in ("badloss", best)]
        word = rep.compare(bad, others[best], higher_is_better=False, converged=all(ok))
        if not implanted:
            word = rep.ABSENT
        ev = (
            f"mean ASR BaDLoss {rep.mean_sd(bad)} vs best other defence {best} {rep.mean_sd(others[best])}; "
            f"{len(implanted)} of {len(attacks)} attacks implanted in `none` (ASR >= {IMPLANTED:.0%}: "
            f"{', '.join(implanted) or 'none'}); " + ("plateaued" if all(ok) else "not plateaued (see sizing)")
        )
        out.append(rep.Verdict("With simultaneous attacks, BaDLoss leaves a lower mean ASR than every other defence",
                               word, ev))  # fmt: skip
        # the abstract's own comparison: BaDLoss vs the average of the other defences (per seed, over the defences
        # that ran it), which needs every averaged defence converged
        per = {n: {r.seed: r.metrics["test/asr_mean"] for r in records if r.name == n and "test/asr_mean" in r.metrics}
               for n in ("badloss", *others)}  # fmt: skip
        paired = sorted(s for s in per["badloss"] if all(s in per[n] for n in others))
        if paired:
            mine = [per["badloss"][s] for s in paired]
            avg = [sum(per[n][s] for n in others) / len(others) for s in paired]
            unfit = [n for n in ("badloss", *others) if not judged.get(n, (False, ""))[0]]
            word = rep.compare(mine, avg, higher_is_better=False, converged=not unfit)
            if not implanted:
                word = rep.ABSENT
            ev = (
                f"mean ASR BaDLoss {rep.mean_sd(mine)} vs the average of {', '.join(others)} {rep.mean_sd(avg)} "
                f"(per seed, {len(paired)} seeds); "
                + (f"not converged: {', '.join(unfit)} (see sizing)" if unfit else "every averaged entry converged")
            )
            out.append(rep.Verdict("BaDLoss leaves a lower mean ASR than the average other defence (the abstract's "
                                   "comparison)", word, ev))  # fmt: skip
    clean = {r.seed: r.metrics["test/acc"] for r in records if r.name == "none" and "test/acc" in r.metrics}
    cost = [clean[r.seed] - r.metrics["test/acc"] for r in records
            if r.name == "badloss" and r.seed in clean and "test/acc" in r.metrics]  # fmt: skip
    if cost:
        m = sum(cost) / len(cost)
        se = (sum((c - m) ** 2 for c in cost) / (len(cost) - 1) / len(cost)) ** 0.5 if len(cost) > 1 else 0.0
        ok = all(judged.get(n, (False, ""))[0] for n in ("badloss", "none"))
        if not ok:
            word = rep.UNDERFIT
        else:
            word = rep.REPRODUCED if m + 2 * se < MODEST else rep.NOT_REPRODUCED if m - 2 * se > MODEST else rep.NOISE
        unfit = [n for n in ("none", "badloss") if not judged.get(n, (False, ""))[0]]
        ev = f"cost {100 * m:+.2f} ± {100 * se:.2f} points (s.e., {len(cost)} seeds)"
        ev += f"; not converged: {', '.join(unfit)} (see sizing)" if unfit else "; none and badloss converged"
        out.append(rep.Verdict(
            f"BaDLoss's clean-accuracy cost is modest (< {100 * MODEST:.0f} points vs no defence, paired by seed)",
            word, ev))  # fmt: skip
    if not bad:  # the method's entry has not run: the claims are untested, never "not reproduced"
        missing = "the `badloss` entry has no finished run"
        unfit = [n for n in names if not judged.get(n, (False, ""))[0]]
        ev = missing + (f"; finished entries not plateaued: {', '.join(unfit)}" if unfit else "")
        cost_claim = (
            f"BaDLoss's clean-accuracy cost is modest (< {100 * MODEST:.0f} points vs no defence, paired by seed)"
        )
        for claim in (
            "With simultaneous attacks, BaDLoss leaves a lower mean ASR than every other defence",
            cost_claim,
        ):
            out.append(rep.Verdict(claim, rep.UNDERFIT, ev))
    return out


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    """Markdown appended to ``docs/results/badloss.md``."""
    out_dir = Path(out_dir)
    judged, _ = convergence(records, spec)
    conv = [f"* {n}: {'converged' if judged[n][0] else 'not converged'}: {judged[n][1]}" for n in judged]
    lines = [
        "## Verdicts (computed)",
        "",
        rep.verdict_table(verdicts(records, spec)),
        "",
        "Convergence of each entry as the verdicts use it (the plateau rule on `val/loss`; an entry with a 4x run, "
        "`<entry>_long`, is settled or overridden by that run's clean test accuracy, paired by seed, allowed: the "
        "seed spread of the entry's test accuracy; for a defence, its mean ASR as well, allowed its seed spread):",
        "",
        *conv,
        "",
        "## Summary: average ASR and clean-accuracy cost (%, mean ± std over seeds; 4x runs are sizing checks)",
        "",
        summary_table(records),
        "",
        "## Attack success rate per attack (%, mean ± std over seeds)",
        "",
        asr_table(records),
        "",
        "## Detection AUC per attack (%, mean ± std over seeds; poisons of that attack vs clean examples)",
        "",
        detection_table(records),
        "",
    ]
    npzs = sorted(
        (r for r in records if r.name == "badloss" and (Path(r.path) / "badloss_detection.npz").exists()),
        key=lambda r: r.seed if r.seed is not None else 0,
    )
    if npzs:
        png = plot_trajectories(Path(npzs[0].path) / "badloss_detection.npz", out_dir / "badloss_trajectories.png")
        lines += [
            "## Loss trajectories (BaDLoss detection phase, seed " + str(npzs[0].seed) + ")",
            "",
            f"![trajectories]({png.name})",
            "",
        ]
    return "\n".join(lines)
