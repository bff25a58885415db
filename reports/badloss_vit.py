"""Results-page hook of the cross-paper study ``badloss_vit``: does BaDLoss's loss-dynamics backdoor detection
(ICLR 2025) carry over from the CNN to a vision transformer?

Used as ``report: reports.badloss_vit:claim_report`` in ``conf/claim/badloss_vit.yaml``. Each run trains one
classifier on the same poisoned Fashion-MNIST (entry ``cnn``: the BaDLoss CNN, plain training; entry ``vit``: the MDA
subject ViT) while :class:`callbacks.loss_dynamics.LossDynamics` records every training example's loss after each
epoch and writes ``loss_dynamics.pt`` with the datamodule's ``poison_attack``, ``probe_kind``, ``default_train_rows``,
``num_original`` and ``attack_names`` (``save_attrs``). The hook scores both matrices with the *same* detector, the
functions :class:`lightning_modules.badloss.BadlossLitModule` itself calls at detection time:
:func:`~lightning_modules.badloss.scoring.badloss_scores` (epoch filter, Eq. (1) mean distance to the ``k = 50``
nearest clean-probe trajectories, ``log(0.01 + d)``, min-max) over :func:`~lightning_modules.badloss.scoring.
scored_mask`'s rows, and :func:`~lightning_modules.badloss.scoring.detection_aucs`: ``detect/auc`` (all poisons vs
clean) and per attack that attack's poisons vs the clean originals. Each run's numbers are kept in
``badloss_vit_detect.json`` beside it (a ``data_files`` entry of the spec), so the page rebuilds from the results data
file where the binary matrix is not kept.

The claims (pre-registered before the runs) read AUCs the hook computes, not run metrics, so the hook builds them;
all are paired by seed (seed ``s`` of both entries trains on the same poisoned subset with the same probes):

1. ``cnn_detects_<attack>``: BaDLoss detects the attack's poisons on the CNN: its AUC above :data:`DETECTS` (0.9;
   the study's bar for "detects", not a number from the paper), the per-seed AUC against the bar.
2. ``carry_<attack>``: the ViT's detection AUC is no worse than the CNN's by more than :data:`MARGIN` (0.05 AUC;
   non-inferiority). ``inconclusive: phenomenon absent`` when the CNN does not detect the attack at all (mean AUC
   below :data:`CNN_MIN`, 0.7): there is nothing to carry over.
3. ``carry_detected``: as 2 on the poisons of the attacks the CNN detects, pooled (primary: the study's headline).
   "Detects" is the rule that makes a claim of 2 ``phenomenon absent``: the CNN's mean AUC over seeds at least
   :data:`CNN_MIN`; it reads the CNN alone, never the ViT. An attack the CNN cannot detect has nothing to carry over,
   and pooling it in would let the ViT's detection of it (or its failure) decide the headline. The pooled AUC of a set
   of attacks is computed exactly from the per-attack AUCs: every attack's AUC compares its poisons with the same
   clean originals, so the Mann-Whitney count over the pooled poisons is the sum of the attacks' counts, and the
   pooled AUC is their average weighted by the number of scored poisons (:func:`pooled_auc`).
4. ``carry_all``: as 3 on all attacks pooled (``detect/auc``), exploratory.

A claim reads ``inconclusive: underfit`` when an entry it reads (1: the CNN; 2-3: both) has a clean test accuracy
below :data:`MIN_ACC` (0.5) or has not converged by the spec's rule (``val/loss``). The claims judge the detection of
the poisoned *training* examples, whatever the attack's success on the test set; the page shows the ASR and the loss
of each group at the first and last recorded epoch as context (a poison can be flagged because it is learned faster
than clean data, a learned backdoor, or because it is not learned at all, a mislabelled example). An AUC near 0.5 or
below, or a near-constant score, is checked before it is believed: the page lists, per architecture, the score spread
and the clean probes' mean score against the clean originals'.

Trigger overlap (:data:`OVERLAP`): on 28x28 images with one-pixel squares (``datamodules.poisoned``, the official
layout) the ``patch`` trigger's four squares and the ``single_pix`` square share the pixel (26, 26), with different
target labels, and with the ViT's 4x4 patches all of them fall in one token (6, 6). The page says so beside the
per-attack AUCs: a model that cannot tell the two triggers apart learns neither backdoor cleanly, and a poison that
is not learned is flagged as a mislabelled example rather than as a backdoor.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from lightning_modules.badloss import scoring
from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, judge_values
from suite.report import mean_sd

DETECTS = 0.9  # claim 1: "detects" = AUC above this
MARGIN = 0.05  # claims 2-3: the ViT may lose at most this much AUC to the CNN (non-inferiority margin)
CNN_MIN = 0.7  # claims 2-3: below this the CNN does not detect the attack: nothing to carry over
CACHE = "badloss_vit_detect.json"  # a run's detection numbers, kept in the results data file (spec: data_files)
OVERLAP = (
    "The `patch` and `single_pix` triggers overlap (the official layout on 28x28 images): the patch's four one-pixel "
    "squares sit at (24|26, 24|26) and the single pixel at (26, 26), with different target labels; with the ViT's 4x4 "
    "patches both triggers fall in one token, (6, 6). A model that cannot separate them learns neither backdoor "
    "cleanly (see the ASR row), and a poison it does not learn is flagged as a mislabelled example, not as a learned "
    "backdoor: an AUC of the ViT on these two attacks reads its failure to learn them as much as the detector."
)
MIN_ACC = 0.5  # a 10-class classifier below this clean top-1 is underfit for the question
K, EPS = 50, 0.01  # the BaDLoss defaults (conf/model/badloss.yaml): kNN neighbours, log offset


def detect_run(path: Path, k: int = K, eps: float = EPS) -> dict[str, Any] | None:
    """Score one run's ``loss_dynamics.pt`` with the BaDLoss detector: ``detect/auc*``, the per-group losses at the
    first and last recorded epoch (``loss0/<group>``, ``loss1/<group>``), the score spread and the probes' mean
    score; ``None`` without the file."""
    files = sorted(Path(path).rglob("loss_dynamics.pt"))
    if not files:
        return None
    return _score(files[-1], k, eps)


def detection(path: Path) -> dict[str, Any] | None:
    """A run's detection numbers: scored from its ``loss_dynamics.pt`` where the run folder holds one (and kept in
    :data:`CACHE` beside it for the results data file), else read from :data:`CACHE` (a page rebuilt from the data
    file, where the binary matrix is not kept); ``None`` without either."""
    out = detect_run(path)
    cache = Path(path) / CACHE
    if out is not None:
        with contextlib.suppress(OSError):  # a read-only run folder: the page is right, the data file lacks them
            cache.write_text(json.dumps(out))
        return out
    return json.loads(cache.read_text()) if cache.is_file() else None


def _score(file: Path, k: int, eps: float) -> dict[str, Any]:
    state = torch.load(file, map_location="cpu", weights_only=True)
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
    for i, name in enumerate(names):  # the scored poisons of each attack: the weights of a pooled AUC
        out[f"n/{name}"] = int((a == i).sum())
    out["attacks"] = names
    return out


def pooled_auc(aucs: dict[str, float], counts: dict[str, int]) -> float:
    """AUC of the pooled poisons of the attacks in ``aucs`` (name -> that attack's AUC against the clean originals)
    against the clean originals: the attacks' AUCs weighted by their numbers of scored poisons (``counts``). Exact,
    ties included, because every per-attack AUC counts pairs with the same clean set; NaN when no poison is counted."""
    total = sum(counts[a] for a in aucs)
    return sum(counts[a] * aucs[a] for a in aucs) / total if total else math.nan


Data = dict[str, dict[str, Any]]


def collect(records: list[Any]) -> Data:
    """``arch -> key -> {seed: value}``: :func:`detection`'s numbers plus ``test/acc`` and ``test/asr_*`` (and
    ``attacks``: the attack names)."""
    out: Data = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        det = detection(Path(rec.path))
        if det is None:
            continue
        d, seed = out[rec.name], str(rec.seed)
        for key, v in det.items():
            if key == "attacks":
                d["attacks"] = list(v)
            elif isinstance(v, int | float) and math.isfinite(v):  # an empty class gives a NaN AUC: left out
                d[key][seed] = v if key.startswith("n/") else float(v)
        for key, v in (rec.metrics or {}).items():
            if (key == "test/acc" or key.startswith("test/asr_")) and math.isfinite(float(v)):
                d[key][seed] = float(v)
    return out


def _mean(values: dict[str, float]) -> float:
    return statistics.fmean(values.values()) if values else math.nan


def verdicts(data: Data, convergence: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """The pre-registered claims (module docstring) from :func:`collect`'s table; ``convergence``: entry ->
    ``(converged, reading)`` by the spec's rule."""
    cnn, vit = data.get("cnn"), data.get("vit")
    if not cnn or not vit or not cnn.get("detect/auc") or not vit.get("detect/auc"):
        return []
    attacks = list(cnn.get("attacks") or [])
    detected = [a for a in attacks if cnn.get(f"detect/auc_{a}") and _mean(cnn[f"detect/auc_{a}"]) >= CNN_MIN]
    for d in (cnn, vit):  # the pooled AUC over the attacks the CNN detects, per seed (needs each run's counts)
        seeds = (
            set.intersection(*(set(d.get(f"detect/auc_{a}", {})) & set(d.get(f"n/{a}", {})) for a in detected))
            if detected
            else set()
        )
        d["detect/auc_detected"] = {
            s: pooled_auc({a: d[f"detect/auc_{a}"][s] for a in detected}, {a: d[f"n/{a}"][s] for a in detected})
            for s in sorted(seeds)
        }
    unfit = {}
    for arch in ("cnn", "vit"):
        acc = data[arch].get("test/acc") or {}
        ok, why = convergence.get(arch, (True, ""))
        if not ok:
            unfit[arch] = why
        elif _mean(acc) < MIN_ACC or not acc:
            unfit[arch] = f"clean test accuracy {mean_sd(acc.values())} below {MIN_ACC}"
    out = []
    for a in attacks:
        c = cnn.get(f"detect/auc_{a}", {})
        if c:
            text = f"Reference: BaDLoss detects the {a} poisons on the CNN (AUC > {DETECTS})"
            claim = Claim(
                f"cnn_detects_{a}",
                text,
                f"detect/auc_{a}",
                (f"cnn: AUC {a}", "the bar"),
                True,
                delta_why="the bar is the claim",
                paired=True,
            )
            bar = dict.fromkeys(c, DETECTS)  # the per-seed AUC against the bar: a one-sample interval
            under = {k: v for k, v in unfit.items() if k == "cnn"}
            out.append(judge_values(claim, c, bar, paired=True, unconverged=under))
    names = ", ".join(detected) or "none"
    pooled = [
        ("detect/auc_detected", "carry_detected", f"the pooled poisons of the attacks the CNN detects ({names})"),
        ("detect/auc", "carry_all", "the pooled poisons of all attacks"),
    ]
    for key, cid, what in [*((f"detect/auc_{a}", f"carry_{a}", f"the {a} poisons") for a in attacks), *pooled]:
        c, v = cnn.get(key, {}), vit.get(key, {})
        if (not c or not v) and (cid != "carry_detected" or detected):  # nothing detected: the headline is absent
            continue
        claim = Claim(
            cid,
            f"BaDLoss's detection of {what} carries over to the ViT (AUC no worse than the CNN's by more than "
            f"{MARGIN})",
            key,
            ("vit", "cnn"),
            True,
            kind="non_inferior",
            delta=MARGIN,
            delta_why="the study's non-inferiority margin, stated before the runs",
            primary=cid == "carry_detected",
            paired=True,
        )
        if cid == "carry_detected":
            absent = None if detected else f"the CNN detects none of the attacks (mean AUC >= {CNN_MIN})"
        else:
            absent = (
                f"the CNN does not detect them (mean AUC {_mean(c):.3f} < {CNN_MIN})" if _mean(c) < CNN_MIN else None
            )
        out.append(judge_values(claim, v, c, paired=True, unconverged=unfit, absent=absent))
    for r in out:
        r.against = ()  # the entries are the two architectures, not baselines of a method
    return out


def tables(data: Data, archs: list[str]) -> list[Table]:
    """Detection AUC per attack; clean accuracy, ASR and each group's loss; checks of the score."""
    attacks = list(data[archs[0]].get("attacks") or [])
    keys = ["detect/auc", *(f"detect/auc_{a}" for a in attacks)]
    rows = [
        [arch, len(data[arch]["detect/auc"]), *(mean_sd(data[arch].get(k, {}).values()) for k in keys)]
        for arch in archs
    ]
    auc = Table(
        f"Detection AUC per attack (BaDLoss one-class kNN, k = {K}, on each model's own loss trajectories)",
        ["architecture", "seeds", "AUC (all)", *(f"AUC {a}" for a in attacks)],
        rows,
    )

    def pct(d: dict, key: str) -> str:
        return f"{100 * _mean(d[key]):.1f}" if d.get(key) else "-"

    def loss(d: dict, g: str) -> str:
        a, b = d.get(f"loss0/{g}"), d.get(f"loss1/{g}")
        return f"{_mean(a):.2f} -> {_mean(b):.2f}" if a and b else "-"

    rows = [
        [
            arch,
            pct(data[arch], "test/acc"),
            *(pct(data[arch], f"test/asr_{a}") for a in attacks),
            loss(data[arch], "clean"),
            *(loss(data[arch], a) for a in attacks),
        ]
        for arch in archs
    ]
    context = Table(
        "Context: clean accuracy, attack success and the loss of each group (mean over seeds)",
        ["architecture", "clean acc %", *(f"ASR {a}" for a in attacks), "loss clean", *(f"loss {a}" for a in attacks)],
        rows,
        "Attack success rate (ASR, %) on the triggered non-target test images; mean training loss of the clean "
        "originals and of each attack's poisons at the first and the last recorded epoch (`first -> last`).",
    )
    rows = [
        [
            arch,
            f"{_mean(data[arch]['epochs']):.0f} ({mean_sd(data[arch]['kept_epochs'].values())})",
            *(mean_sd(data[arch][k].values()) for k in ("score_std", "probe_score", "clean_score")),
        ]
        for arch in archs
    ]
    checks = Table(
        "Checks of the score (a near-constant score or a probe set that is not the clean reference is a bug)",
        [
            "architecture",
            "recorded epochs (kept by the filter)",
            "score std over scored rows",
            "mean score: clean probes",
            "mean score: clean originals",
        ],
        rows,
    )
    return [auc, context, checks]


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The pre-registered verdicts and the three tables (see the module docstring).

    Args:
        records: the study's ``suite.compare.RunRecord``s (entries ``cnn`` and ``vit``).
        spec: the claim spec (its convergence rule judges both entries).
        out_dir: folder of the results page (unused).
    """
    data = collect(records)
    archs = [a for a in ("cnn", "vit") if data.get(a, {}).get("detect/auc")]
    if not archs:
        return HookResult(notes=[f"No run with `loss_dynamics.pt` or `{CACHE}` found: no detection to judge."])
    notes = [OVERLAP] if {"patch", "single_pix"} <= set(data[archs[0]].get("attacks") or []) else []
    return HookResult(verdicts=verdicts(data, spec.convergence(records)), tables=tables(data, archs), notes=notes)
