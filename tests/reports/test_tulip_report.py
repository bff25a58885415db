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
