"""suite.page: a claim page opens with its answer (one sentence, the claim table, the scale), then the detail."""

from __future__ import annotations

from suite import stats
from suite.claims import ClaimResult
from suite.compare import RunRecord
from suite.page import glossary_link, meaning, scale_cells, scale_line, summary_section

SPEC = {
    "seeds": [0, 1, 2],
    "runs": [{"name": "a"}, {"name": "b"}],
    "budget": {"paper": {"model": "1.3B", "steps": "100B tokens"}, "here": {"model": "96k", "steps": "800 steps"}},
    "sizing_metric": "val/loss",
    "claims": [
        {
            "id": "a_vs_b",
            "text": "a beats b",
            "metric": "test/acc",
            "entries": ["a", "b"],
            "higher_is_better": True,
            "delta": 0.05,
            "primary": True,
            "published": 0.3,
        },
        {
            "id": "b_vs_a",
            "text": "b beats a",
            "metric": "test/acc",
            "entries": ["b", "a"],
            "higher_is_better": True,
            "delta": 0.05,
        },
    ],
}


def _rec(tmp_path, name, seed, acc):
    curve = [(0, 2.0), (100, 1.5), (400, 1.0 + 0.001 * seed), (500, 1.0)]
    return RunRecord(
        tmp_path / f"{name}{seed}",
        name,
        seed,
        {"test/acc": acc},
        {"val/loss": curve},
        {"seed": seed, "data": {"seed": seed}},
    )


def _tables(text: str) -> list[list[str]]:
    """The page's markdown tables, in order, each as its lines."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def test_page_opens_with_the_claim_table_then_the_detail(tmp_path):
    from suite.claim import write_page

    recs = [_rec(tmp_path, "a", s, 0.9 + 0.01 * s) for s in range(3)]
    recs += [_rec(tmp_path, "b", s, 0.5 + 0.012 * s) for s in range(3)]
    text = write_page("demo", SPEC, recs, {}, tmp_path, [], tmp_path / "demo.md").read_text()
    first = _tables(text)[0]
    assert first[0] == "| claim | verdict | ours: diff [95% CI] | paper's diff | metric |"
    rows = {line.split("`")[1]: line for line in first[2:]}
    assert set(rows) == {"a_vs_b", "b_vs_a"}
    assert "| **reproduced** | +0.398 [+0.393, +0.403] | +0.3 | `test/acc` |" in rows["a_vs_b"]
    assert "(primary)" in rows["a_vs_b"] and "| **not reproduced** |" in rows["b_vs_a"]
    top = text[: text.index(first[0])]
    assert top.startswith("# Claim check: demo\n\n## Summary\n\n1 of 1 primary claim reproduced at this scale;")
    assert "[glossary](verdicts.md)" in top
    after = text[text.index(first[-1]) :]
    assert "**Scale**: here 96k; 800 steps. The paper: 1.3B; 100B tokens." in after.split("\n\n")[1]
    summary, produced = text.index("## Summary"), text.index("Produced by `make claim METHOD=demo`")
    assert summary < produced < text.index("## Verdicts") < text.index("## Runs") < text.index("## Budget")
    assert text.index("## Budget") < text.index("## Convergence")


def _r(id, verdict, primary=False, diff=None):
    return ClaimResult(id, id, verdict, primary=primary, diff=diff, lo=diff, hi=diff)


def test_meaning_counts_primary_and_exploratory_claims_and_says_what_would_decide():
    results = [
        _r("p1", stats.REPRODUCED, True),
        _r("p2", stats.REPRODUCED, True),
        _r("p3", stats.NOISE, True),
        _r("e1", stats.UNDERFIT),
        _r("e2", stats.REPRODUCED),
    ]
    assert meaning(results) == (
        "2 of 3 primary claims reproduced at this scale (1 within noise); exploratory: 1 of 2 claims reproduced "
        "(1 underfit); longer runs would decide the underfit ones, more seeds the ones within noise."
    )
    assert meaning([_r("x", stats.NOT_REPRODUCED)]) == "0 of 1 claim reproduced at this scale (1 not reproduced)."
    assert meaning([_r("x", stats.NOISE)]).endswith("(1 within noise); more seeds would decide the ones within noise.")
    assert meaning([]) == "No claim could be judged: no pair of finished entries."
    lines = summary_section([], None)
    assert not any(line.startswith("|") for line in lines) and "no `budget:`" in lines[-1]


def test_scale_and_glossary_links(tmp_path):
    budget = {"paper": {"model": "7B", "data": "C4"}, "here": {"steps": 300}}
    assert scale_cells(budget) == ["7B", "—", "—", "300"]
    assert scale_line(budget).startswith("**Scale**: here —; 300. The paper: 7B; —.")
    results = tmp_path / "repo" / "docs" / "results"
    assert glossary_link(results / "x.md", results) == "verdicts.md"
    assert glossary_link(results / "gpu" / "x.md", results) == "../verdicts.md"
    assert glossary_link(tmp_path / "elsewhere" / "x.md", results) == "verdicts.md"  # never a machine path
