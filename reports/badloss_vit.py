"""Results-page hook of the cross-paper study ``badloss_vit`` (issue 50 item 5): does BaDLoss's loss-dynamics backdoor
detection carry over from the CNN to a vision transformer?

Used as ``report: reports.badloss_vit:claim_report`` in ``conf/claim/badloss_vit.yaml``. Each run trains one
classifier on the same poisoned Fashion-MNIST (entry ``cnn``: the BaDLoss CNN, plain training; entry ``vit``: the MDA
subject ViT) while :class:`callbacks.loss_dynamics.LossDynamics` records every training example's loss after each
epoch and writes ``loss_dynamics.pt`` with the datamodule's ``poison_attack``, ``probe_kind``, ``default_train_rows``,
``num_original`` and ``attack_names`` (``save_attrs``). The hook scores both matrices with the *same* detector, the
functions :class:`lightning_modules.badloss.BadlossLitModule` itself calls at detection time:
:func:`~lightning_modules.badloss.scoring.badloss_scores` (epoch filter, Eq. (1) mean distance to the ``k = 50``
nearest clean-probe trajectories, ``log(0.01 + d)``, min-max) over :func:`~lightning_modules.badloss.scoring.
scored_mask`'s rows, and :func:`~lightning_modules.badloss.scoring.detection_aucs`: the suite's and the paper's AUC
convention, ``detect/auc`` (all poisons vs clean) and per attack that attack's poisons vs the clean originals.

Pre-registered verdicts (stated before the runs; AUCs are per seed, mean ± std over the seeds):

1. *Reference, per attack: BaDLoss detects the attack's poisons on the CNN*: mean AUC at least :data:`DETECTS`
   (0.9; the study's bar for "detects", not a number from the paper): ``reproduced`` when ``mean - 2 s.e. >= 0.9``,
   ``not reproduced`` when ``mean + 2 s.e. < 0.9``, else ``inconclusive: within noise``.
2. *Carry-over, per attack: the ViT's detection AUC is no worse than the CNN's by more than* :data:`MARGIN`
   (0.05 AUC): :func:`suite.report.non_inferior` (two standard errors of the difference of means). ``inconclusive:
   phenomenon absent`` when the CNN does not detect the attack at all (mean AUC below :data:`CNN_MIN`, 0.7): there
   is nothing to carry over.
3. *Carry-over, all attacks pooled* (``detect/auc``): as 2.

A verdict reads ``inconclusive: underfit`` when an entry it reads (1: the CNN; 2-3: both) has a clean test accuracy
below :data:`MIN_ACC` (0.5) or, by the suite's sizing rule, a ``val/loss`` that has not plateaued (the page's sizing
section). The verdicts judge the
detection of the poisoned *training* examples, whatever the attack's success on the test set; the page shows the ASR
and the loss of each group at the first and last recorded epoch as context (a poison can be flagged because it is
learned faster than clean data, a learned backdoor, or because it is not learned at all, a mislabelled example).
An AUC near 0.5 or below, or a near-constant score, is checked before it is believed: the page lists, per
architecture, the score spread and the clean probes' mean score against the clean originals'.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from lightning_modules.badloss import scoring
from suite import report as rep

DETECTS = 0.9  # verdict 1: "detects" = AUC at least this
MARGIN = 0.05  # verdicts 2-3: the ViT may lose at most this much AUC to the CNN (non-inferiority margin)
CNN_MIN = 0.7  # verdicts 2-3: below this the CNN does not detect the attack: nothing to carry over
MIN_ACC = 0.5  # a 10-class classifier below this clean top-1 is underfit for the question
K, EPS = 50, 0.01  # the BaDLoss defaults (conf/model/badloss.yaml): kNN neighbours, log offset


def detect_run(path: Path, k: int = K, eps: float = EPS) -> dict[str, Any] | None:
    """Score one run's ``loss_dynamics.pt`` with the BaDLoss detector: ``detect/auc*``, the per-group losses at the
    first and last recorded epoch (``loss0/<group>``, ``loss1/<group>``), the score spread and the probes' mean
    score; ``None`` without the file."""
    files = sorted(Path(path).rglob("loss_dynamics.pt"))
    if not files:
        return None
    state = torch.load(files[-1], map_location="cpu", weights_only=True)
    traj, data = state["values"].double(), state["data"]
    kind, attack = torch.as_tensor(data["probe_kind"]), torch.as_tensor(data["poison_attack"])
    names, n = list(data["attack_names"]), int(data["num_original"])
    score, epochs = scoring.badloss_scores(traj, kind == 1, k, eps)
    rows = scoring.scored_mask(n, torch.as_tensor(data["default_train_rows"]))
    s, a = score[:n][rows], attack[:n][rows]
    out: dict[str, Any] = dict(scoring.detection_aucs(s, a, names))
    out["epochs"], out["kept_epochs"] = traj.shape[1], len(epochs)
    out["score_std"] = float(s.std())
    out["probe_score"], out["clean_score"] = float(score[kind == 1].mean()), float(s[a < 0].mean())
    t = traj[:n][rows]
    groups = {"clean": a < 0, **{name: a == i for i, name in enumerate(names)}}
    for g, m in groups.items():
        if m.any():
            out[f"loss0/{g}"], out[f"loss1/{g}"] = float(t[m, 0].mean()), float(t[m, -1].mean())
    out["attacks"] = names
    return out


def collect(records: list[Any]) -> dict[str, dict[str, list[float]]]:
    """``arch -> key -> values over seeds``: :func:`detect_run`'s numbers plus ``test/acc`` and ``test/asr_*``."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in sorted(records, key=lambda r: (r.name, r.seed if r.seed is not None else 0)):
        d = out[rec.name]
        det = detect_run(Path(rec.path))
        if det is None:
            continue
        for key, v in det.items():
            if key == "attacks":
                d["attacks"] = v
            elif isinstance(v, (int, float)) and math.isfinite(v):  # an empty class gives a NaN AUC: left out
                d[key].append(float(v))
        for key, v in (rec.metrics or {}).items():
            if key == "test/acc" or key.startswith("test/asr_"):
                d[key].append(float(v))
    return out


def _ms(v: list[float], digits: int = 3) -> str:
    if not v:
        return "-"
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.fmean(v):.{digits}f} ± {sd:.{digits}f}"


def _detects(v: list[float]) -> str:
    m = statistics.fmean(v)
    se = rep.std_error(v) if len(v) > 1 else 0.0
    if m - 2 * se >= DETECTS:
        return rep.REPRODUCED
    if m + 2 * se < DETECTS:
        return rep.NOT_REPRODUCED
    return rep.NOISE


def verdicts(data: dict[str, dict[str, list[float]]], converged: dict[str, bool] | None = None) -> list[rep.Verdict]:
    """The pre-registered verdicts (module docstring) from :func:`collect`'s table; ``converged`` (entry ->
    plateaued, the page's sizing rule) makes every verdict ``inconclusive: underfit`` when an entry has not."""
    cnn, vit = data.get("cnn"), data.get("vit")
    if not cnn or not vit or not cnn.get("detect/auc") or not vit.get("detect/auc"):
        return []
    unfit = [a for a in ("cnn", "vit") if statistics.fmean(data[a].get("test/acc") or [0.0]) < MIN_ACC]
    unfit += [a for a in ("cnn", "vit") if not (converged or {}).get(a, True) and a not in unfit]
    why = f" (underfit: {', '.join(unfit)})" if unfit else ""
    out: list[rep.Verdict] = []
    attacks = list(cnn.get("attacks") or [])
    for a in attacks:
        c = cnn.get(f"detect/auc_{a}", [])
        if c:
            word = rep.UNDERFIT if "cnn" in unfit else _detects(c)
            out.append(rep.Verdict(
                f"Reference: BaDLoss detects the {a} poisons on the CNN (AUC >= {DETECTS})", word,
                f"CNN AUC {_ms(c)}" + (" (underfit: cnn)" if "cnn" in unfit else ""), against=()))  # fmt: skip
    for key, what in [*((f"detect/auc_{a}", f"the {a} poisons") for a in attacks), ("detect/auc", "all poisons")]:
        c, v = cnn.get(key, []), vit.get(key, [])
        if not c or not v:
            continue
        if unfit:
            word = rep.UNDERFIT
        elif statistics.fmean(c) < CNN_MIN:
            word = rep.ABSENT
        else:
            word = rep.non_inferior(v, c, margin=MARGIN, higher_is_better=True)
        ev = f"AUC ViT {_ms(v)} vs CNN {_ms(c)}; difference {statistics.fmean(v) - statistics.fmean(c):+.3f}"
        if statistics.fmean(c) < CNN_MIN:
            ev += f"; the CNN does not detect them (AUC < {CNN_MIN})"
        out.append(rep.Verdict(
            f"BaDLoss's detection of {what} carries over to the ViT (AUC no worse than the CNN's by more than "
            f"{MARGIN})", word, ev + why, against=()))  # fmt: skip
    return out


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    """Markdown appended to ``docs/results/badloss_vit.md`` (see module docstring)."""
    data = collect(records)
    metric, hib = rep.sizing_spec(spec or "badloss_vit")
    converged = {k: v[0] for k, v in rep.sizing(records, metric or "val/loss", higher_is_better=hib).items()}
    archs = [a for a in ("cnn", "vit") if data.get(a, {}).get("detect/auc")]
    if not archs:
        return "No runs with `loss_dynamics.pt` found."
    attacks = list(data[archs[0]].get("attacks") or [])
    lines = [
        f"## Detection AUC per attack (BaDLoss one-class kNN, k = {K}, on each model's own loss trajectories; "
        "mean ± std over seeds)",
        "",
        "| architecture | seeds | AUC (all) | " + " | ".join(f"AUC {a}" for a in attacks) + " |",
        "|---|---|---|" + "---|" * len(attacks),
    ]
    for arch in archs:
        d = data[arch]
        cells = [_ms(d.get(f"detect/auc_{a}", [])) for a in attacks]
        lines.append(f"| {arch} | {len(d['detect/auc'])} | {_ms(d['detect/auc'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Context: clean accuracy, attack success and the loss of each group (mean over seeds)",
        "",
        "Attack success rate (ASR, %) on the triggered non-target test images; mean training loss of the clean "
        "originals and of each attack's poisons at the first and the last recorded epoch (`first -> last`).",
        "",
        "| architecture | clean acc % | "
        + " | ".join(f"ASR {a}" for a in attacks)
        + " | loss clean | "
        + " | ".join(f"loss {a}" for a in attacks)
        + " |",
        "|---|---|" + "---|" * (2 * len(attacks) + 1),
    ]
    for arch in archs:
        d = data[arch]

        def pct(key: str, d: dict = d) -> str:
            return f"{100 * statistics.fmean(d[key]):.1f}" if d.get(key) else "-"

        def loss(g: str, d: dict = d) -> str:
            a, b = d.get(f"loss0/{g}"), d.get(f"loss1/{g}")
            return f"{statistics.fmean(a):.2f} -> {statistics.fmean(b):.2f}" if a and b else "-"

        lines.append(
            f"| {arch} | {pct('test/acc')} | "
            + " | ".join(pct(f"test/asr_{a}") for a in attacks)
            + f" | {loss('clean')} | "
            + " | ".join(loss(a) for a in attacks)
            + " |"
        )
    lines += [
        "",
        "## Checks of the score (a near-constant score or a probe set that is not the clean reference is a bug)",
        "",
        "| architecture | recorded epochs (kept by the filter) | score std over scored rows | mean score: clean probes "
        "| mean score: clean originals |",
        "|---|---|---|---|---|",
    ]
    for arch in archs:
        d = data[arch]
        lines.append(
            f"| {arch} | {statistics.fmean(d['epochs']):.0f} ({_ms(d['kept_epochs'], 1)}) | {_ms(d['score_std'])} | "
            f"{_ms(d['probe_score'])} | {_ms(d['clean_score'])} |"
        )
    lines += [
        "",
        "## Verdicts (pre-registered in `reports/badloss_vit.py`)",
        "",
        rep.verdict_table(verdicts(data, converged)),
    ]
    return "\n".join(lines)
