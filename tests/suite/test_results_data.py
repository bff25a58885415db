"""suite.results_data's overview (docs/results/README.md): every claim of every data file in one table, a forest
plot per page drawn from the data files alone, and pages without a data file listed as pending."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from suite import results_data, stats
from suite.claims import ClaimResult

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"

CLAIMS = [
    ClaimResult("a_vs_b", "a beats b", stats.REPRODUCED, primary=True, diff=0.4, lo=0.2, hi=0.6, published=0.3),
    ClaimResult("c_vs_b", "c beats b", stats.NOISE, diff=0.1, lo=-0.2, hi=0.4, delta=0.05),
    ClaimResult("exact", "an exact solve", stats.NOT_REPRODUCED, diff=-1.0, lo=-1.0, hi=-1.0, published=2.0),
    ClaimResult("stated", "a phenomenon check", stats.ABSENT, why="never appeared"),
]


@pytest.fixture
def results(tmp_path):
    (tmp_path / "data").mkdir()
    for slug in ("rebuilt", "former"):
        (tmp_path / f"{slug}.md").write_text(f"# Claim check: {slug}\n")
    data = results_data.build("rebuilt", {"runs": [{"name": "a"}]}, [], {})
    data["claims"] = [c.to_dict() for c in CLAIMS]
    results_data.write(tmp_path / "data" / "rebuilt.json", data)
    return tmp_path


def test_overview_lists_every_claim_of_every_data_file(results):
    text = results_data.overview(results)
    table = text.split("## Every claim")[1].split("## Forest plots")[0]
    rows = [line for line in table.splitlines() if line.startswith("| rebuilt |")]
    assert [r.split("`")[1] for r in rows] == [c.id for c in CLAIMS]
    assert rows[0] == (
        "| rebuilt | `a_vs_b`: a beats b | **reproduced** | +0.4 [+0.2, +0.6] | +0.3 | yes "
        "| [page](rebuilt.md#verdicts) |"
    )
    assert "| **not reproduced** | -1 (exact) | +2 | no |" in rows[2] and "| — | — | no |" in rows[3]
    assert "former" not in table  # no data file: listed as pending in the counts table only
    assert "| [former](former.md) |" in text and "former: rerun pending" in text
    assert "![forest plot of rebuilt](forest/rebuilt.png)" in text and "forest/former.png" not in text


def test_forest_plot_draws_one_interval_and_one_paper_marker_per_claim(results):
    fig = results_data.forest_figure("rebuilt", CLAIMS)
    gids = [a.get_gid() for ax in fig.axes for a in ax.get_children() if a.get_gid()]
    plt.close(fig)
    with_interval = [c.id for c in CLAIMS if c.diff is not None]
    assert sorted(g for g in gids if g.startswith("interval:")) == sorted(f"interval:{i}" for i in with_interval)
    assert sorted(g for g in gids if g.startswith("paper:")) == ["paper:a_vs_b", "paper:exact"]
    assert len(fig.axes) == len(CLAIMS)
    written = results_data.write_forests(results)
    assert written == [results / "forest" / "rebuilt.png"] and written[0].read_bytes()[:4] == b"\x89PNG"


def test_committed_overview_holds_every_claim_of_every_committed_data_file():
    text = (RESULTS / "README.md").read_text()
    table = text.split("## Every claim")[1].split("## Forest plots")[0]
    for f in sorted((RESULTS / "data").glob("*.json")):
        claims = json.loads(f.read_text()).get("claims") or []
        for c in claims:
            assert any(
                line.startswith(f"| {f.stem} | `{c['id']}`:") and f"**{c['verdict']}**" in line
                for line in table.splitlines()
            ), f"{f.stem}:{c['id']} missing from docs/results/README.md (python -m suite.results_data --overview)"
        assert not claims or (RESULTS / "forest" / f"{f.stem}.png").exists()


def _method_rows(text: str) -> list[str]:
    section = text.split("\n## Methods\n")[1].split("\n#")[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_readme_method_rows_are_short_and_count_the_data_files_verdicts():
    rows = _method_rows((ROOT / "README.md").read_text())
    counts = results_data.verdict_counts(RESULTS / "data")
    assert len(rows) >= 19
    for row in rows:
        slug, paper, status, verdicts, docs, results = (c.strip(" `") for c in row.strip("| ").split(" | "))
        assert len(row) <= 300, f"README method row {slug} is {len(row)} characters (at most 300)"
        assert verdicts == results_data.verdict_summary(counts.get(slug)), f"{slug}: {verdicts!r}"
        assert (ROOT / docs.split("](")[1].split(")")[0]).exists() and f"docs/results/{slug}.md" in results
    assert {r.split("`")[1] for r in rows} >= set(counts) - {"quant_outliers", "badloss_vit", "tta_arch"}


def test_readme_verdicts_rewrites_only_the_method_tables_verdict_cells(results):
    text = (
        "## Methods\n\n| slug | paper | status | verdicts | docs | results |\n|---|---|---|---|---|---|\n"
        "| `rebuilt` | P | s | old | [m](m.md) | [r](r.md) |\n| `former` | P | s | old | [m](m.md) | [r](r.md) |\n"
        "\n### Sub\n\n| `rebuilt` | P | s | old | x | y |\n"
        "\n### Cross-paper studies\n\n| study | question | verdict | page |\n|---|---|---|---|\n"
        "| `rebuilt` | Q? | old | [results](r.md) |\n"
    )
    out = results_data.readme_verdicts(text, results / "data")
    assert "| `rebuilt` | P | s | 1 reproduced, 1 not, 1 absent, 1 noise | [m](m.md) | [r](r.md) |" in out
    assert "| `former` | P | s | former rule, rerun pending |" in out
    assert "| `rebuilt` | P | s | old | x | y |\n" in out  # outside the two tables: untouched
    assert out.endswith("| `rebuilt` | Q? | 1 reproduced, 1 not, 1 absent, 1 noise | [results](r.md) |\n")


def test_readme_study_rows_count_the_data_files_verdicts():
    section = (ROOT / "README.md").read_text().split("\n### Cross-paper studies\n")[1].split("\n#")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    counts = results_data.verdict_counts(RESULTS / "data")
    assert len(rows) >= 3
    for row in rows:
        slug, _, verdicts, _ = (c.strip(" `") for c in row.strip("| ").split(" | "))
        assert len(row) <= 300 and verdicts == results_data.verdict_summary(counts.get(slug)), (slug, verdicts)
