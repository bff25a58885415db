"""The ADDP results hook computes its verdicts from the numbers: synthetic records with a known answer."""

from __future__ import annotations

from pathlib import Path

from reports.addp import claim_report
from suite.compare import RunRecord


def _rec(name: str, seed: int, metrics: dict, val: list[float], key: str) -> RunRecord:
    return RunRecord(Path("."), name, seed, metrics, {key: list(enumerate(val))})


def test_verdicts_follow_the_numbers(tmp_path: Path):
    recs = []
    for s in range(3):
        e = 0.001 * s
        curve = {f"test/curve/iou/step{k}": v + e for k, v in enumerate([0, 0.6, 0.62, 0.6, 0.5, 0.45])}
        flat = [0.3, 0.5, 0.6, 0.6 + e, 0.6 + e, 0.6 + e]
        recs.append(_rec("ref_vanilla", s, {"test/iou": 0.45 + e, "test/iou_round1": 0.45 + e,
                                            "test/iou_round2": 0.5 + e, "test/iou_round3": 0.6 + e,
                                            "test/iou_restart2": 0.5 + 2 * e, "test/iou_restart3": 0.5 + e, **curve},
                         flat, "val/iou"))  # fmt: skip
        recs.append(_rec("ref_aug", s, {"test/iou": 0.55 + e}, flat, "val/iou"))
        recs.append(_rec("ref_contrib", s, {"test/iou": 0.30 + e}, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "val/iou"))
    page = claim_report(recs, tmp_path)
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in page.splitlines() if "| ref" in line
            or "| correctional" in line}  # fmt: skip
    get = lambda frag: next(v for k, v in rows.items() if frag in k)  # noqa: E731
    assert get("early half") == "**reproduced**"  # gain 0.62 in steps 1-2 vs -0.17 after
    assert get("drops at the late") == "**reproduced**"
    assert get("drift-simulating") == "**reproduced**"
    assert get("contribution-aware") == "**inconclusive: underfit**"  # its val curve still climbs
    assert get("round 3") == "**reproduced**"  # 0.6 vs its restart control 0.5 on every seed
    assert get("round 2") == "**inconclusive: within noise**"  # round 2 = what the restart alone does
    assert (tmp_path / "addp_x0_curves.png").exists()


def test_paired_seeds_and_a_curve_best_at_the_last_step(tmp_path: Path):
    """Per-seed differences are tested against 0: a drop that every seed shows is reproduced although the seeds'
    levels spread widely; a seed-mean curve best at its last step is `not reproduced`, never `within noise`."""
    flat = [0.3, 0.5, 0.6, 0.6, 0.6, 0.6]
    drops, rises = [], []
    for s in range(3):
        lvl = 0.2 * s  # the seeds' levels differ far more than the drop
        drop = [0, 0.3 + lvl, 0.35 + lvl, 0.34 + lvl, 0.33 + lvl, 0.32 + lvl]
        rise = [0, 0.3 + lvl, 0.31 + lvl, 0.32 + lvl, 0.33 + lvl, 0.34 + lvl + 0.001 * s]
        for out, c in ((drops, drop), (rises, rise)):
            curve = {f"test/curve/iou/step{k}": v for k, v in enumerate(c)}
            out.append(_rec("ref_vanilla", s, {"test/iou": c[-1], **curve}, flat, "val/iou"))
    for recs, want in ((drops, "**reproduced**"), (rises, "**not reproduced**")):
        page = claim_report(recs, tmp_path)
        row = next(line for line in page.splitlines() if "drops at the late" in line)
        assert row.split("|")[2].strip() == want, row


def test_a_failed_4x_check_makes_the_comparisons_underfit_and_is_inherited(tmp_path: Path):
    """The cosine decay flattens every validation curve: an entry whose 4x run (seed 0) still gains more than its
    seed spread is underfit although its curve plateaued, and so is a variant without a 4x run of its own; a 4x run
    within the spread leaves the verdicts as the plateau rule gave them."""
    flat = [0.3, 0.5, 0.6, 0.6, 0.6, 0.6]

    def records(long_gain: float) -> list[RunRecord]:
        recs = []
        for s in range(3):
            e = 0.01 * s  # seed spread of test/iou: 0.01
            recs.append(_rec("ref_vanilla", s, {"test/iou": 0.50 + e}, flat, "val/iou"))
            recs.append(_rec("ref_both", s, {"test/iou": 0.70 + e}, flat, "val/iou"))
            recs.append(_rec("ref_contrib", s, {"test/iou": 0.65 + e}, flat, "val/iou"))
        recs.append(_rec("ref_vanilla_long", 0, {"test/iou": 0.50 + long_gain}, flat, "val/iou"))
        recs.append(_rec("ref_both_long", 0, {"test/iou": 0.70}, flat, "val/iou"))
        return recs

    def rows(page: str) -> dict[str, str]:
        return {ln.split("|")[1].strip(): ln.split("|")[2].strip() + ln.split("|")[3] for ln in page.splitlines()
                if ln.startswith("| ref: ")}  # fmt: skip

    cooled = rows(claim_report(records(0.05), tmp_path))
    both = next(v for k, v in cooled.items() if k.startswith("ref: both beats"))
    contrib = next(v for k, v in cooled.items() if k.startswith("ref: contribution-aware"))
    assert both.startswith("**inconclusive: underfit**") and "ref_vanilla: not converged" in both
    assert contrib.startswith("**inconclusive: underfit**")
    assert "ref_contrib: ref_vanilla's 4x check: not converged" in contrib  # inherited, though its curve is flat
    done = claim_report(records(0.005), tmp_path)
    assert "* `ref_vanilla`: converged: the longer run (ref_vanilla_long) improves test/iou by 0.005" in done
    both = next(v for k, v in rows(done).items() if k.startswith("ref: both beats"))
    contrib = next(v for k, v in rows(done).items() if k.startswith("ref: contribution-aware"))
    assert both.startswith("**reproduced**") and "ref_both: plateaued; 4x check converged" in both
    assert contrib.startswith("**reproduced**") and "inherits the passed 4x check of ref_vanilla, ref_both" in contrib
