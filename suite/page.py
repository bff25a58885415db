"""Markdown of a claim page's verdicts and hook data: the one place where verdicts become text.

The hooks return data (:class:`suite.claims.HookResult`). A page opens with :func:`summary_section` (one sentence on
what the verdicts mean, a short table of every claim: verdict, our difference with its 95% interval, the paper's, and
the scale run beside the paper's); then :func:`verdict_section` renders the verdict table (our difference with its
95% interval, n, paired or Welch, p, the paper's difference), :func:`per_seed_section` every verdict's per-seed
values, and :func:`hook_sections` the hook's tables, figures and notes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from suite import stats
from suite.claims import ClaimResult, HookResult, Table, counts, fmt, interval_text

GLOSSARY = "verdicts.md"  # docs/results/verdicts.md: the verdict words, linked from every page
SCALE_KEYS = ("model", "steps")  # the budget rows a summary and the overview show, paper beside here


def cell(text: Any) -> str:
    """One markdown table cell: whitespace collapsed, pipes escaped; floats to 4 significant digits."""
    if isinstance(text, float):
        text = f"{text:.4g}"
    return " ".join(str(text).split()).replace("|", "\\|")


def table_md(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def glossary_link(page: Path, results: Path) -> str:
    """The glossary's path relative to ``page``'s folder (``verdicts.md`` beside the pages, ``../verdicts.md`` from
    ``gpu/``); a page outside the repository (``results``' grandparent) gets the plain name, never a machine path."""
    page, results = Path(page).resolve(), Path(results).resolve()
    if not page.is_relative_to(results.parents[1]):
        return GLOSSARY
    return Path(os.path.relpath(results / GLOSSARY, page.parent)).as_posix()


def short_verdict(verdict: str) -> str:
    """A verdict word without the ``inconclusive:`` prefix (``within noise``), for counts."""
    return verdict.replace("inconclusive: ", "")


def scale_cells(budget: Mapping[str, Any] | None) -> list[str]:
    """The paper's and this run's model and steps from a spec's ``budget:``, in the order paper model, paper steps,
    here model, here steps ("—" where the spec states none): the one source of the scale shown at the top of a page
    and in the overview."""
    budget = budget or {}
    out = []
    for side in ("paper", "here"):
        values = budget.get(side) if isinstance(budget.get(side), Mapping) else {}
        out += [" ".join(str(values.get(key, "—")).split()) for key in SCALE_KEYS]
    return out


def scale_line(budget: Mapping[str, Any] | None) -> str:
    """One line: the scale run here beside the paper's (:func:`scale_cells`)."""
    if not budget:
        return "**Scale**: no `budget:` in the claim spec, so the paper's scale is not stated beside this one."
    pm, ps, hm, hs = scale_cells(budget)
    return f"**Scale**: here {hm}; {hs}. The paper: {pm}; {ps}. Every verdict holds at this scale only."


def _tally(group: Sequence[ClaimResult], label: str, where: str = "") -> str:
    c = counts(group)
    n = len(group)
    text = f"{c[stats.REPRODUCED]} of {n} {label}claim{'s' * (n != 1)} reproduced{where}"
    rest = [f"{c[v]} {short_verdict(v)}" for v in stats.VERDICTS if v != stats.REPRODUCED and c[v]]
    return text + (f" ({', '.join(rest)})" if rest else "")


def meaning(results: Sequence[ClaimResult]) -> str:
    """One sentence on what the page's verdicts mean: how many primary claims reproduced at this scale, how the
    others read, the exploratory claims likewise, and what would decide the undecided ones."""
    if not results:
        return "No claim could be judged: no pair of finished entries."
    primary = [r for r in results if r.primary]
    other = [r for r in results if not r.primary]
    if primary:
        text = _tally(primary, "primary ", " at this scale")
        if other:
            text += "; exploratory: " + _tally(other, "")
    else:
        text = _tally(results, "", " at this scale")
    c = counts(results)
    needs = [
        (what, which)
        for verdict, what, which in (
            (stats.UNDERFIT, "longer runs", "the underfit ones"),
            (stats.NOISE, "more seeds", "the ones within noise"),
            (stats.WEAK, "a stronger baseline", "the weak-baseline ones"),
        )
        if c[verdict]
    ]
    if needs:
        text += f"; {needs[0][0]} would decide {needs[0][1]}" + "".join(f", {a} {b}" for a, b in needs[1:])
    return text + "."


SUMMARY_COLUMNS = ["claim", "verdict", "ours: diff [95% CI]", "paper's diff", "metric"]


def summary_rows(results: Sequence[ClaimResult]) -> list[list[str]]:
    return [
        [
            f"`{r.id}`{' (primary)' if r.primary else ''}: {r.text}",
            f"**{r.verdict}**",
            interval_text(r),
            fmt(r.published),
            f"`{r.metric}`" if r.metric else "—",
        ]
        for r in results
    ]


def summary_section(
    results: Sequence[ClaimResult], budget: Mapping[str, Any] | None, glossary: str = GLOSSARY
) -> list[str]:
    """The top of a page: one sentence on what it means, the table of every claim (verdict, our difference with its
    95% interval, the paper's difference signed like ours), the scale run beside the paper's, the glossary link."""
    lines = ["## Summary", "", f"{meaning(results)} Verdict words: [glossary]({glossary}); detail below.", ""]
    if results:
        lines += [*table_md(SUMMARY_COLUMNS, summary_rows(results)), ""]
    return [*lines, scale_line(budget)]


def _p(r: ClaimResult) -> str:
    if r.p is None:
        return "—"
    text = f"{r.p:.3g}" if r.p >= 1e-4 else "<1e-4"
    if r.p_against != "0":
        text += f" vs {r.p_against}"
    if r.p_holm is not None:
        text += f" (Holm {r.p_holm:.3g})"
    return text


def _test(r: ClaimResult) -> str:
    if r.diff is None:
        return "—"
    if r.lo == r.hi:
        return "exact"
    kind = {"superiority": "", "non_inferior": ", non-inferiority", "equivalent": ", equivalence"}[r.kind]
    return ("paired" if r.paired else "Welch") + kind


def _n(r: ClaimResult) -> str:
    if not r.n:
        return "—"
    return str(r.n[0]) if r.paired and len(set(r.n)) == 1 else "/".join(map(str, r.n))


def _reading(r: ClaimResult) -> str:
    parts = [p for p in (r.why, r.evidence) if p]
    if r.verdict.startswith("inconclusive: within noise") and r.seeds_needed and r.delta:
        side = "" if r.paired else " a side"
        parts.append(f"an interval of half-width {r.delta:g} needs about {r.seeds_needed} seeds{side}")
    return "; ".join(parts)


def verdict_rows(results: Sequence[ClaimResult]) -> list[list[str]]:
    rows = []
    for r in results:
        role = "primary" if r.primary else "exploratory"
        delta = "—" if not r.delta and r.kind == "superiority" else f"{r.delta:.4g}"
        rows.append(
            [
                f"{r.text} (`{r.id}`, {role})",
                f"**{r.verdict}**",
                interval_text(r),
                _n(r),
                _test(r),
                _p(r),
                fmt(r.published),
                delta,
                _reading(r),
            ]
        )
    return rows


VERDICT_COLUMNS = ["claim", "verdict", "ours: diff [95% CI]", "n", "test", "p", "paper", "delta", "reading"]


def verdict_section(
    results: Sequence[ClaimResult], weak_notes: Sequence[str] = (), title: str = "Verdicts", glossary: str = GLOSSARY
) -> list[str]:
    """The verdict table with the rule in one paragraph and the weak-baseline flips under it."""
    lines = [f"## {title}", ""]
    if not results:
        return [*lines, "No claim could be judged: no pair of finished entries."]
    lines += [
        f"Each row: the difference (method minus what it is compared with, signed so that positive is the claimed "
        f"direction) with its 95% Student-t interval, paired by seed where both entries share what a seed determines, "
        f"Welch otherwise; `delta` is the smallest effect of interest declared before the runs; `p` is the two-sided "
        f"p of the test behind the reading (against 0; against `delta` for 'no effect as large as delta'; against "
        f"the margin for non-inferiority), below 0.05 exactly when the interval decides; primary claims carry Holm's "
        f"correction. Words: [verdict glossary]({glossary}).",
        "",
        *table_md(VERDICT_COLUMNS, verdict_rows(results)),
    ]
    if weak_notes:
        lines += ["", *[f"- **Weak baseline.** {n}" for n in weak_notes]]
    return lines


def per_seed_section(results: Sequence[ClaimResult]) -> list[str]:
    """Every verdict's per-seed values, so that a reader can recompute it."""
    rows = []
    for r in results:
        for entry, vals in r.values.items():
            if vals:
                seeds = sorted(vals, key=lambda s: (len(str(s)), str(s)))
                rows.append([f"`{r.id}`", entry, r.metric, ", ".join(f"{s}: {vals[s]:.5g}" for s in seeds)])
    if not rows:
        return []
    return ["## Per-seed values behind the verdicts", "", *table_md(["claim", "entry", "metric", "seed: value"], rows)]


def hook_sections(result: HookResult) -> list[str]:
    """The hook's tables (each under its own heading), figures and notes."""
    lines: list[str] = []
    for t in result.tables:
        lines += ["", f"## {t.title}", "", *table_md(t.columns, t.rows)]
        if t.note:
            lines += ["", t.note]
    for f in result.figures:
        lines += ["", f"![{f.title}]({f.path.name})"]
    if result.notes:
        lines += ["", *[f"- {n}" for n in result.notes]]
    return lines


def as_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> Table:
    return Table(title, list(columns), [list(r) for r in rows], note)
