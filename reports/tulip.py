"""Results-page hook of the TULIP claim (``report: reports.tulip:claim_report``).

TULIP (ICLR 2025) distils CLIP's text tower into a relative-position (RoPE) student and NTK-expands it to long
captions, claiming better long-caption retrieval than CLIP and Long-CLIP while keeping short-caption retrieval. The
verdicts are the spec's declared claims (``conf/claim/tulip.yaml``); this hook adds the retrieval table and plot by
caption length, and marks the CLIP comparison's phenomenon absent when the truncated CLIP leaves no headroom."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.claims import ClaimSpec, Figure, HookResult, Table, seed_values
from suite.compare import RunRecord
from suite.report import mean_sd, std_error

METHOD = "tulip"
BASELINES = ("clip", "longclip", "rope_no_distill", "rope_no_ntk")
BINS = (("lt80", "< 80"), ("80_100", "80-99"), ("100_120", "100-119"), ("ge120", ">= 120"))
# Below this long-caption R@1 gap between the truncated CLIP and 100 there is nothing to recover: members of a family
# differ within their first L tokens only in 2-3 tokens that name at most one attribute, so a model reading L tokens
# tells them apart only in part.
MIN_HEADROOM = 5.0


def _plot(records: list[RunRecord], names: list[str], out_dir: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = list(range(len(BINS)))
    for n in names:
        per_bin = [list(seed_values(records, n, f"test/r1_len_{b}").values()) for b, _ in BINS]
        if not all(per_bin):
            continue
        mean = [statistics.fmean(v) for v in per_bin]
        se = [std_error(v) for v in per_bin]
        ax.errorbar(xs, mean, yerr=se, marker="o", capsize=3, label=n)
    ax.set_xticks(xs, [label for _, label in BINS])
    ax.set_xlabel("long-caption length (BPE tokens)")
    ax.set_ylabel("R@1, mean of I2T and T2I (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_dir) / "tulip_r1_by_length.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """Long-caption R@1 per caption-length bin (table and plot) and the headroom check of the CLIP claim.

    Args:
        records: the claim's runs.
        spec: the tulip claim spec.
        out_dir: the page's folder (receives the plot).
    """
    names = [n for n in (METHOD, *BASELINES, "teacher") if seed_values(records, n, "test/long_r1")]
    keys = [f"test/r1_len_{b}" for b, _ in BINS] + ["test/long_i2t_r1", "test/long_t2i_r1"]
    rows = [[n, *(mean_sd(seed_values(records, n, k).values()) for k in keys)] for n in names]
    columns = ["entry", *(f"R@1 at {label} tokens" for _, label in BINS), "I2T R@1", "T2I R@1"]
    table = Table("Long-caption retrieval by caption length (test, mean ± sd over seeds)", columns, rows)
    plot = _plot(records, names, out_dir) if names else None
    figures = [Figure("R@1 vs caption length", plot)] if plot else []
    absent = {}
    clip = seed_values(records, "clip", "test/long_r1")
    if clip and statistics.fmean(clip.values()) > 100 - MIN_HEADROOM:
        absent["tulip_vs_clip"] = (
            f"CLIP at L already retrieves {statistics.fmean(clip.values()):.1f} R@1: under {MIN_HEADROOM:g} points "
            "of headroom, nothing for a longer context to recover"
        )
    return HookResult(tables=[table], figures=figures, absent=absent)
