"""Results kept as data: ``docs/results/data/<slug>.json``, from which a claim page rebuilds alone.

One file per claim page, written by ``make claim`` before the page (the page is always built from the file, so a
page built right after the runs and one rebuilt later with ``--report-only`` on a clean clone are the same)::

    {"format": 1, "slug": ..., "profile": "cpu", "written": <UTC time>, "commit": <git commit of the code>,
     "machine": {"cpus": .., "torch": .., "python": .., "arch": .., "device": ..},
     "status": {entry: [exit code, wall seconds], ...},
     "entries": {entry: {"config": <the first run's model/data/trainer config>}},
     "runs": [{"entry": .., "seed": .., "metrics": {final metrics, step-0 `@start` values and `best` values
               included}, "curves": {metric: [[step, value], ...] (at most 200 points)}, "files": {name: text}}]}

Curves kept: every ``val/*`` metric, ``train/loss`` and the spec's ``sizing_metric``, plus the keys or prefixes the
spec lists in ``data_curves``; each downsampled to at most :data:`MAX_POINTS` points, always keeping the first, the
last and the best (so the convergence rule reads the same best-so-far value). Small text files a hook reads from the
run folders (the spec's ``data_files``, e.g. ``quant_calibration.json``) are kept too and written back into a
folder per run when the records are rebuilt (:func:`records_from`), so such a hook works unchanged.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite import stats
from suite.claims import ClaimResult, counts, data_follows_seed, fmt, interval_text
from suite.compare import RunRecord
from suite.page import scale_cells, short_verdict

FORMAT = 1
MAX_POINTS = 200
MAX_FILE_BYTES = 256 * 1024
CONFIG_KEYS = ("seed", "model", "data", "trainer", "experiment", "test_weights")


def data_path(page: Path) -> Path:
    """The data file of a page: ``<page folder>/data/<page name>.json``."""
    return page.parent / "data" / f"{page.stem}.json"


def _round(v: float) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.7g}")


def downsample(points: Sequence[tuple[float, float]], keep: int = MAX_POINTS, frac: float = 0.2) -> list:
    """At most ``keep`` points (a few more when the extremes need them), evenly spaced in index, always with the
    first and the last point, the highest and the lowest, and the highest and the lowest at or before the start of
    the last ``frac`` of training: the convergence rule (:func:`suite.stats.converged`) then reads the same
    best-so-far values, in either direction, from the kept points as from the whole curve."""
    pts = [(s, v) for s, v in points if v is not None and math.isfinite(v)]
    if len(pts) <= keep:
        idx = list(range(len(pts)))
    else:
        idx = {round(i * (len(pts) - 1) / (keep - 6)) for i in range(keep - 5)}
        cut = pts[-1][0] - frac * (pts[-1][0] - pts[0][0])
        before = [i for i, p in enumerate(pts) if p[0] <= cut + 1e-9] or [0]
        for scope in (range(len(pts)), before):
            idx.add(max(scope, key=lambda i: pts[i][1]))
            idx.add(min(scope, key=lambda i: pts[i][1]))
        idx = sorted(idx)
    return [[int(pts[i][0]) if float(pts[i][0]).is_integer() else pts[i][0], _round(pts[i][1])] for i in idx]


def scrub(value: Any, root: Path | None) -> Any:
    """``value`` with machine paths removed: a string under ``root`` becomes relative to it; any other absolute path
    (a home, a temporary folder) becomes ``<path>``. Nested dicts and lists are walked."""
    if isinstance(value, dict):
        return {k: scrub(v, root) for k, v in value.items() if k != "default_root_dir"}
    if isinstance(value, list):
        return [scrub(v, root) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        if root is not None and Path(value).is_relative_to(root):
            return str(Path(value).relative_to(root))
        return "<path>"
    return value


def kept_curves(spec: Mapping[str, Any]) -> tuple[set[str], tuple[str, ...]]:
    """The curve keys (exact) and prefixes the data file keeps for ``spec``."""
    exact = {"train/loss"}
    if spec.get("sizing_metric"):
        exact.add(str(spec["sizing_metric"]))
    extra = [str(k) for k in spec.get("data_curves") or []]
    prefixes = ("val/", *(k for k in extra if k.endswith("/") or k.endswith("*")))
    exact |= {k for k in extra if not (k.endswith("/") or k.endswith("*"))}
    return exact, tuple(p.rstrip("*") for p in prefixes)


def _keep(key: str, exact: set[str], prefixes: tuple[str, ...]) -> bool:
    base = key.removesuffix("_epoch").removesuffix("_step")
    return key in exact or base in exact or key.startswith(prefixes)


def git_commit(root: Path) -> str | None:
    """The commit the code is at (``+dirty`` when the tree has changes), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine(out: Path | None = None) -> dict[str, Any]:
    """What the runs ran on: CPU count, torch, Python, architecture, and the device named by a ``machine.json``
    beside the runs (written by a script that ran them elsewhere). No host name."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(), "arch": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__.split("+")[0]
    except ImportError:
        pass
    if out is not None:
        try:
            m = json.loads((out / "machine.json").read_text())
            if isinstance(m, dict):
                info.update({k: m[k] for k in ("device", "host_cpus", "torch", "parallel", "wall_s", "date") if k in m})
        except (OSError, ValueError):
            pass
    info.setdefault("device", "CPU")
    return info


def _files(run_dir: Path, names: Sequence[str]) -> dict[str, str]:
    import sys

    out = {}
    for name in names:
        for f in sorted(Path(run_dir).rglob(name)):
            if not f.is_file():
                continue
            if f.stat().st_size > MAX_FILE_BYTES:  # a page rebuilt without it would differ: say so
                print(f"warning: {f} is over {MAX_FILE_BYTES // 1024} KiB: not kept in the data file", file=sys.stderr)
                continue
            out[str(f.relative_to(run_dir))] = f.read_text(errors="replace")
    return out


def build(
    slug: str,
    spec: Mapping[str, Any],
    records: Sequence[RunRecord],
    status: Mapping[str, Any],
    *,
    profile: str = "cpu",
    root: Path | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """The data file's content for ``records`` (module docstring)."""
    exact, prefixes = kept_curves(spec)
    frac = float((spec.get("converge") or {}).get("frac", 0.2))
    files = [str(f) for f in spec.get("data_files") or []]
    entries: dict[str, Any] = {}
    runs = []
    order = {e["name"]: i for i, e in enumerate(spec.get("runs", []))}
    for r in sorted(records, key=lambda r: (order.get(r.name, 1 << 30), str(r.seed))):
        if r.name not in entries:
            config = {k: r.config[k] for k in CONFIG_KEYS if k in (r.config or {})}
            entries[r.name] = {"config": scrub(config, root)}
        curves = {k: downsample(v, frac=frac) for k, v in sorted(r.curves.items()) if _keep(k, exact, prefixes) and v}
        run = {
            "entry": r.name,
            "seed": r.seed,
            "data_follows_seed": _data_follows_seed(r),
            "metrics": {k: _round(v) for k, v in sorted(r.metrics.items())},
            "curves": curves,
        }
        if files and r.path and Path(r.path).is_dir():
            kept = _files(Path(r.path), files)
            if kept:
                run["files"] = kept
        runs.append(run)
    return {
        "format": FORMAT,
        "slug": slug,
        "profile": profile,
        "written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(root) if root else None,
        "machine": machine(out),
        "status": {k: list(v) for k, v in status.items()},
        "entries": entries,
        "runs": runs,
    }


def _data_follows_seed(r: RunRecord) -> bool:
    return data_follows_seed(r)


def dumps(data: Mapping[str, Any]) -> str:
    """The data file's text: one run per line (readable diffs); a non-finite number is an error here, before any
    page is written from the data."""
    head = {k: v for k, v in data.items() if k != "runs"}
    body = ",\n".join("  " + json.dumps(run, separators=(",", ":"), allow_nan=False) for run in data["runs"])
    return json.dumps(head, indent=1, allow_nan=False)[:-2] + ',\n "runs": [\n' + body + "\n ]\n}\n"


def write(path: Path, data: Mapping[str, Any]) -> Path:
    """Write the data file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


class DataFileError(ValueError):
    """A results data file that cannot be read."""


def load(path: Path) -> dict[str, Any]:
    """Read a data file; a missing, corrupt or newer-format file is a :class:`DataFileError` naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise DataFileError(f"{path}: cannot read ({err.strerror})") from None
    except ValueError as err:
        raise DataFileError(f"{path}: not a results data file ({err})") from None
    if not isinstance(data, dict) or "runs" not in data or data.get("format") != FORMAT:
        raise DataFileError(f"{path}: not a results data file of format {FORMAT}")
    return data


def records_from(
    data: Mapping[str, Any], files_root: Path | None = None, paths: Mapping[tuple[str, str], Path] | None = None
) -> list[RunRecord]:
    """The :class:`RunRecord` of every run in a data file. A run's kept files are written under ``files_root``
    (default: a fresh temporary folder) in a folder per run, which becomes the record's ``path``; ``paths`` maps
    ``(entry, seed)`` to the run's own folder where it is still on disk (a hook that reads other files from it finds
    them there)."""
    root = Path(files_root or tempfile.mkdtemp(prefix="claim-data-"))
    out = []
    for i, run in enumerate(data["runs"]):
        name, seed = run["entry"], run.get("seed")
        config = json.loads(json.dumps((data.get("entries", {}).get(name) or {}).get("config") or {}))
        config["seed"] = seed
        if run.get("data_follows_seed") and isinstance(config.get("data"), dict):
            config["data"]["seed"] = seed
        own = (paths or {}).get((name, str(seed)))
        folder = Path(own) if own is not None else root / f"{i:04d}-{name}-s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        for rel, text in (run.get("files") or {}).items() if own is None else ():
            f = folder / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        metrics = {k: (math.nan if v is None else float(v)) for k, v in run.get("metrics", {}).items()}
        curves = {k: [(s, float(v)) for s, v in pts if v is not None] for k, pts in run.get("curves", {}).items()}
        out.append(RunRecord(folder, name, seed, metrics=metrics, curves=curves, config=config))
    return out


def status_from(data: Mapping[str, Any]) -> dict[str, tuple]:
    return {str(k): (v[0], v[1]) for k, v in (data.get("status") or {}).items() if isinstance(v, list) and len(v) == 2}


def verdict_counts(folder: Path) -> dict[str, dict[str, int]]:
    """Per data file in ``folder`` (``docs/results/data``): how many claims read each verdict word."""
    out = {}
    for f in sorted(Path(folder).glob("*.json")):
        try:
            data = load(f)
        except DataFileError:
            continue
        out[f.stem] = counts([ClaimResult.from_dict(c) for c in data.get("claims") or []])
    return out


SHORT_WORDS = {
    "reproduced": "reproduced",
    "not reproduced": "not",
    "inconclusive: underfit": "underfit",
    "inconclusive: phenomenon absent": "absent",
    "inconclusive: within noise": "noise",
    "inconclusive: weak baseline": "weak",
}
PENDING = "former rule, rerun pending"  # the verdict cell of a README row whose page has no data file


def verdict_summary(counts: Mapping[str, int] | None) -> str:
    """A README row's verdict cell: the non-zero counts in short words (``4 reproduced, 1 not, 3 noise``), or
    :data:`PENDING` without a data file (``counts`` None)."""
    if counts is None:
        return PENDING
    return ", ".join(f"{counts[v]} {w}" for v, w in SHORT_WORDS.items() if counts.get(v)) or "no claims"


README_TABLES = {"## Methods": (6, 3), "### Cross-paper studies": (4, 2)}  # heading -> (cells in a row, verdict cell)


def readme_verdicts(text: str, folder: Path) -> str:
    """``text`` (README.md) with the verdict cell of each row of its ``## Methods`` table (the 4th of 6 cells) and of
    its ``### Cross-paper studies`` table (the 3rd of 4) set from the data files in ``folder``
    (``docs/results/data``) by :func:`verdict_summary`; other lines unchanged."""
    table = verdict_counts(folder)
    out, shape = [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):  # a table ends at the next heading of any level
            shape = README_TABLES.get(line.strip())
        cells = line.split(" | ")
        if shape and line.startswith("| `") and len(cells) == shape[0]:
            cells[shape[1]] = verdict_summary(table.get(cells[0].strip("| `")))
            line = " | ".join(cells)
        out.append(line)
    return "".join(out)


BANNER = "> **Verdicts by the former rule**"  # the first words of the banner on a page not yet rebuilt from data
FOREST = "forest"  # docs/results/forest/<page>.png: one forest plot per page rebuilt from its data file
VERDICT_COLOURS = {"reproduced": "tab:green", "not reproduced": "tab:red"}  # inconclusive: grey


def pages(results: Path) -> list[Path]:
    """Every claim page under ``results`` (``docs/results``) and its ``gpu/`` folder, notes and indexes left out."""
    out = sorted(
        p for p in results.glob("*.md") if not p.stem.endswith("_notes") and p.stem not in ("README", "verdicts")
    )
    gpu = results / "gpu"
    return out + (sorted(p for p in gpu.glob("*.md") if not p.stem.endswith("_notes")) if gpu.is_dir() else [])


def page_claims(page: Path) -> list | None:
    """The verdicts (:class:`suite.claims.ClaimResult`) stored in a page's data file, or None without a readable
    data file (a page that still states the former rule's verdicts)."""
    try:
        data = load(data_path(page))
    except DataFileError:
        return None
    return [ClaimResult.from_dict(c) for c in data.get("claims") or []]


def forest_name(page: Path, results: Path) -> str:
    """``forest/<page>.png`` relative to ``results`` (``gpu/x`` becomes ``gpu_x``)."""
    return f"{FOREST}/{str(page.relative_to(results).with_suffix('')).replace('/', '_')}.png"


def forest_figure(title: str, claims: Sequence[Any]):
    """A forest plot of one page's claims: one row per claim on its own x axis (the claims' metrics differ), our
    difference with its 95% interval (coloured by verdict), the paper's difference beside it, 0 and the smallest
    effect of interest marked; positive is the claimed direction. Each interval is a line with the gid
    ``interval:<claim id>``, each paper's value a marker with the gid ``paper:<claim id>``. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(claims), 1)
    fig, axes = plt.subplots(n, 1, figsize=(9, 0.75 * n + 1.1), squeeze=False)
    for ax, r in zip(axes[:, 0], claims, strict=False):
        label = f"{r.id}{' *' if r.primary else ''}\n{r.verdict.replace('inconclusive: ', '')}"
        ax.set_yticks([0], [label], fontsize=8)
        ax.set_ylim(-1, 1)
        ax.tick_params(axis="x", labelsize=7)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        xs = [v for v in (r.diff, r.lo, r.hi, r.published) if v is not None and math.isfinite(v)]
        if not xs:
            ax.text(
                0.5,
                0,
                f"no interval: {r.verdict}",
                transform=ax.get_yaxis_transform(),
                ha="center",
                va="center",
                fontsize=8,
                color="0.4",
            )
            ax.set_xticks([])
            ax.spines["bottom"].set_visible(False)
            continue
        colour = VERDICT_COLOURS.get(r.verdict, "0.45")
        ax.axvline(0, color="0.6", lw=0.8)
        marks = {"superiority": [r.delta], "non_inferior": [-r.delta], "equivalent": [-r.delta, r.delta]}[r.kind]
        for m in marks if r.delta else []:
            ax.axvline(m, color="0.6", lw=0.8, ls=":")
        xs += [0.0, *(marks if r.delta else [])]
        if r.diff is not None:
            ax.hlines(0, r.lo, r.hi, color=colour, lw=2.5, gid=f"interval:{r.id}")
            ax.plot([r.diff], [0], "o", color=colour, ms=6)
        if r.published is not None:
            ax.plot([r.published], [0], "D", color="tab:blue", ms=6, mfc="none", mew=1.5, gid=f"paper:{r.id}")
        lo, hi = min(xs), max(xs)
        pad = 0.08 * (hi - lo) or 0.1 * max(abs(hi), 1e-9)
        ax.set_xlim(lo - pad, hi + pad)
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    fig.suptitle(
        f"{title}: ours (dot, 95% interval) and the paper's (open diamond); > 0 is the claimed direction; "
        "dotted: delta; * primary",
        fontsize=9,
    )
    height = 0.75 * n + 1.1
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / height))
    return fig


def write_forests(results: Path) -> list[Path]:
    """Draw ``forest/<page>.png`` for every page with a data file (:func:`forest_figure`), from the data files
    alone; returns the files written."""
    import matplotlib.pyplot as plt

    out = []
    for page in pages(results):
        claims = page_claims(page)
        if not claims:
            continue
        path = results / forest_name(page, results)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig = forest_figure(str(page.relative_to(results).with_suffix("")), claims)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        out.append(path)
    return out


def overview(results: Path) -> str:
    """``docs/results/README.md``: every claim page with its verdict counts where it was rebuilt from its data file
    under the current rules, or marked as still stating the former rule's verdicts (its page carries the banner);
    every claim of the rebuilt pages in one table; a forest plot per page (:func:`write_forests` draws them); the
    paper's budget beside the one run here."""
    listed = pages(results)
    claims = {page: page_claims(page) for page in listed}
    short = [short_verdict(v) for v in stats.VERDICTS]
    lines = [
        "# Claim pages",
        "",
        "Every paper's claim check (`make claim METHOD=<slug>`), with how many of its claims read each verdict "
        "([what the words mean](verdicts.md)). Counts, the claim table and the forest plots come from "
        "`data/<slug>.json` alone (`python -m suite.results_data --overview` writes this page); a page without a "
        "data file still states the verdicts of the former rule (two standard errors of an unpaired difference, the "
        "signed-gain plateau rule) and says so at its top until it is rerun. Every verdict holds at its page's scale "
        "(the budget table at the end).",
        "",
        "| page | " + " | ".join(short) + " | rules |",
        "|---|" + "---|" * (len(short) + 1),
    ]
    for page in listed:
        rel = page.relative_to(results)
        name = str(rel.with_suffix(""))
        if claims[page] is not None:
            c = counts(claims[page])
            lines.append(f"| [{name}]({rel}) | " + " | ".join(str(c[v]) for v in stats.VERDICTS) + " | current |")
        else:
            lines.append(f"| [{name}]({rel}) | " + " | ".join("" for _ in short) + " | former: rerun pending |")
    lines += [
        "",
        "## Every claim",
        "",
        "Each claim of every page rebuilt from its data file: our difference (positive = the claimed direction) with "
        "its 95% interval, the paper's own difference signed the same way (— where the paper gives none), and "
        "whether it is one of the page's primary claims (Holm's correction across them).",
        "",
        "| page | claim | verdict | diff [95% CI] | paper's diff | primary | link |",
        "|---|---|---|---|---|---|---|",
    ]
    for page in listed:
        rel = page.relative_to(results)
        for r in claims[page] or []:
            cells = [
                str(rel.with_suffix("")),
                f"`{r.id}`: {r.text}",
                f"**{r.verdict}**",
                interval_text(r),
                fmt(r.published),
                "yes" if r.primary else "no",
                f"[page]({rel}#verdicts)",
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "## Forest plots",
        "",
        "One figure per page, one row per claim on its own axis (the metrics differ): our difference with its 95% "
        "interval (green reproduced, red not reproduced, grey inconclusive), the paper's difference as an open "
        "diamond, 0 as a solid line and the smallest effect of interest (delta) dotted.",
    ]
    for page in listed:
        if claims[page]:
            name = str(page.relative_to(results).with_suffix(""))
            lines += ["", f"### {name}", "", f"![forest plot of {name}]({forest_name(page, results)})"]
    lines += [
        "",
        "## Budget: the paper's and the one run here",
        "",
        "Every verdict is at the scale of its page's budget table: the paper's model and steps beside ours "
        "(from each spec's `budget:`).",
        "",
        "| page | paper: model | paper: steps | here: model | here: steps |",
        "|---|---|---|---|---|",
    ]
    for page in listed:
        cells = scale_cells(_spec_budget(results.parents[1] / "conf" / "claim", page, results))
        lines.append(f"| {page.relative_to(results).with_suffix('')} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _spec_budget(conf: Path, page: Path, results: Path) -> dict[str, dict[str, Any]]:
    """The ``budget:`` of the spec behind a page (``conf/claim[/<profile>]/<slug>.yaml``), or ``{}``."""
    import yaml

    spec = conf / page.parent.relative_to(results) / f"{page.stem}.yaml"
    try:
        budget = (yaml.safe_load(spec.read_text()) or {}).get("budget") or {}
    except (OSError, yaml.YAMLError):
        return {}
    return {k: v for k, v in budget.items() if isinstance(v, dict)}


def main(argv: list[str] | None = None) -> None:
    """``python -m suite.results_data [folder]``: the verdict counts of every page rebuilt from data (the README's
    counts come from here)."""
    import argparse

    parser = argparse.ArgumentParser(description="verdict counts per claim page, from docs/results/data/*.json")
    parser.add_argument("folder", nargs="?", default=str(Path(__file__).resolve().parents[1] / "docs/results/data"))
    parser.add_argument(
        "--overview",
        action="store_true",
        help="write docs/results/README.md (every page, its counts, every claim), the forest plots and the verdict "
        "counts of README.md's method table",
    )
    args = parser.parse_args(argv)
    if args.overview:
        results = Path(args.folder).parent
        forests = write_forests(results)
        (results / "README.md").write_text(overview(results))
        readme = results.parents[1] / "README.md"
        if readme.exists():  # the method table's verdict counts, from the same data files
            readme.write_text(readme_verdicts(readme.read_text(), Path(args.folder)))
        print(f"wrote {results / 'README.md'} and {len(forests)} forest plots in {results / FOREST}")
        return
    table = verdict_counts(Path(args.folder))
    short = {v: v.replace("inconclusive: ", "") for v in stats.VERDICTS}
    print("| page | " + " | ".join(short[v] for v in stats.VERDICTS) + " |")
    print("|---|" + "---|" * len(stats.VERDICTS))
    for slug, c in table.items():
        print(f"| [{slug}]({slug}.md) | " + " | ".join(str(c[v]) for v in stats.VERDICTS) + " |")


if __name__ == "__main__":
    main()
