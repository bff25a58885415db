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
    seed spread is underfit although its curve plateaued, and so is a variant without a 4x run of its own; a passed
    4x check never rescues a curve that is still rising; a 4x run within the spread leaves the plateau rule's
    answer."""
    flat, rising = [0.3, 0.5, 0.6, 0.6, 0.6, 0.6], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]

    def records(gain: dict[str, float], both_curve: list[float] = flat) -> list:
        recs = []
        for s in range(3):
            e = 0.01 * s  # seed spread of test/iou: 0.01
            for name, level in (("ref_vanilla", 0.50), ("ref_both", 0.70), ("ref_contrib", 0.65), ("ref_disc", 0.6)):
                recs.append(_rec(name, s, {"test/iou": level + e}, both_curve if name == "ref_both" else flat,
                                 "val/iou"))  # fmt: skip
        base = {"ref_vanilla": 0.50, "ref_both": 0.70}
        recs += [_rec(f"{n}_long", 0, {"test/iou": base[n] + g}, flat, "val/iou") for n, g in gain.items()]
        return recs

    def row(page: str, start: str) -> str:
        line = next(ln for ln in page.splitlines() if ln.startswith(f"| ref: {start}"))
        return line.split("|")[2].strip() + line.split("|")[3]

    # vanilla still gains 0.05 at 4x (> 0.01): every comparison with vanilla and the inheritors are underfit
    cooled = claim_report(records({"ref_vanilla": 0.05, "ref_both": 0.0}), tmp_path)
    assert row(cooled, "both beats").startswith("**inconclusive: underfit**")
    assert "ref_vanilla: not converged" in row(cooled, "both beats")
    assert "ref_contrib: ref_vanilla's 4x check: not converged" in row(cooled, "contribution-aware")
    # ... but both's own passed check keeps "both vs the discriminative network" tested
    assert row(cooled, "aligned diffusion").startswith("**reproduced**")
    # both still gains at 4x while vanilla's check passes: contrib inherits both's failure (its row has vanilla,
    # which converged, so only the inheritance makes it underfit)
    both_cools = claim_report(records({"ref_vanilla": 0.0, "ref_both": 0.05}), tmp_path)
    contrib = row(both_cools, "contribution-aware")
    assert contrib.startswith("**inconclusive: underfit**") and "ref_contrib: ref_both's 4x check" in contrib
    # both without a 4x run of its own inherits vanilla's failure: both vs disc is no longer tested
    no_own = claim_report(records({"ref_vanilla": 0.05}), tmp_path)
    disc = row(no_own, "aligned diffusion")
    assert disc.startswith("**inconclusive: underfit**") and "ref_both: ref_vanilla's 4x check" in disc
    # a passed check does not rescue a curve still rising
    rises = claim_report(records({"ref_vanilla": 0.0, "ref_both": 0.0}, both_curve=rising), tmp_path)
    both = row(rises, "both beats")
    assert both.startswith("**inconclusive: underfit**") and "ref_both: still improving" in both
    # every check within the spread: the verdicts stand, and the readings are listed under the table
    done = claim_report(records({"ref_vanilla": 0.005, "ref_both": 0.0}), tmp_path)
    assert "* `ref_vanilla`: converged: the longer run (ref_vanilla_long) improves test/iou by 0.005" in done
    assert "no 4x runs for depth" in done
    both, contrib = row(done, "both beats"), row(done, "contribution-aware")
    assert both.startswith("**reproduced**") and "ref_both: plateaued, 4x check passed" in both
    assert contrib.startswith("**reproduced**")
    assert "inherits the passed 4x check of ref_vanilla and ref_both" in contrib


def test_the_depth_4x_check_reads_absrel_as_lower_is_better(tmp_path: Path):
    flat = [0.05, 0.03, 0.02, 0.02, 0.02, 0.02]
    recs = [_rec("depth_vanilla", s, {"test/absrel": 0.020 + 0.001 * s}, flat, "val/absrel") for s in range(3)]
    better = claim_report([*recs, _rec("depth_vanilla_long", 0, {"test/absrel": 0.012}, flat, "val/absrel")], tmp_path)
    assert "* `depth_vanilla`: not converged: the longer run (depth_vanilla_long) improves test/absrel by 0.008" in (
        better
    )
    worse = claim_report([*recs, _rec("depth_vanilla_long", 0, {"test/absrel": 0.03}, flat, "val/absrel")], tmp_path)
    assert "* `depth_vanilla`: converged: the longer run (depth_vanilla_long) worsens test/absrel by 0.01" in worse
