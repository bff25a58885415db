"""Markdown of a claim page's verdicts and hook data: the one place where verdicts become text.

The hooks return data (:class:`suite.claims.HookResult`); :func:`verdict_section` renders the verdict table (our
difference with its 95% interval, n, paired or Welch, p, the paper's difference), :func:`per_seed_section` every
verdict's per-seed values, and :func:`hook_sections` the hook's tables, figures and notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from suite.claims import ClaimResult, HookResult, Table, fmt, interval_text

GLOSSARY = "verdicts.md"  # docs/results/verdicts.md: the verdict words, linked from every page


def cell(text: Any) -> str:
    """One markdown table cell: whitespace collapsed, pipes escaped; floats to 4 significant digits."""
    if isinstance(text, float):
        text = f"{text:.4g}"
    return " ".join(str(text).split()).replace("|", "\\|")


def table_md(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


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
    results: Sequence[ClaimResult], weak_notes: Sequence[str] = (), title: str = "Verdicts"
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
        f"correction. Words: [verdict glossary]({GLOSSARY}).",
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
