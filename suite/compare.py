"""Compare finished runs side by side: a markdown table of final metrics (mean +- std over seeds) and PNG plots.

``python -m suite.compare --method <slug>`` reads every run of a method under ``logs/``; ``--runs DIR ...`` reads
the given run folders (or folders containing runs); ``--wandb-project entity/project`` reads an online project.
Sources per run, in order: ``metrics.json`` (final metrics written by the runner), the CSV log
(``csv/metrics.csv``: curves), the wandb offline file (summary + history) when there is no CSV.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from suite.errors import SuiteError


@dataclass
class RunRecord:
    """One finished run: its folder, a display name, seed, final metrics and metric curves."""

    path: Path
    name: str
    seed: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def _overrides(run_dir: Path) -> list[str]:
    f = run_dir / ".hydra" / "overrides.yaml"
    return list(yaml.safe_load(f.read_text()) or []) if f.exists() else []


def _name(run_dir: Path, overrides: list[str]) -> str:
    keep = [o for o in overrides if not o.startswith(("seed=", "hydra.", "paths.", "logger", "trainer.enable"))]
    return " ".join(keep) or run_dir.name


def _read_csv_curves(csv_file: Path) -> dict[str, list[tuple[int, float]]]:
    import csv

    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with csv_file.open() as fh:
        for row in csv.DictReader(fh):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                try:
                    curves[key].append((step, float(value)))
                except ValueError:
                    continue
    return dict(curves)


def read_run(run_dir: str | Path, name: str | None = None) -> RunRecord:
    """Read one run folder (see module docstring for the sources)."""
    run_dir = Path(run_dir)
    overrides = _overrides(run_dir)
    config: dict[str, Any] = {}
    if (run_dir / "config.yaml").exists():
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    seed = config.get("seed")
    for o in overrides:
        if o.startswith("seed="):
            seed = int(o.split("=", 1)[1])
    rec = RunRecord(run_dir, name or _name(run_dir, overrides), seed, config=config)
    if (run_dir / "metrics.json").exists():
        rec.metrics = {k: float(v) for k, v in json.loads((run_dir / "metrics.json").read_text()).items()}
    csv_files = sorted(run_dir.glob("csv/**/metrics.csv"))
    if csv_files:
        rec.curves = _read_csv_curves(csv_files[-1])
    else:
        from suite.wandb_reader import find_wandb_files, wait_for_wandb_run

        files = find_wandb_files(run_dir)
        if files:
            wb = wait_for_wandb_run(files[-1], timeout=5)
            for row in wb.history:
                step = int(row.get("trainer/global_step", row.get("_step", 0)))
                for k, v in row.items():
                    if "/" in k and not k.startswith(("_", "trainer/")) and isinstance(v, (int, float)):
                        rec.curves.setdefault(k, []).append((step, float(v)))
            if not rec.metrics:
                rec.metrics = {k: float(v) for k, v in wb.summary.items() if isinstance(v, (int, float)) and "/" in k}
    if not rec.metrics:
        rec.metrics = {k: v[-1][1] for k, v in rec.curves.items() if v}
    return rec


def find_runs(roots: list[str | Path]) -> list[Path]:
    """Run folders at or below each root (a run folder holds ``metrics.json`` or ``csv/``)."""
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.exists():
            raise SuiteError(f"no such run folder: {root}")
        if (root / "metrics.json").exists() or (root / "csv").is_dir():
            found.append(root)
            continue
        for marker in sorted(root.rglob("metrics.json")):
            found.append(marker.parent)
    return sorted(set(found))


def read_wandb_project(project: str) -> list[RunRecord]:
    """Runs of an online wandb project (``entity/project``); needs a login and a network."""
    try:
        import wandb

        api = wandb.Api(timeout=30)
        runs = api.runs(project)
    except Exception as err:  # noqa: BLE001 - report any wandb failure as one line
        raise SuiteError(f"cannot read wandb project {project!r}: {type(err).__name__}: {err}") from None
    out = []
    for r in runs:
        metrics = {k: float(v) for k, v in r.summary.items() if isinstance(v, (int, float)) and "/" in k}
        out.append(RunRecord(Path(r.id), r.name, r.config.get("seed"), metrics, config=dict(r.config)))
    return out


def aggregate(records: list[RunRecord], metrics: list[str] | None = None) -> tuple[list[str], dict[str, dict]]:
    """Group runs by name; per group and metric: mean, std (over seeds) and n."""
    names = list(dict.fromkeys(r.name for r in records))
    keys = metrics or sorted({k for r in records for k in r.metrics if k.startswith(("val/", "test/"))})
    table: dict[str, dict] = {}
    for name in names:
        group = [r for r in records if r.name == name]
        row = {}
        for k in keys:
            vals = [r.metrics[k] for r in group if k in r.metrics and math.isfinite(r.metrics[k])]
            if vals:
                row[k] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals))
        table[name] = row
    return keys, table


def markdown_table(keys: list[str], table: dict[str, dict], digits: int = 4) -> str:
    """Rows = run groups, columns = metrics, cells ``mean +- std (n)``."""
    lines = ["| run | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in table.items():
        cells = []
        for k in keys:
            if k in row:
                m, s, n = row[k]
                cells.append(f"{m:.{digits}g} ± {s:.2g} (n={n})" if n > 1 else f"{m:.{digits}g}")
            else:
                cells.append("—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_final(records: list[RunRecord], keys: list[str], out: Path) -> Path:
    """One panel per metric: each run group's seeds as points, the mean as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in records))
    cols = min(3, max(1, len(keys)))
    rows = math.ceil(max(1, len(keys)) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 0.5 * len(names) + 2.5 * rows), squeeze=False)
    for ax, k in zip(axes.flat, keys, strict=False):
        for i, name in enumerate(names):
            vals = [r.metrics[k] for r in records if r.name == name and k in r.metrics]
            if vals:
                ax.barh(i, statistics.fmean(vals), color="C0", alpha=0.4)
                ax.plot(vals, [i] * len(vals), "k.", ms=5)
        ax.set_yticks(range(len(names)), [n[:40] for n in names], fontsize=7)
        ax.set_title(k, fontsize=9)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_curves(records: list[RunRecord], keys: list[str], out: Path) -> Path:
    """Metric curves (value vs global step) per run, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(r: RunRecord, k: str) -> list[tuple[int, float]]:
        return r.curves.get(k) or r.curves.get(f"{k}_step") or r.curves.get(f"{k}_epoch") or []

    keys = [k for k in keys if any(series(r, k) for r in records)] or keys[:1]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2), squeeze=False)
    for ax, k in zip(axes.flat, keys, strict=False):
        for i, r in enumerate(records):
            pts = series(r, k)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(
                    xs,
                    ys,
                    color=f"C{list(dict.fromkeys(x.name for x in records)).index(r.name) % 10}",
                    lw=1,
                    label=r.name[:30] if i == [x.name for x in records].index(r.name) else None,
                )
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step")
    if axes.flat[0].get_legend_handles_labels()[0]:
        axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def compare(records: list[RunRecord], out_dir: str | Path, metrics: list[str] | None = None) -> str:
    """Write ``comparison.md``, ``final_metrics.png`` and ``curves.png`` into ``out_dir``; return the table."""
    if not records:
        raise SuiteError("no finished runs to compare")
    out_dir = Path(out_dir)
    keys, table = aggregate(records, metrics)
    md = markdown_table(keys, table)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_final(records, keys, out_dir / "final_metrics.png")
    curve_keys = ["train/loss"] + [k for k in keys if k.startswith("val/")][:2]
    plot_curves(records, curve_keys, out_dir / "curves.png")
    (out_dir / "comparison.md").write_text(
        f"# Comparison of {len(records)} runs\n\n{md}\n\n![final](final_metrics.png)\n\n![curves](curves.png)\n"
    )
    return md


def main(argv: list[str] | None = None) -> None:
    from suite.cli import fail

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--method", help="slug: every run of it under --logs")
    src.add_argument("--runs", nargs="+", help="run folders, or folders containing runs")
    src.add_argument("--wandb-project", help="entity/project of an online wandb project")
    parser.add_argument("--logs", default="logs", help="log root (default: logs)")
    parser.add_argument("--out", default=None, help="output folder (default: <logs>/compare/<method or 'runs'>)")
    parser.add_argument("--metrics", nargs="*", default=None, help="metric keys for the table (default: all val/test)")
    args = parser.parse_args(argv)
    try:
        if args.wandb_project:
            records = read_wandb_project(args.wandb_project)
        else:
            roots = args.runs or [Path(args.logs) / "train" / args.method]
            if args.method and not Path(roots[0]).exists():
                raise SuiteError(f"no runs of '{args.method}' under {roots[0]} (run `make train METHOD={args.method}`)")
            records = [read_run(p) for p in find_runs(roots)]
        out = Path(args.out or Path(args.logs) / "compare" / (args.method or "runs"))
        print(compare(records, out, args.metrics))
        print(f"wrote {out}/comparison.md, final_metrics.png, curves.png")
    except SuiteError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
