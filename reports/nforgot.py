"""Results-page hook of the nforgot claim (``report: reports.nforgot:claim_report``): AP / AF after every task for
N-ForGOT, its ablations and the baselines on both embedded datasets, and one verdict per claim.

A setting tests the claim only when there is forgetting to prevent (:func:`_phenomenon`): finetuning must lose at
least ``MIN_AP_GAP`` AP to joint training and forget at least ``MIN_FORGETTING`` (AF); otherwise every N-ForGOT
verdict of the setting reads ``inconclusive: phenomenon absent``. Single-head (class-incremental) settings are
outside the official protocol (the released code runs multi-head only): their verdicts are listed apart and are
not paper verdicts."""

from __future__ import annotations

import math
import statistics
from typing import Any

from suite.report import ABSENT, UNDERFIT, Verdict, compare, entry_curves, plateau, sizing_spec, verdict_table

DATASETS = {"school2d": "SocioPatterns primary school, 2-d spectral node features (5 tasks x 2 classes, multi-head)",
            "school2d_tgn": "the same on the TGN backbone (2-d features, 5 tasks x 2 classes, multi-head)",
            "school": "SocioPatterns primary school (5 tasks x 2 classes, multi-head)",
            "school_ci": "SocioPatterns primary school (5 tasks x 2 classes, single-head: class-incremental)",
            "school_tgn": "SocioPatterns primary school on the TGN backbone (5 tasks x 2 classes, multi-head)",
            "pubmed": "temporal PubMed (3 tasks x 1 class, single-head)",
            "yelp": "yelp_clear (paper profile, 6 tasks x 2 classes, multi-head)"}  # fmt: skip
SINGLE_HEAD = ("school_ci", "pubmed")  # class-incremental: outside the official (multi-head) protocol
BASELINES = ("finetune", "ewc", "lwf", "replay")
ORDER = ("finetune", "joint", "ewc", "lwf", "replay", "nforgot", "nforgot_no_class", "nforgot_no_disc",
         "nforgot_released", "nforgot_wl", "nforgot_reembed", "nforgot_mmd01")  # fmt: skip


def _vals(records: list[Any], name: str, key: str) -> list[float]:
    return [float(r.metrics[key]) for r in records if r.name == name and key in r.metrics
            and math.isfinite(float(r.metrics[key]))]  # fmt: skip


def _ms(v: list[float]) -> str:
    if not v:
        return "—"
    return f"{statistics.fmean(v):.3f} ± {statistics.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def _converged(records: list[Any], *names: str) -> tuple[bool, str]:
    """Plateau rule on the spec's sizing metric, ``val/acc`` (the current task's validation accuracy, higher is
    better). Not ``val/loss``: a one-class task's validation set (PubMed) has a loss that decays geometrically to 0
    for as long as training runs (the only class's margin keeps growing), so the loss never plateaus there while the
    accuracy is 1 from the first epochs."""
    metric, hib = sizing_spec("nforgot")
    metric = metric or "val/acc"
    notes, ok = [], True
    for n in names:
        curves = entry_curves(records, n, metric)
        if not curves:
            return False, f"{n}: no {metric} curve"
        flat, why = plateau(curves, higher_is_better=hib)
        ok &= flat
        if not flat:
            notes.append(f"{n}: {why}")
    return ok, "; ".join(notes)


MIN_FORGETTING = 0.05  # Finetune's AF below this: there is (almost) no forgetting to prevent
MIN_AP_GAP = 0.15  # Joint's AP minus Finetune's below this: too little lost to forgetting to rank the methods


def _phenomenon(records: list[Any], ds: str) -> str | None:
    """Why setting ``ds`` cannot test a forgetting claim (``None`` when it can): finetuning must lose at least
    ``MIN_AP_GAP`` AP to joint training and forget at least ``MIN_FORGETTING``. A single-head setting is judged by
    the same rule (there, replay-free methods collapse to the newest classes and the gap is large)."""
    ft, joint = _vals(records, f"{ds}_finetune", "test/ap"), _vals(records, f"{ds}_joint", "test/ap")
    ft_af = _vals(records, f"{ds}_finetune", "test/af")
    why = []
    if ft and joint and statistics.fmean(joint) - statistics.fmean(ft) < MIN_AP_GAP:
        why.append(f"finetune loses only {statistics.fmean(joint) - statistics.fmean(ft):.3f} AP to joint "
                   f"(< {MIN_AP_GAP})")  # fmt: skip
    if ft_af and statistics.fmean(ft_af) < MIN_FORGETTING:
        why.append(f"finetune forgets only {_ms(ft_af)} AF (< {MIN_FORGETTING})")
    return "; ".join(why) or None


def _vs(records, ds, a, b, key, hib, claim, ref=None, absent=None):
    """Verdict of entry ``a`` vs ``b`` on ``key``; for AF, ``ref`` (default ``b``) is the entry whose forgetting
    the method should remove: when it forgets less than ``MIN_FORGETTING`` the phenomenon is absent. ``absent``:
    the setting's reason (:func:`_phenomenon`) why no forgetting claim can be judged in it."""
    ma, mb = _vals(records, f"{ds}_{a}", key), _vals(records, f"{ds}_{b}", key)
    if not ma or not mb:
        return None
    conv, why = _converged(records, f"{ds}_{a}", f"{ds}_{b}")
    verdict = compare(ma, mb, higher_is_better=hib, converged=conv)
    ref = ref or b
    ref_af = _vals(records, f"{ds}_{ref}", "test/af")
    if absent:  # no setting-level phenomenon: longer training of these entries would not make the claim testable
        verdict = ABSENT
        claim += f" ({absent})"
    elif key == "test/af" and verdict != UNDERFIT and ref_af and statistics.fmean(ref_af) < MIN_FORGETTING:
        verdict = ABSENT
        claim += f" ({ref} forgets only {_ms(ref_af)} AF < {MIN_FORGETTING})"
    ev = f"{key.split('/')[1].upper()} {a} {_ms(ma)} vs {b} {_ms(mb)} ({len(ma)}/{len(mb)} seeds)"
    if not conv:
        ev += f"; not plateaued: {why}"
    tag = f"{ds}, outside the official protocol" if ds in SINGLE_HEAD else ds
    return Verdict(f"[{tag}] {claim}", verdict, ev)


def _per_task_table(records: list[Any], ds: str) -> list[str]:
    names = [n for n in ORDER if _vals(records, f"{ds}_{n}", "test/ap")]
    if not names:
        return []
    tasks = max(int(max(_vals(records, f"{ds}_{n}", "test/tasks") or [1])) for n in names)
    head = ["entry"] + [f"AP after {i}" for i in range(tasks)] + [f"AF after {i}" for i in range(1, tasks)]
    head += ["BWT", "final acc"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for n in names:
        e = f"{ds}_{n}"
        cells = [_ms(_vals(records, e, f"test/ap_after_{i}")) for i in range(tasks)]
        cells += [_ms(_vals(records, e, f"test/af_after_{i}")) for i in range(1, tasks)]
        cells += [_ms(_vals(records, e, "test/bwt")), _ms(_vals(records, e, "test/acc"))]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    shift = [_ms(_vals(records, f"{ds}_finetune", f"test/wl_shift_{i}")) for i in range(1, tasks)]
    lines += ["", "Temporal-WL shift between consecutive tasks' training subtrees (histogram MMD^2, finetune runs): "
              + ", ".join(f"{i}->{i + 1}: {s}" for i, s in enumerate(shift))]  # fmt: skip
    return lines


def claim_report(records: list[Any], out_dir: Any) -> str:
    """Per-task AP/AF tables per dataset and the verdicts (see ``conf/claim/nforgot.yaml``).

    Args:
        records: ``suite.compare.RunRecord``s of the claim's entries (``<dataset>_<method>``).
        out_dir: folder of the results page (unused).
    """
    verdicts: list[Verdict] = []
    outside: list[Verdict] = []
    out = ["## Per-task results (mean ± std over seeds)", ""]
    for ds, title in DATASETS.items():
        table = _per_task_table(records, ds)
        if not table:
            continue
        out += [f"### {title}", "", *table, ""]
        absent = _phenomenon(records, ds)
        if absent:
            out += [f"No forgetting claim can be judged here: {absent}.", ""]
        mine: list[Verdict] = []
        for key, hib, what in (("test/ap", True, "higher average accuracy (AP)"),
                               ("test/af", False, "lower average forgetting (AF)")):  # fmt: skip
            means = {b: statistics.fmean(v) for b in BASELINES if (v := _vals(records, f"{ds}_{b}", key))}
            if means:
                best = (max if hib else min)(means, key=means.get)
                claim = f"N-ForGOT has {what} than the best baseline"
                v = _vs(records, ds, "nforgot", best, key, hib, claim, ref="finetune", absent=absent)
                if v:
                    mine.append(v)
        for other, key, hib, claim in (
            ("nforgot_released", "test/af", False, "the plug-ins with gradients (paper) forget less than as released"),
            ("nforgot_no_class", "test/af", False, "L_class (inter-class connectivity) reduces forgetting"),
            ("nforgot_no_disc", "test/ap", True, "the discrepancy term raises AP"),
            ("nforgot_mmd01", "test/ap", True, "the default discrepancy weight (mmd_loss 1) beats a 10x smaller one"),
            (
                "nforgot_reembed",
                "test/ap",
                True,
                "the official subtree (neighbour states, no gradient) beats re-embedded neighbours in AP",
            ),
        ):
            v = _vs(records, ds, "nforgot", other, key, hib, claim, absent=absent)
            if v:
                mine.append(v)
        v = _vs(records, ds, "nforgot_wl", "nforgot", "test/ap", True,
                "the temporal-WL kernel discrepancy beats the released linear-time MMD", absent=absent)  # fmt: skip
        if v:
            mine.append(v)
        joint = _vals(records, f"{ds}_joint", "test/ap")
        ft = _vals(records, f"{ds}_finetune", "test/ap")
        if joint and ft:
            mine.append(Verdict(f"[{ds}] sanity: Joint (upper bound) beats Finetune (lower bound) in AP",
                                compare(joint, ft, higher_is_better=True),
                                f"AP joint {_ms(joint)} vs finetune {_ms(ft)}"))  # fmt: skip
        (outside if ds in SINGLE_HEAD else verdicts).extend(mine)
    if not verdicts and not outside:
        return "\n".join([*out, "## Verdicts", "", "No pair of finished entries: nothing to compare."])
    out += ["## Verdicts", ""]
    out += [verdict_table(verdicts), ""] if verdicts else ["No multi-head setting has finished entries.", ""]
    if outside:
        note = (
            "The released code runs multi-head only; without replay every method collapses to the newest task's "
            "classes here. These rows are the suite's own, not paper verdicts."
        )
        out += ["## Outside the official protocol (single-head, class-incremental)", "", note, ""]
        out.append(verdict_table(outside))
    return "\n".join(out)
