"""Claim check: run a paper's method and its baselines over seeds (Hydra multiruns), write its results page.

``python -m suite.claim <slug> [extra overrides]`` (``make claim METHOD=<slug>``) reads ``conf/claim/<slug>.yaml``::

    runs:                       # method and baselines, same budget
      - {name: gdn, overrides: "model.mixer=gdn"}
      - {name: softmax, overrides: "model.mixer=softmax"}
    seeds: [0, 1, 2]                        # an entry may set its own `seeds:` (e.g. one seed for an exact solve)
    overrides: "trainer.max_epochs=20"      # applied to every run
    metrics: [test/loss, test/acc]          # table columns
    logger: csv                             # logger group for the runs (csv keeps claims fast; wandb works too)
    report: reports.<slug>:claim_report     # hook(records, out_dir[, spec]) -> markdown (verdict table)
    budget: {paper: {model: ..., steps: ..., data: ...}, here: {...}}   # the budget table on the page
    sizing_metric: val/loss                 # the sizing curve: every entry's validation curve, plateau judged
    sizing_higher_is_better: false

Each entry becomes ``python -m train -m experiment=<slug> <overrides> seed=0,1,2``; a failing entry is reported on
the page, not hidden. ``--report-only`` rebuilds the page from the runs already on disk. A hand-written reading of
the results lives in ``docs/results/<slug>_notes.md`` and is appended to the page on every (re)build.
``--only a,b`` (re)runs just those entries and reuses the others (e.g. to split a claim over parallel processes).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from omegaconf import OmegaConf

from suite.compare import RunRecord, aggregate, find_runs, markdown_table, plot_curves, plot_final, read_run
from suite.errors import ConfigError, SuiteError
from suite.report import budget_table, entry_curves, mean_curve, sizing

ROOT = Path(__file__).resolve().parents[1]


def load_spec(slug: str, path: str | Path | None = None) -> dict:
    path = Path(path) if path else ROOT / "conf" / "claim" / f"{slug}.yaml"
    if not path.exists():
        raise ConfigError(f"no claim check for '{slug}': {path} does not exist")
    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not spec.get("runs") or not all("name" in e for e in spec["runs"]):
        raise ConfigError(f"{path} must list runs, each with a name")
    return spec


def run_entry(slug: str, entry: dict, spec: dict, out: Path, extra: list[str]) -> tuple[int, float]:
    seeds = ",".join(str(s) for s in entry.get("seeds", spec.get("seeds", [0])))  # an entry may override the seeds
    cmd = [
        sys.executable, "-m", "train", "-m", f"experiment={slug}",
        *shlex.split(spec.get("overrides", "")), *shlex.split(entry.get("overrides", "")), *extra,
        f"seed={seeds}", f"logger={spec.get('logger', 'csv')}", "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={out / entry['name']}",
    ]  # fmt: skip
    print("$", shlex.join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        rc = proc.wait()
    finally:  # the claim was stopped (SIGTERM/Ctrl-C): stop its run too, so nothing keeps writing into the folders
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rc, time.perf_counter() - t0


def load_status(path: Path) -> dict:
    """Exit code and wall time of each run from an earlier claim invocation (empty when absent or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): (v[0], v[1]) for k, v in data.items() if isinstance(v, list) and len(v) == 2}


def collect(spec: dict, out: Path) -> list[RunRecord]:
    records = []
    for entry in spec["runs"]:
        folder = out / entry["name"]
        if folder.exists():
            records += [read_run(p, name=entry["name"]) for p in find_runs([folder])]
    return records


def write_page(
    slug: str, spec: dict, records: list[RunRecord], status: dict, out: Path, argv: list[str], page: Path | None = None
) -> Path:
    page = page or ROOT / "docs" / "results" / f"{slug}.md"
    shown_out = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out.name  # no machine paths in pages
    page.parent.mkdir(parents=True, exist_ok=True)
    keys, table = aggregate(records, spec.get("metrics"))
    plot = plot_final(records, keys, page.parent / f"{slug}.png") if records else None
    curves = plot_curves(records, ["train/loss"], page.parent / f"{slug}_curves.png") if records else None
    lines = [
        f"# Claim check: {slug}",
        "",
        f"Produced by `make claim METHOD={slug}{(' ARGS=' + shlex.quote(' '.join(argv))) if argv else ''}` "
        f"(`python -m suite.claim {slug}{(' ' + ' '.join(argv)) if argv else ''}`) on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; spec: `conf/claim/{slug}.yaml`; runs in `{shown_out}`.",
        f"Seeds: {spec.get('seeds', [0])}. Every run uses the same budget: `{spec.get('overrides', '')}`.",
        "",
        "## Runs",
        "",
        "| name | overrides | status | wall time |",
        "|---|---|---|---|",
    ]
    for entry in spec["runs"]:
        rc, secs = status.get(entry["name"], (None, None))
        state = "reused" if rc is None else ("ok" if rc == 0 else f"FAILED (exit {rc})")
        wall = "—" if secs is None else f"{secs:.0f} s"
        own_seeds = f" (seeds {entry['seeds']})" if "seeds" in entry else ""
        lines.append(f"| {entry['name']} | `{entry.get('overrides', '')}`{own_seeds} | {state} | {wall} |")
    most = max((sum(r.name == n for r in records) for n in {r.name for r in records}), default=0)
    over = "mean ± std over seeds" if most >= 2 else "one seed per run: no spread"
    lines += ["", f"## Final metrics ({over})", "", markdown_table(keys, table) if records else "none"]
    if plot:
        lines += ["", f"![final metrics]({plot.name})", "", f"![training loss]({curves.name})"]
    lines += ["", "## Budget: the paper's and the one run here", "", budget_table(spec.get("budget"))]
    lines += ["", *sizing_section(slug, spec, records, page.parent)]
    hook = spec.get("report")
    if hook:
        mod, fn = hook.split(":")
        try:
            func = getattr(importlib.import_module(mod), fn)
            kwargs = {"spec": spec} if "spec" in inspect.signature(func).parameters else {}
            extra = func(records, page.parent, **kwargs)
        except Exception as err:  # noqa: BLE001 - a broken report hook must not lose the table above
            extra = f"Report hook `{hook}` failed: {type(err).__name__}: {err}"
        lines += ["", extra]
    notes = page.parent / f"{page.stem}_notes.md"  # hand-written reading of the results, kept across reruns
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    page.write_text("\n".join(lines) + "\n")
    return page


def sizing_section(slug: str, spec: dict, records: list[RunRecord], folder: Path) -> list[str]:
    """The page's sizing section: every entry's ``sizing_metric`` curve (mean over seeds, ``<slug>_sizing.png``,
    the stop marked) and whether it plateaued (:func:`suite.report.plateau`: the last 20% of training improved the
    metric by less than its seed spread, or by less than 1% with one seed)."""
    metric = spec.get("sizing_metric")
    head = ["## Sizing: has every entry plateaued?", ""]
    if not metric:
        return [*head, "No `sizing_metric` in the claim spec: the page cannot say whether the runs converged."]
    hib = bool(spec.get("sizing_higher_is_better", False))
    judged = sizing(records, metric, higher_is_better=hib)
    if not judged:
        return [*head, "No runs."]
    png = plot_sizing(records, metric, judged, folder / f"{slug}_sizing.png")
    lines = [
        *head,
        f"Criterion: an entry has plateaued when `{metric}` ({'higher' if hib else 'lower'} is better) improved over "
        "the last 20% of training by less than the seed spread (std over seeds) of its final value, or by less than "
        "1% of it with one seed. The hook's verdicts count a claim as tested only when its strongest entries "
        "plateaued.",
        "",
        "| entry | plateaued | reading |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'yes' if ok else 'no'} | {why} |" for name, (ok, why) in judged.items()]
    if png:
        lines += ["", f"![sizing curves]({png.name})"]
    return lines


def plot_sizing(records: list[RunRecord], metric: str, judged: dict, out: Path) -> Path | None:
    """Mean-over-seeds ``metric`` curve per entry; a dotted vertical line marks the stop (the last logged step), and a
    thick segment over the last 20% of training sits at the final value: solid when the entry plateaued, dashed not."""
    mean = {n: mean_curve(entry_curves(records, n, metric)) for n in judged}
    mean = {n: c for n, c in mean.items() if c}
    if not mean:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    stops = set()
    for i, (name, curve) in enumerate(mean.items()):
        xs, ys = zip(*curve, strict=True)
        ax.plot(xs, ys, color=f"C{i % 10}", lw=1.2, marker="." if len(xs) < 30 else None, label=name[:30])
        x0 = xs[-1] - 0.2 * (xs[-1] - xs[0])
        ax.hlines(ys[-1], x0, xs[-1], colors=f"C{i % 10}", lw=3, linestyles="solid" if judged[name][0] else "dashed")
        stops.add(xs[-1])
    for s in stops:
        ax.axvline(s, color="gray", ls=":", lw=1)
    ax.set_xlabel("step (dotted: stop; thick: last 20%, solid = plateaued)")
    ax.set_title(f"sizing: {metric}, mean over seeds", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    from suite.cli import fail

    parser = argparse.ArgumentParser(description="Run a paper's claim check and write docs/results/<slug>.md")
    parser.add_argument("slug")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides applied to every run")
    parser.add_argument("--out", default=None, help="run folder (default: logs/claim/<slug>)")
    parser.add_argument("--spec", default=None, help="claim spec (default: conf/claim/<slug>.yaml)")
    parser.add_argument("--page", default=None, help="results page (default: docs/results/<slug>.md)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the page from existing runs")
    parser.add_argument(
        "--only", default=None, help="comma-separated run names to (re)run; the others are reused from disk"
    )
    args = parser.parse_intermixed_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind through run_entry's cleanup
    try:
        spec = load_spec(args.slug, args.spec)
        out = Path(args.out or ROOT / "logs" / "claim" / args.slug).resolve()
        status_file = out / "claim_status.json"  # exit code + wall time per run, kept for --report-only
        status = load_status(status_file)
        names = [e["name"] for e in spec["runs"]]
        only = names if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"--only names {unknown} are not runs of {args.slug} (runs: {', '.join(names)})")
        ran = []
        if not args.report_only:
            for entry in spec["runs"]:
                if entry["name"] not in only:
                    continue
                result = run_entry(args.slug, entry, spec, out, args.overrides)
                ran.append(entry["name"])
                out.mkdir(parents=True, exist_ok=True)
                status = load_status(status_file)  # re-read: another `--only` invocation may have written meanwhile
                status[entry["name"]] = result
                status_file.write_text(json.dumps(status, indent=1))
        records = collect(spec, out)
        page_path = Path(args.page).resolve() if args.page else None
        page = write_page(args.slug, spec, records, status, out, args.overrides, page_path)
        print(f"wrote {page} ({len(records)} runs)")
        failed = [n for n in ran if status[n][0]]
        if failed:
            fail(f"claim runs failed: {', '.join(failed)} (see {page})")
    except SuiteError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
