"""Results-page hook of the stickbreaking claim (``report: reports.stickbreaking:claim_report``).

The verdicts are the spec's declared claims (``conf/claim/stickbreaking.yaml``); this hook adds the table of
perplexity at each test length and its growth from the training length to 8x."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.claims import ClaimSpec, HookResult, Table, seed_values
from suite.compare import RunRecord

LENGTHS = (128, 256, 512, 1024)
MIXERS = ("stickbreaking", "softmax_rope", "softmax_nope")


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """Perplexity per test length per mixer (mean ± sd over seeds) and the per-seed growth ppl@1024 / ppl@128."""
    rows = []
    for name in MIXERS:
        cols = [seed_values(records, name, f"test/ppl_len{t}") for t in LENGTHS]
        if not cols[0] or not cols[-1]:
            continue
        ratios = [cols[-1][s] / cols[0][s] for s in cols[0] if s in cols[-1]]
        cells = [
            f"{statistics.fmean(c.values()):.3f} ± {statistics.stdev(c.values()) if len(c) > 1 else 0.0:.3f}"
            for c in cols
        ]
        rows.append([name, len(cols[0]), *cells, f"{statistics.fmean(ratios):.3f}"])
    columns = ["mixer", "seeds", *(f"ppl@{t}" for t in LENGTHS), "ppl@1024 / ppl@128 (mean over seeds)"]
    table = Table("Length generalisation (trained at T = 128)", columns, rows, "" if rows else "No finished runs.")
    return HookResult(tables=[table])
