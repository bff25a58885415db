"""Compare finished runs side by side: a markdown table of final metrics (mean ± std over seeds where there are
two or more) and PNG plots.

``python -m suite.compare --method <slug>`` reads every finished run of a method under ``logs/train/<slug>/``
(debug runs live in ``logs/debug/`` and are never read; runs without ``metrics.json`` — failed, interrupted or still
running — are skipped); ``--runs DIR ...`` reads the given run folders (or folders containing runs);
``--wandb-project entity/project`` reads an online project. Each run is labelled by the overrides that tell it
apart from the others (``model.neuron=lif``); seeds of one configuration are aggregated. ``curves.png`` overlays
the configurations on shared axes, one panel per metric and one colour per configuration (a sweep's
``model.optimizer.lr=0.001`` beside ``model.optimizer.lr=0.0001``); ``--split-by KEY`` gives one row of panels per
value of the override ``KEY``.
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

from core.errors import SuiteError
from suite.cli import fail
from suite.rundir import devices_label, read_csv_curves, read_devices, read_overrides
from suite.summary import is_result
from suite.wandb_reader import find_wandb_files, wait_for_wandb_run


@dataclass
class RunRecord:
    """One finished run: its folder, a display name, seed, final metrics and metric curves."""

    path: Path
    name: str
    seed: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    varies: dict[str, str] = field(default_factory=dict)  # the overrides that differ between the compared runs


def _overrides(run_dir: Path) -> list[str]:
    return read_overrides(run_dir) or []


def _name(run_dir: Path, overrides: list[str]) -> str:
    keep = [o for o in overrides if not o.startswith(("seed=", "hydra.", "paths.", "logger", "trainer.enable"))]
    return " ".join(keep) or run_dir.name


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
        rec.curves = read_csv_curves(csv_files[-1])
    else:
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
    rec.metrics = {k: v for k, v in rec.metrics.items() if is_result(k)}  # runs from before `lr-*` left metrics.json
    return rec


def is_debug_run(run_dir: Path) -> bool:
    """A ``debug=`` run (``smoke: true`` / ``task_name: debug`` in its saved config)."""
    f = run_dir / "config.yaml"
    if not f.is_file():
        return False
    try:
        cfg = yaml.safe_load(f.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return bool(cfg.get("smoke")) or cfg.get("task_name") == "debug"


def find_runs(roots: list[str | Path], skipped: list[Path] | None = None) -> list[Path]:
    """Finished run folders at or below each root: those holding ``metrics.json`` (written only when a run
    completes), excluding ``debug=`` runs. A root that is itself a run folder is read as given (named by the user).
    Folders left out (unfinished or debug runs) are appended to ``skipped``."""
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.exists():
            raise SuiteError(f"no such run folder: {root}")
        if (root / "metrics.json").exists() or (root / "csv").is_dir():
            found.append(root)
            continue
        markers = [m for m in root.rglob("metrics.json") if "wandb" not in m.relative_to(root).parts]
        for marker in sorted(markers):  # a wandb run folder keeps a copy of its run's metrics.json: not a run
            if is_debug_run(marker.parent):
                if skipped is not None:
                    skipped.append(marker.parent)
                continue
            found.append(marker.parent)
        if skipped is not None:
            finished = {p.parent for p in markers}
            skipped += [p.parent for p in root.rglob(".hydra") if p.parent not in finished]
    return sorted(set(found))


_UNLABELLED = ("seed=", "hydra.", "paths.", "logger", "trainer.enable", "ckpt_path=")
#: Overrides that ask for devices: a run is labelled by what it ran on (:func:`ran_on`), never by what was asked.
_DEVICE_KEYS = ("trainer", "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy")


def ran_on(run_dir: Path) -> str:
    """What a run ran on (``cpu``, ``gpu×4 ddp``): its ``devices.json``; for a run without one, its saved config's
    trainer when that names the device, else ``unrecorded``."""
    label = devices_label(read_devices(run_dir))
    if label:
        return label
    try:
        trainer = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("trainer") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        trainer = {}
    accelerator = str(trainer.get("accelerator", "auto")) if isinstance(trainer, dict) else "auto"
    if accelerator == "auto":
        return "unrecorded"
    devices = trainer.get("devices", 1)
    n = (int(devices) if str(devices).isdigit() else 1) * int(trainer.get("num_nodes") or 1)
    strategy = str(trainer.get("strategy") or "ddp")
    return {"cuda": "gpu"}.get(accelerator, accelerator) + (f"×{n} {strategy}" if n > 1 else "")


def label_by_difference(records: list[RunRecord]) -> None:
    """Name each run by the overrides that differ between the runs (``model.neuron=lif``), not by the ones they
    share (``experiment=ts_lif``); seeds never enter a label, so a configuration's seeds form one group. Devices
    enter as what each run ran on (``device=gpu×4 ddp``, :func:`ran_on`), not as the ``trainer=`` it was given."""
    opts = []
    for r in records:
        pairs = dict(
            o.split("=", 1) if "=" in o else (o, "") for o in _overrides(r.path) if not o.startswith(_UNLABELLED)
        )
        pairs = {k: v for k, v in pairs.items() if k.lstrip("+~") not in _DEVICE_KEYS}
        pairs["device"] = ran_on(r.path)
        opts.append(pairs)
    keys = list(dict.fromkeys(k for o in opts for k in o))
    varying = [k for k in keys if len({o.get(k) for o in opts}) > 1]
    for r, o in zip(records, opts, strict=True):
        r.varies = {k.lstrip("+~"): o.get(k, "(default)") for k in varying}
        if varying:
            r.name = " ".join(f"{k}={v}" for k, v in r.varies.items())
        else:  # every run has the same configuration (only seeds differ): one group, named by that configuration
            r.name = " ".join(f"{k}={v}" for k, v in o.items() if (k, v) != ("device", "unrecorded")) or "default"


def relative_change(value: float, reference: float, what: str) -> str:
    """``value`` against ``reference`` in words: ``"68.7% higher MAE"`` / ``"16.7% lower MAE"`` (never a negative
    "reduction" for a method that is worse)."""
    if reference == 0 or not (math.isfinite(value) and math.isfinite(reference)):
        return f"{what} {value:.4g} vs {reference:.4g}"
    change = 100.0 * (value - reference) / abs(reference)
    if abs(change) < 0.05:
        return f"the same {what}"
    return f"{abs(change):.1f}% {'higher' if change > 0 else 'lower'} {what}"


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


def seeds_of(records: list[RunRecord], keys: list[str]) -> dict[str, dict[str, list]]:
    """Per run group and metric: the seeds of the runs that logged a finite value (what :func:`aggregate` averaged)."""
    out: dict[str, dict[str, list]] = {}
    for r in records:
        for k in keys:
            if k in r.metrics and math.isfinite(r.metrics[k]):
                out.setdefault(r.name, {}).setdefault(k, []).append(r.seed)
    return out


def _count(n: int, seeds: list | None) -> str:
    """``n=3`` over three seeds; runs that share a seed are repeats (same data, split and initialisation), whose
    spread is not seed variation: ``3 repeats of seed 0``, or ``n=3: 2 seeds, repeats included``."""
    distinct = set(seeds or [])
    if seeds is None or len(seeds) != n or len(distinct) == n:
        return f"n={n}"
    if len(distinct) == 1:
        return f"{n} repeats of seed {next(iter(distinct))}"
    return f"n={n}: {len(distinct)} seeds, repeats included"


def markdown_table(
    keys: list[str], table: dict[str, dict], digits: int = 4, seeds: dict[str, dict[str, list]] | None = None
) -> str:
    """Rows = run groups, columns = metrics; a cell is ``mean ± std (n=k)`` over k >= 2 seeds, and says
    ``(one seed)`` when there is only one (no spread to show). With ``seeds`` (:func:`seeds_of`), runs of one seed
    are labelled as repeats (``± 0 (3 repeats of seed 0)``), not counted as seeds."""
    lines = ["| run | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in table.items():
        cells = []
        for k in keys:
            if k in row:
                m, s, n = row[k]
                count = _count(n, (seeds or {}).get(name, {}).get(k)) if seeds is not None else f"n={n}"
                cells.append(f"{m:.{digits}g} ± {s:.2g} ({count})" if n > 1 else f"{m:.{digits}g} (one seed)")
            else:
                cells.append("—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _wrap(label: str, width: int = 36) -> str:
    """A legend/tick label or title in full, wrapped at spaces only (a word longer than ``width`` stays whole: the
    differing part of a label is often at its end)."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_long_words=False, break_on_hyphens=False)) or label


def plain_axes(ax: Any) -> None:
    """Tick labels as plain numbers: no offset (``+7.719e2``) and no ``1e5`` multiplier above the axis, so a value
    is read off its tick alone."""
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "linear":
            fmt = ScalarFormatter(useOffset=False)
            fmt.set_scientific(False)
            axis.set_major_formatter(fmt)


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
        ax.set_yticks(range(len(names)), [_wrap(n) for n in names], fontsize=7)
        ax.set_title(_wrap(k, 44), fontsize=9)
        plain_axes(ax)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def monotonic(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A logged curve with steps that only go forward: where the step goes back (rows of an earlier attempt left in
    a run's CSV, e.g. a claim entry rerun into the same folder before ``truncate_csv``), the later attempt's points
    replace the earlier attempt's from that step on; a repeated step keeps its last value."""
    out: list[tuple[int, float]] = []
    for step, value in points:
        while out and out[-1][0] >= step:
            out.pop()
        out.append((step, value))
    return out


def _series(r: RunRecord, key: str) -> list[tuple[int, float]]:
    pts = r.curves.get(key) or r.curves.get(f"{key}_epoch") or r.curves.get(f"{key}_step") or []
    return monotonic(pts)


def shared_validation_metrics(records: list[RunRecord]) -> list[str]:
    """The ``val/*`` curves every run with curves logged (``val/loss_epoch`` counts as ``val/loss``), sorted."""
    sets = []
    for r in records:
        keys = {k.removesuffix("_epoch").removesuffix("_step") for k, v in r.curves.items() if v}
        if keys:
            sets.append({k for k in keys if k.startswith("val/")})
    return sorted(set.intersection(*sets)) if sets else []


def settings_and_methods(names: list[str]) -> dict[str, tuple[str, str]]:
    """Split run-group names into (setting, method), e.g. ``school_ci_ewc`` -> (``school_ci``, ``ewc``).

    A method is a name suffix (after an ``_``) that recurs under several prefixes (``ewc`` under ``school``,
    ``school_ci`` and ``pubmed``); each name takes the split whose suffix recurs most, ties going to the prefix
    most names share; a variant run in one setting only (``school_nforgot_wl``) takes the longest prefix that is
    a setting (``school``, ``nforgot_wl``). Names with no recurring suffix form one setting ``""`` and are their own
    method."""
    splits = {n: [(n[:i], n[i + 1 :]) for i, c in enumerate(n) if c == "_" and 0 < i < len(n) - 1] for n in names}
    prefixes_of: dict[str, set[str]] = defaultdict(set)
    for options in splits.values():
        for prefix, suffix in options:
            prefixes_of[suffix].add(prefix)
    sharing = {p: sum(n.startswith(p + "_") for n in names) for opts in splits.values() for p, _ in opts}
    out = {}
    for n, options in splits.items():
        scored = [(len(prefixes_of[sfx]), sharing[pfx], -len(pfx), pfx, sfx) for pfx, sfx in options]
        best = max(scored, default=None)
        out[n] = (best[3], best[4]) if best and best[0] >= 2 else ("", n)
    known = {setting for setting, _ in out.values() if setting}
    for n, options in splits.items():  # a variant only one setting runs (school_nforgot_wl): its longest known prefix
        if not out[n][0]:
            out[n] = max(((p, sfx) for p, sfx in options if p in known), key=lambda ps: len(ps[0]), default=("", n))
    if len({setting for setting, _ in out.values()}) < 2:  # one setting: keep the names whole
        out = {n: ("", n) for n in names}
    return out


def curve_keys(records: list[RunRecord], wanted: list[str]) -> list[str]:
    """The curves to draw for the metric keys ``wanted``, in their order, each once: the key where a run logged it
    as a curve (``val/loss_epoch`` counts as ``val/loss``), else the validation twin of a test metric (``test/acc``
    is drawn as ``val/acc``); keys with neither are left out."""
    logged = {k.removesuffix("_epoch").removesuffix("_step") for r in records for k, v in r.curves.items() if v}
    out: list[str] = []
    for key in wanted:
        for candidate in (key, "val/" + key.removeprefix("test/") if key.startswith("test/") else None):
            if candidate in logged:
                if candidate not in out:
                    out.append(candidate)
                break
    return out


def sweep_layout(records: list[RunRecord], split_by: str | None = None) -> dict[str, tuple[str, str]]:
    """Run group -> (row of panels, colour) for runs labelled by :func:`label_by_difference`: every group in one row,
    one colour per configuration (``model.optimizer.lr=0.001``); with ``split_by`` (an override that differs
    between the runs) one row per value of it, coloured by the other overrides that differ.

    Raises:
        SuiteError: ``split_by`` is not among the overrides that differ (the message lists those that do).
    """
    if split_by is None:
        return {r.name: ("", r.name) for r in records}
    key = split_by.lstrip("+~")
    varying = list(dict.fromkeys(k for r in records for k in r.varies))
    if key not in varying:
        listed = " ".join(varying) or "none: only seeds differ"
        raise SuiteError(f"--split-by {split_by}: not an override that differs between these runs ({listed})")
    out = {}
    for r in records:
        rest = " ".join(f"{k}={v}" for k, v in r.varies.items() if k != key)
        out[r.name] = (f"{key}={r.varies[key]}", rest or "runs")
    return out


def curves_figure(
    records: list[RunRecord],
    keys: list[str],
    *,
    layout: dict[str, tuple[str, str]] | None = None,
    shared: bool = True,
    max_panels: int | None = None,
) -> Any:
    """The curves on shared axes: one panel per metric, one colour per run group, each seed a thin line of its own
    and the mean over seeds bold; the legend sits outside the panels, right.

    Args:
        records: the runs; seeds of one group share its ``name``.
        keys: the curves to draw, in order (those no run logged are left out); with ``shared``, every validation
            metric all runs logged follows them.
        layout: run group -> (row, colour): one row of panels per distinct row value (``""``: no title prefix), one
            colour per colour value, the same in every row. Default: :func:`settings_and_methods` of the group names
            (a claim's entries ``school_ewc``, ``school_ci_ewc``: rows ``school`` and ``school_ci``, colour ``ewc``)
            where every row holds two groups or more, else one row with a colour per group; :func:`sweep_layout`
            for runs labelled by their overrides. Groups that logged none of the curves are left out.
        max_panels: at most this many panels: the first metrics that fit in every row; where the rows would leave
            fewer than two metrics each, one row holding every group.

    Titles are wrapped at spaces, never cut; tick labels are plain numbers (:func:`plain_axes`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    extra = [k for k in shared_validation_metrics(records) if k not in keys] if shared else []
    metrics = [k for k in [*keys, *extra] if any(_series(r, k) for r in records)] or keys[:1] or ["train/loss"]
    names = list(dict.fromkeys(r.name for r in records))
    groups = [g for g in names if any(_series(r, k) for r in records if r.name == g for k in metrics)] or names
    split = layout or settings_and_methods(groups)
    settings = list(dict.fromkeys(split[g][0] for g in groups))
    if layout is None and min(sum(split[g][0] == s for g in groups) for s in settings) < 2:
        split = {g: ("", g) for g in groups}  # a row of one run group compares nothing: every group on one row
        settings = [""]
    if max_panels is not None and len(settings) * min(2, len(metrics)) > max_panels:
        split = {g: ("", g) for g in groups}  # rows of fewer than two metrics each would not compare: one row
        settings = [""]
    if max_panels is not None:
        metrics = metrics[: max(1, max_panels // len(settings))]
    methods = list(dict.fromkeys(split[g][1] for g in groups))
    palette = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    colour = {m: palette(i % palette.N) for i, m in enumerate(methods)}
    cols = min(4, len(metrics))
    per_setting = math.ceil(len(metrics) / cols)
    rows = per_setting * len(settings)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False)
    handles: dict[str, Any] = {}
    for si, setting in enumerate(settings):
        for mi, key in enumerate(metrics):
            ax = axes[si * per_setting + mi // cols][mi % cols]
            for group in (g for g in groups if split[g][0] == setting):
                method = split[group][1]
                seeds = [pts for r in records if r.name == group and (pts := _series(r, key))]
                if not seeds:
                    continue
                short = max(len(pts) for pts in seeds) <= 20  # a one-point curve (one validation) is a visible dot
                style = {"color": colour[method], "marker": "o" if short else None}
                if len(seeds) > 1:
                    for pts in seeds:
                        ax.plot(*zip(*pts, strict=True), lw=0.6, alpha=0.35, ms=2, **style)
                    common = sorted(set.intersection(*({s for s, _ in pts} for pts in seeds)))
                    mean = [(s, float(np.mean([dict(pts)[s] for pts in seeds]))) for s in common]
                else:
                    mean = seeds[0]
                if mean:
                    (line,) = ax.plot(*zip(*mean, strict=True), lw=2.0, ms=3, label=_wrap(method), **style)
                    handles.setdefault(method, line)
            if not ax.lines:
                ax.text(0.5, 0.5, "not logged here", ha="center", va="center", transform=ax.transAxes, fontsize=7)
            ax.set_title(_wrap(f"{setting}: {key}" if setting else key, 44), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(5))
            plain_axes(ax)
            if si == len(settings) - 1 and mi // cols == per_setting - 1:
                ax.set_xlabel("step", fontsize=7)
        for extra_ax in range(len(metrics), per_setting * cols):
            axes[si * per_setting + extra_ax // cols][extra_ax % cols].axis("off")
    fig.tight_layout()
    if handles:
        title = "mean over seeds (bold); each seed (thin)"
        fig.legend(
            list(handles.values()),
            [_wrap(m) for m in handles],
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=7,
            frameon=False,
            title=title,
            title_fontsize=7,
        )
    return fig


def plot_curves(records: list[RunRecord], keys: list[str], out: Path, **options: Any) -> Path:
    """Write :func:`curves_figure` (``keys``, e.g. ``train/loss``, plus every shared validation metric unless
    ``shared=False``; ``options`` are its keyword arguments) to ``out``."""
    import matplotlib.pyplot as plt

    fig = curves_figure(records, keys, **options)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the legend outside the panels is kept
    plt.close(fig)
    return out


def compare(
    records: list[RunRecord], out_dir: str | Path, metrics: list[str] | None = None, split_by: str | None = None
) -> str:
    """Write ``comparison.md``, ``final_metrics.png`` and ``curves.png`` into ``out_dir``; return the table.

    ``curves.png`` overlays the run groups on shared axes (:func:`sweep_layout`): one panel for ``train/loss`` and
    one per table metric logged as a curve (a test metric by its validation twin), or every shared validation
    metric when none is; one row of panels per value of ``split_by`` when given."""
    if not records:
        raise SuiteError("no finished runs to compare")
    out_dir = Path(out_dir)
    layout = sweep_layout(records, split_by)
    keys, table = aggregate(records, metrics)
    md = markdown_table(keys, table, seeds=seeds_of(records, keys))
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_final(records, keys, out_dir / "final_metrics.png")
    drawn = curve_keys(records, ["train/loss", *keys])
    with_curves = [k for k in drawn if k != "train/loss"]
    plot_curves(records, drawn or ["train/loss"], out_dir / "curves.png", layout=layout, shared=not with_curves)
    (out_dir / "comparison.md").write_text(
        f"# Comparison of {len(records)} runs\n\n{md}\n\n![final](final_metrics.png)\n\n![curves](curves.png)\n"
    )
    return md


ROOT = Path(__file__).resolve().parents[1]


def default_metrics(slug: str) -> list[str] | None:
    """The metrics a method's claim check reports (``metrics:`` of ``conf/claim/<slug>.yaml``), if it has one."""
    spec = ROOT / "conf" / "claim" / f"{slug}.yaml"
    if not spec.is_file():
        return None
    try:
        return list((yaml.safe_load(spec.read_text()) or {}).get("metrics") or []) or None
    except (OSError, yaml.YAMLError):
        return None


def check_metrics(metrics: list[str], records: list[RunRecord]) -> None:
    """Refuse a ``--metrics`` key that none of ``records`` logged, naming the closest keys they did log.

    Raises:
        SuiteError: ``unknown metric 'test/nlll' (did you mean test/nll?)``.
    """
    import difflib

    logged = sorted({k for r in records for k in r.metrics})
    for m in metrics:
        if m not in logged:
            close = difflib.get_close_matches(m, logged, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else f"logged: {' '.join(logged)}"
            raise SuiteError(f"unknown metric '{m}': no run logged it ({hint})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--method", help="slug: every run of it under --logs")
    src.add_argument("--runs", nargs="+", help="run folders, or folders containing runs")
    src.add_argument("--wandb-project", help="entity/project of an online wandb project")
    parser.add_argument("--logs", default="logs", help="log root (default: logs)")
    parser.add_argument("--out", default=None, help="output folder (default: <logs>/compare/<method or 'runs'>)")
    parser.add_argument(
        "--metrics",
        nargs="*",
        default=None,
        help="metric keys for the table, space or comma separated (default: the metrics the method's claim check "
        "reports, conf/claim/<slug>.yaml; else every val/test metric)",
    )
    parser.add_argument(
        "--split-by",
        default=None,
        metavar="KEY",
        help="an override that differs between the runs (model.optimizer.lr): one row of curve panels per value of "
        "it (default: every run group on the same panels, one colour each)",
    )
    args = parser.parse_args(argv)
    try:
        metrics = [m for part in args.metrics or [] for m in part.replace(",", " ").split()] or None
        skipped: list[Path] = []
        if args.wandb_project:
            records = read_wandb_project(args.wandb_project)
        else:
            if args.method:
                slugs = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
                if args.method not in slugs:
                    raise SuiteError(f"unknown METHOD '{args.method}'; valid: {' '.join(slugs)}")
                metrics = metrics or default_metrics(args.method)
            roots = args.runs or [Path(args.logs) / "train" / args.method]
            if args.method and not Path(roots[0]).exists():
                raise SuiteError(
                    f"no runs of '{args.method}' under {roots[0]} (train one first: make train METHOD={args.method})"
                )
            records = [read_run(p) for p in find_runs(roots, skipped)]
            label_by_difference(records)
            if metrics and args.metrics:  # typed by the user: a metric no run logged is a typo, not an empty column
                check_metrics(metrics, records)
            elif metrics:  # the claim's metrics that these runs logged (a plain `make train` may log fewer)
                metrics = [m for m in metrics if any(m in r.metrics for r in records)] or None
            if not records:
                raise SuiteError(
                    f"no finished runs under {' '.join(map(str, roots))} ({len(skipped)} unfinished or debug "
                    "run folders skipped; a run is finished once it has written metrics.json)"
                )
        out = Path(args.out or Path(args.logs) / "compare" / (args.method or "runs"))
        print(compare(records, out, metrics, split_by=args.split_by))
        if skipped:
            print(f"skipped {len(skipped)} unfinished or debug run folder(s) (no metrics.json, or debug=)")
        print(f"wrote {out}/comparison.md, final_metrics.png, curves.png")
    except SuiteError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
