"""Results-page hook of the BaDLoss claim (``report: reports.badloss:claim_report``), after "BaDLoss: Backdoor
Detection via Loss Dynamics" (Alex et al., ICLR 2025).

The clean-accuracy cost (BaDLoss vs no defence, non-inferiority) is a declared claim of ``conf/claim/badloss.yaml``.
This hook builds the two claims on mean attack success rate (ASR) that the spec cannot declare, both paired by seed
(seed ``s`` of every entry trains on the same poisoned set, ``data.seed = seed``):

* ``asr_vs_average_defence`` (primary; the abstract's comparison, 7.98% against 63.44% on CIFAR-10): BaDLoss's mean
  ASR against the per-seed average of the other defences' mean ASR;
* ``asr_vs_best_defence``: against the other defence with the lowest mean ASR on these runs.

Both read ``inconclusive: phenomenon absent`` when no attack is implanted in the undefended model (``none``: mean
ASR below :data:`IMPLANTED` on every attack). Convergence (:func:`convergence`) is judged on the retraining phase of
each defended run, and a ``<entry>_long`` 4x run settles or overrides it. The page also gets the per-defence tables
(ASR, clean-accuracy cost, detection AUC per attack) and the loss trajectories of BaDLoss's detection phase when the
run folder holds ``badloss_detection.npz`` (binary, not kept in the results data file).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from suite import stats
from suite.claims import Claim, ClaimResult, ClaimSpec, Figure, HookResult, Table, judge_values, seed_values
from suite.report import apply_longer_checks, longer_checks, main_runs, mean_sd, series

IMPLANTED = 0.5  # an attack is implanted when the undefended model's mean ASR on it is at least 50%
DELTA = 0.05  # smallest ASR difference of interest: about a tenth of the paper's 55-point gap (7.98% vs 63.44%)
PAPER_GAP = 0.0798 - 0.6344  # abstract, CIFAR-10: BaDLoss minus the average other defence
NPZ = "badloss_detection.npz"


def _pct(values: Any) -> str:
    return mean_sd([100 * v for v in values])


def attacks_of(records: list[Any], prefix: str = "test/asr_") -> list[str]:
    """Attack names found in the records' ``<prefix><attack>`` metrics (``mean`` excluded), sorted."""
    return sorted({k[len(prefix) :] for r in records for k in r.metrics if k.startswith(prefix)} - {"mean"})


def retrain_curve(record: Any, metric: str) -> list[tuple[float, float]]:
    """The run's ``metric`` curve over its retraining phase: a defended run validates its detection model for the
    first ``detect_epochs`` epochs, then a fresh model, so the best-so-far rule on the whole curve would read the
    detection model's best; ``none`` (and a record without its config) keeps the whole curve."""
    points = sorted(series(record, metric))
    cfg = getattr(record, "config", None) or {}
    model = cfg.get("model") or {}
    if model.get("defence", "none") == "none" or "detect_epochs" not in model:
        return points
    every = int((cfg.get("trainer") or {}).get("check_val_every_n_epoch") or 1)
    return points[int(model["detect_epochs"]) // every :]


def convergence(records: list[Any], spec: ClaimSpec) -> tuple[dict[str, tuple[bool, str]], dict]:
    """``(entry -> (converged, reading), the 4x checks)``.

    The spec's rule (best-so-far ``val/loss``, its tolerance) on each entry's retraining phase (:func:`retrain_curve`),
    then the 4x check of every entry with a ``<entry>_long`` run (``none_long``: 4x the epochs; ``abl_long``: the
    same isolation, then 4x the retraining), paired by seed on clean test accuracy and, for a defence, two-sided on
    mean ASR (a longer retraining can implant the poisons a defence kept, or let the clean data win); both must
    pass. The clean validation loss moves by about +-0.03 between epochs at this constant learning rate, so a passed
    check settles an entry the rule read as still improving (:func:`suite.report.apply_longer_checks` with
    ``passed_settles``) and a failed one makes it unconverged."""
    metric = spec.sizing_metric or "val/loss"
    judged = {}
    for name in dict.fromkeys(r.name for r in records):
        curves = [c for c in (retrain_curve(r, metric) for r in records if r.name == name) if c]
        c = stats.converged(curves, higher_is_better=spec.higher_is_better, frac=spec.frac, tol=spec.tol, rel=spec.rel)
        judged[name] = (c.ok, c.reading)
    checks = longer_checks(records, "test/acc", higher_is_better=True)
    asr = longer_checks(records, "test/asr_mean", higher_is_better=False, two_sided=True)
    for name, (ok, why) in asr.items():
        if name == "none":  # no claim reads the undefended model's ASR beyond the phenomenon check
            continue
        acc_ok, acc_why = checks.get(name, (True, "no paired accuracy"))
        checks[name] = (acc_ok and ok, f"clean accuracy: {acc_why}; mean ASR: {why}")
    return apply_longer_checks(judged, checks, passed_settles=True), checks


def implanted(records: list[Any]) -> list[str] | None:
    """Attacks whose mean ASR over the seeds of ``none`` is at least :data:`IMPLANTED`; ``None`` without ``none``."""
    if not any(r.name == "none" for r in records):
        return None
    out = []
    for a in attacks_of(records):
        v = seed_values(records, "none", f"test/asr_{a}")
        if v and statistics.fmean(v.values()) >= IMPLANTED:
            out.append(a)
    return out


def verdicts(records: list[Any], judged: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """The two ASR claims (module docstring) on the main runs; ``judged``: :func:`convergence`."""
    records = main_runs(records)
    metric = "test/asr_mean"
    others = [n for n in dict.fromkeys(r.name for r in records) if n not in ("none", "badloss")]
    per = {n: seed_values(records, n, metric) for n in ("badloss", *others)}
    others = [n for n in others if per[n]]
    if not others:
        return []
    hit = implanted(records)
    absent = None
    if hit is not None and not hit:
        absent = f"no attack implanted in `none` (mean ASR >= {IMPLANTED:.0%} on none of {attacks_of(records)})"
    context = (
        ""
        if hit is None
        else (
            f"{len(hit)} of {len(attacks_of(records))} attacks implanted in `none` (mean ASR >= {IMPLANTED:.0%}): "
            + (", ".join(hit) or "none")
        )
    )

    def unfit(*names: str) -> dict[str, str]:
        return {n: judged.get(n, (False, "no validation curve"))[1] for n in names if not judged.get(n, (False,))[0]}

    bad = per["badloss"]
    common = [s for s in bad if all(s in per[n] for n in others)]
    average = {s: statistics.fmean(per[n][s] for n in others) for s in common}
    avg_claim = Claim(
        "asr_vs_average_defence",
        "With simultaneous attacks, BaDLoss leaves a lower mean ASR than the average other defence (the abstract's "
        "comparison)",
        metric,
        ("badloss", f"average of {', '.join(others)}"),
        False,
        delta=DELTA,
        delta_why="about a tenth of the paper's gap (7.98% vs 63.44% mean ASR, CIFAR-10)",
        primary=True,
        published=PAPER_GAP,
        paired=True,
    )
    avg = judge_values(
        avg_claim,
        {s: bad[s] for s in common},
        average,
        paired=True,
        unconverged=unfit("badloss", *others),
        absent=absent,
    )
    avg.against, avg.evidence = tuple(others), context
    # the strictest single comparison: the other defence with the lowest mean ASR on these runs
    best = min(others, key=lambda n: statistics.fmean(per[n].values()))
    best_claim = Claim(
        "asr_vs_best_defence",
        "With simultaneous attacks, BaDLoss leaves a lower mean ASR than every other defence (read against the one "
        "with the lowest mean ASR)",
        metric,
        ("badloss", best),
        False,
        delta=DELTA,
        delta_why="as asr_vs_average_defence (the paper's per-defence numbers were not retrieved)",
        paired=True,
    )
    one = judge_values(best_claim, bad, per[best], paired=True, unconverged=unfit("badloss", best), absent=absent)
    one.evidence = context
    return [avg, one]


def summary_table(records: list[Any], reference: str = "none") -> Table:
    """Mean ASR, clean accuracy, clean-accuracy cost against ``reference`` (paired by seed) and what each defence
    removed, in %, mean ± sd over seeds; the 4x runs are sizing checks."""
    ref = seed_values(records, reference, "test/acc")
    rows = []
    for name in dict.fromkeys(r.name for r in records):
        acc = seed_values(records, name, "test/acc")
        cost = [ref[s] - acc[s] for s in acc if s in ref]
        rows.append(
            [
                name,
                sum(r.name == name for r in records),
                _pct(seed_values(records, name, "test/asr_mean").values()),
                _pct(acc.values()),
                "0" if name == reference else _pct(cost),
                _pct(seed_values(records, name, "detect/poison_removed").values()),
                _pct(seed_values(records, name, "detect/clean_removed").values()),
            ]
        )
    columns = [
        "defence",
        "seeds",
        "mean ASR %",
        "clean acc %",
        f"clean-acc cost vs {reference} (points, paired)",
        "poisons removed %",
        "clean removed %",
    ]
    return Table("Mean ASR and clean-accuracy cost (mean ± sd over seeds; `_long`: 4x sizing checks)", columns, rows)


def asr_table(records: list[Any]) -> Table:
    """Clean accuracy, mean and per-attack ASR, detection AUC, in %, mean ± sd over seeds."""
    attacks = attacks_of(records)
    keys = ["test/acc", "test/asr_mean", *(f"test/asr_{a}" for a in attacks), "detect/auc"]
    rows = [
        [name, *(_pct(seed_values(records, name, k).values()) for k in keys)]
        for name in dict.fromkeys(r.name for r in records)
    ]
    columns = ["defence", "clean acc", "mean ASR", *(f"ASR {a}" for a in attacks), "detection AUC"]
    return Table(
        "Attack success rate per attack (%, mean ± sd over seeds)",
        columns,
        rows,
        "ASR: accuracy towards the attack's target on its triggered non-target test images.",
    )


def detection_table(records: list[Any]) -> Table:
    """Detection AUC, all poisons and per attack (that attack's poisons vs the clean examples), in %."""
    attacks = attacks_of(records, "detect/auc_")
    keys = ["detect/auc", *(f"detect/auc_{a}" for a in attacks)]
    names = [n for n in dict.fromkeys(r.name for r in records) if seed_values(records, n, "detect/auc")]
    rows = [[n, *(_pct(seed_values(records, n, k).values()) for k in keys)] for n in names]
    return Table(
        "Detection AUC per attack (%, mean ± sd over seeds; poisons of that attack vs clean examples)",
        ["defence", "AUC (all)", *(f"AUC {a}" for a in attacks)],
        rows,
        "" if rows else "No run logged `detect/auc`.",
    )


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


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The ASR claims, the retraining-phase convergence with the 4x checks, the tables and the trajectory plot.

    Args:
        records: the claim's ``suite.compare.RunRecord``s (4x runs included: they enter only the checks).
        spec: the claim spec (its convergence rule and tolerance).
        out_dir: folder of the results page (the trajectory plot goes there).
    """
    judged, _ = convergence(records, spec)
    main = main_runs(records)
    notes = [
        "Convergence is judged on each defended run's retraining phase (the first `detect_epochs` validations are "
        "the detection model's); an entry with a 4x run (`<entry>_long`) is settled or overridden by it: paired by "
        "seed on clean test accuracy and, for a defence, two-sided on mean ASR."
    ]
    figures = []
    npzs = sorted(
        (r for r in main if r.name == "badloss" and (Path(r.path) / NPZ).is_file()), key=lambda r: str(r.seed)
    )
    if npzs:
        png = plot_trajectories(Path(npzs[0].path) / NPZ, Path(out_dir) / "badloss_trajectories.png")
        figures.append(Figure(f"Loss trajectories (BaDLoss detection phase, seed {npzs[0].seed})", png))
    else:
        notes.append(
            f"No `{NPZ}` in the BaDLoss run folders (binary, not kept in the results data file): the "
            "trajectory plot is left out."
        )
    return HookResult(
        verdicts=verdicts(records, judged),
        tables=[summary_table(records), asr_table(main), detection_table(main)],
        figures=figures,
        notes=notes,
        convergence=judged,
    )
