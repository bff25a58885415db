"""The TULIP results hook on synthetic records: the length table, the plot, and the verdicts it computes."""

from __future__ import annotations

from pathlib import Path

from reports.tulip import claim_report
from suite.compare import RunRecord

FLAT = [(s, 50.0) for s in range(0, 1000, 50)]
RISING = [(s, float(s) / 10) for s in range(0, 1000, 50)]


def _rec(name: str, seed: int, long_r1: float, short_r1: float, curve=FLAT) -> RunRecord:
    metrics = {"test/long_r1": long_r1 + seed, "test/short_r1": short_r1 + 0.1 * seed,
               "test/long_i2t_r1": long_r1, "test/long_t2i_r1": long_r1}  # fmt: skip
    metrics |= {f"test/r1_len_{b}": long_r1 + i for i, b in enumerate(("lt80", "80_100", "100_120", "ge120"))}
    return RunRecord(Path(name), name, seed, metrics, {"val/long_r1": curve})


def test_verdicts_follow_the_numbers(tmp_path):
    recs = []
    for seed in range(3):
        recs += [_rec("tulip", seed, 60.0, 40.0), _rec("clip", seed, 25.0, 41.0), _rec("longclip", seed, 59.0, 40.0),
                 _rec("rope_no_distill", seed, 40.0, 30.0, RISING), _rec("rope_no_ntk", seed, 80.0, 40.0),
                 _rec("teacher", seed, 20.0, 40.0)]  # fmt: skip
    page = claim_report(recs, tmp_path, {"sizing_metric": "val/long_r1", "sizing_higher_is_better": True})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines() if line.startswith("| ")}
    assert (
        "**reproduced**"
        in rows["TULIP beats CLIP (context L, long captions truncated) on long-caption retrieval (I2T+T2I R@1)"]
    )
    assert "**inconclusive: within noise**" in next(v for k, v in rows.items() if k.startswith("TULIP beats Long-CLIP"))
    assert "**inconclusive: underfit**" in next(v for k, v in rows.items() if k.startswith("Relative-position"))
    assert "**not reproduced**" in next(v for k, v in rows.items() if k.startswith("NTK-aware"))
    assert "**reproduced**" in next(v for k, v in rows.items() if k.startswith("TULIP keeps short"))
    assert (tmp_path / "tulip_r1_by_length.png").exists() and "R@1 at 80-99 tokens" in page


def _short_verdict(tmp_path, tulip_short: list[float], teacher_short: list[float]) -> str:
    recs = []
    for seed, (a, b) in enumerate(zip(tulip_short, teacher_short, strict=True)):
        recs += [_rec("tulip", 0, 60.0, a), _rec("teacher", 0, 20.0, b)]
        recs[-2].seed = recs[-1].seed = seed
    page = claim_report(recs, tmp_path, {"sizing_metric": "val/long_r1", "sizing_higher_is_better": True})
    return next(line for line in page.splitlines() if line.startswith("| TULIP keeps short"))


def test_keeps_short_captions_is_a_non_inferiority_verdict_with_its_margin(tmp_path):
    """Issue 48 item 7: "within noise" is not "kept" when the noise is wider than the stated margin (2 R@1 points)."""
    assert "2 R@1 points" in _short_verdict(tmp_path, [40.0, 40.5, 39.5], [40.2, 40.0, 40.3])
    assert "**reproduced**" in _short_verdict(tmp_path, [39.0, 39.5, 39.2], [40.2, 40.0, 40.3])  # 1 point below
    # the old rule read this reproduced (not worse by 2 s.e.); the spread makes the lower bound fall past -2 points
    assert "**inconclusive: within noise**" in _short_verdict(tmp_path, [30.0, 45.0, 38.0], [40.2, 40.0, 40.3])
    assert "**not reproduced**" in _short_verdict(tmp_path, [30.0, 30.5, 29.5], [40.2, 40.0, 40.3])
