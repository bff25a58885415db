"""Claim check: run a paper's method and its baselines over seeds (Hydra multiruns), write its results page.

``python -m suite.claim <slug> [extra overrides]`` (``make claim METHOD=<slug>``) reads ``conf/claim/<slug>.yaml``::

    runs:                       # method and baselines, same budget
      - {name: gdn, overrides: "model.mixer=gdn"}
      - {name: softmax, overrides: "model.mixer=softmax"}
    seeds: [0, 1, 2]                        # an entry may set its own `seeds:` (e.g. one seed for an exact solve)
    overrides: "trainer.max_epochs=20"      # applied to every run
    metrics: [test/loss, test/acc]          # table columns
    logger: csv                             # logger group of the runs under --no-wandb (with --wandb, the default:
                                            # logger=wandb, CSV + wandb offline; see "wandb" below)
    claims: [...]                           # the claims, declared before the runs (suite.claims)
    report: reports.<slug>:claim_report     # hook(records, spec, out_dir) -> suite.claims.HookResult (data)
    budget: {paper: {model: ..., steps: ..., data: ...}, here: {...}}   # the budget table on the page
    sizing_metric: val/loss                 # the validation curve convergence is judged on (suite.stats.converged)
    sizing_higher_is_better: false
    converge: {rel: 0.01}                   # or {tol: <absolute>}: the convergence tolerance over the last 20%
    evaluate: best                          # test the best-validation checkpoint (default) or `last`, with
                                            # `evaluate_why:` (the paper's protocol)
    data_files: [quant_calibration.json]    # small files a hook reads from the run folders, kept in the data file
    sizing_patience: 12                     # optional, runs ended by early stopping: converged = no new best in the
                                            # last 12 validations (suite.report.patience_plateau)
    sizing_untrained: {exact: "exact score, nothing trained"}   # optional: entries with nothing to converge
                                            # (their sizing row reads n/a, with the reason)
    headline:                               # optional: the weak-baseline rule's settings (defaults in brackets)
      start: val/acc                        # compared at step 0 and at the end [sizing_metric]
      metric: test/acc                      # compared with the reference [start's final value]
      higher_is_better: true                # [sizing_higher_is_better]
      baselines: [softmax]                  # [every entry but the first]
      reference: {value: 0.1, what: chance} # or {entry: <run>} or {metric: test/<key of the same run>}; [none]

The weak-baseline rule (:mod:`suite.report`): every entry runs with ``eval_at_start=true``, so its runs record the
headline validation metric of the untrained model (``val/acc@start`` in ``metrics.json``, :mod:`suite.start_metrics`)
beside its final value. The page lists each baseline's start, end and reference reading; a baseline that ends no
better than its start or than the reference (the 95% t interval on its mean gain reaches 0, or the gain is under 1%)
is weak, and any ``reproduced`` verdict read against it (a claim's entries after the first, or a hook verdict's
``against``) becomes ``inconclusive: weak baseline`` (:func:`suite.claims.apply_weak_baselines`), with a line under
the verdict table saying so. Runs from before the rule read "start not recorded" and change no verdict.

The page is built from the results data file (:mod:`suite.results_data`, ``docs/results/data/<slug>.json``) written
right after the runs; ``--report-only`` rebuilds it from the runs on disk or, without them, from that file alone.
``--jobs N`` runs the (entry, seed) pairs as N one-thread processes at once; ``--plan`` prints the seeds each
declared claim needs (:func:`plan`).

Each entry becomes ``python -m train -m experiment=<slug> <overrides> seed=0,1,2`` (``experiment=<its experiment:>``
where an entry, or the spec, names one: a cross-paper study); a failing entry is reported on
the page, not hidden. A hand-written reading of
the results lives in ``docs/results/<slug>_notes.md`` and is appended to the page on every (re)build.
``--only a,b`` (re)runs just those entries, in that order, and reuses the others (e.g. to split a claim over
parallel processes). ``--seeds 1,2`` (re)runs just those seeds of the selected entries, one process per seed,
each into the folder a full run gives it (``<entry>/<index in the entry's seeds>``), so one entry's seeds can be
split over processes too; its status is kept per seed and summed per entry.

wandb (``--wandb``, the default; ``--no-wandb`` turns it off): every run logs to wandb besides its CSV (offline
unless the user is logged in), named ``<slug>-<entry>-s<seed>`` in group ``<slug>`` with job type ``<entry>``; after
the page is built, a summary run ``<slug>-claims`` (job type ``summary``) holds the data file's claim table and
verdicts and its per-seed runs as ``wandb.Table``s and the page's plots (:func:`suite.loggers.log_claim_summary`,
under ``<out>/summary``), so ``wandb sync`` of the folder's offline runs gives a project that shows the comparison.

``--profile gpu`` (``make claim METHOD=<slug> PROFILE=gpu``) reads ``conf/claim/gpu/<slug>.yaml``: the CPU claim's
entries at a budget that converges on one GPU (``profile: gpu``; the CPU spec's report hook unless it names one), runs
in ``logs/claim/gpu/<slug>``, page ``docs/results/gpu/<slug>.md``; ``benchmarks/gpu_claims.sh`` runs its entries many
at once with ``--no-page`` (status only; the status file is updated under a lock) and writes ``machine.json`` beside
the runs, which the page names (:func:`machine_line`). ``--report-only`` with no runs on disk stops and leaves the page.

``--profile paper`` (``make claim METHOD=<slug> PROFILE=paper``) reads ``conf/claim/paper/<slug>.yaml`` instead: the
paper's own experiment (model size, schedule, real dataset, ``trainer=gpu``/``ddp``) with the same keys plus
``profile: paper``, ``published`` (the paper's numbers per entry and metric, ``null`` where not found),
``paper_params`` and ``gpu_hours``. Its runs go to ``logs/claim/paper/<slug>``, its page to
``docs/results/paper/<slug>.md``, and :func:`published_section` is appended to the page: the published numbers
beside the ones measured. Extra overrides win over the spec's (``ARGS="trainer=ddp trainer.devices=8"`` replaces a
profile's ``trainer=gpu``). With ``launcher=slurm`` among the overrides every entry's multirun is started at once:
each submits its seeds as SLURM jobs through Hydra's submitit launcher (requeue and resume from ``last.ckpt`` as for
``make slurm``) and waits for them; the page is built when all have finished. ``--report-only`` reads the same run
folders, so it works on a cluster's finished runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from core.errors import ConfigError, SuiteError
from suite import results_data, stats
from suite.claims import (
    ClaimResult,
    ClaimSpec,
    HookResult,
    apply_holm,
    apply_weak_baselines,
    default_paired,
    judge_claims,
    seed_values,
)
from suite.cli import fail
from suite.compare import RunRecord, aggregate, curve_keys, find_runs, markdown_table, plot_curves, plot_final, read_run
from suite.loggers import log_claim_summary
from suite.page import glossary_link, hook_sections, per_seed_section, summary_section, verdict_section
from suite.preflight import compose_run, preflight
from suite.report import baseline_section, budget_table, entry_curves, headline_spec, mean_curve
from suite.rundir import read_overrides

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("cpu", "paper", "gpu")
PAPER_KEYS = ("published", "paper_params", "gpu_hours")  # required in every conf/claim/paper/<slug>.yaml


def spec_path(slug: str, profile: str = "cpu") -> Path:
    """``conf/claim/<slug>.yaml`` (cpu, the default), ``conf/claim/paper/<slug>.yaml`` (paper) or
    ``conf/claim/gpu/<slug>.yaml`` (gpu)."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile {profile!r} must be one of {list(PROFILES)}")
    return ROOT / "conf" / "claim" / ("" if profile == "cpu" else profile) / f"{slug}.yaml"


def load_spec(slug: str, path: str | Path | None = None, profile: str = "cpu") -> dict:
    path = Path(path) if path else spec_path(slug, profile)
    if not path.exists():
        what = {"paper": "paper-scale profile", "gpu": "GPU profile"}.get(profile, "claim check")
        raise ConfigError(f"no {what} for '{slug}': {path} does not exist")
    try:
        spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # noqa: BLE001 - a YAML or interpolation error becomes one line naming the file
        raise ConfigError(f"{path}: {type(err).__name__}: {err}") from None
    if not spec.get("runs") or not all("name" in e for e in spec["runs"]):
        raise ConfigError(f"{path} must list runs, each with a name")
    headline_spec(spec)  # a malformed `headline:` fails here, before any run
    if profile != "cpu" and spec.get("profile") != profile:
        raise ConfigError(f"{path} must say `profile: {profile}`")
    if profile == "paper":
        missing = [k for k in PAPER_KEYS if k not in spec]
        if missing:
            raise ConfigError(f"{path} lacks {missing} (write null where the paper gives no number)")
        if spec["published"] is not None and not isinstance(spec["published"], dict):
            raise ConfigError(f"{path}: published must map entry names to {{metric: value}}")
        unknown = sorted(set(spec["published"] or {}) - {e["name"] for e in spec["runs"]})
        if unknown:
            raise ConfigError(f"{path}: published names {unknown}, which are not runs of the profile")
    cpu = spec_path(slug, "cpu")
    if profile != "cpu" and cpu.exists() and ("report" not in spec or "claims" not in spec):
        base = OmegaConf.to_container(OmegaConf.load(cpu), resolve=False)
        if "report" not in spec and base.get("report"):  # the CPU claim's hook (one reports/<slug>.py per slug)
            spec["report"] = base["report"]
        if "claims" not in spec and base.get("claims"):  # the CPU claim's declared claims whose entries run here
            names = {e["name"] for e in spec["runs"]}
            spec["claims"] = [c for c in base["claims"] if set(c.get("entries", [])) <= names]
    ClaimSpec.from_dict(slug, spec)  # malformed claims / converge / evaluate keys fail here, before any run
    return spec


def override_key(override: str) -> str:
    """The key a Hydra override sets (``+a.b=1`` -> ``a.b``; a group choice ``trainer=gpu`` -> ``trainer``)."""
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(*groups: list[str]) -> list[str]:
    """Concatenate override lists; a later override of the same key replaces an earlier one (Hydra refuses two
    choices of one config group, so ``ARGS="trainer=ddp"`` must replace a profile's ``trainer=gpu``)."""
    merged: dict[str, str] = {}
    for group in groups:
        for o in group:
            key = override_key(o)
            merged.pop(key, None)
            merged[key] = o
    return list(merged.values())


def uses_slurm(overrides: list[str]) -> bool:
    """True when the runs go through the submitit launcher (``launcher=slurm``)."""
    return any(override_key(o) == "launcher" and o.split("=", 1)[1] == "slurm" for o in overrides if "=" in o)


def entry_seeds(entry: dict, spec: dict) -> list:
    """The seeds an entry runs: its own ``seeds:`` or the spec's."""
    return list(entry.get("seeds", spec.get("seeds", [0])))


def entry_experiment(slug: str, entry: dict, spec: dict) -> str:
    """The experiment an entry runs: its own ``experiment:``, else the spec's, else the claim's slug (a cross-paper
    study's entries run different papers' experiments)."""
    return str(entry.get("experiment", spec.get("experiment", slug)))


def entry_command(
    slug: str, entry: dict, spec: dict, out: Path, extra: list[str], seed: object | None = None
) -> list[str]:
    """``python -m train -m experiment=<slug> ...`` for one entry: spec, entry and extra overrides (later wins).
    With ``seed``, that seed alone, into the subfolder a run of all the entry's seeds gives it (its index there;
    Hydra numbers the jobs of a sweep in the order of its values). An override that sweeps another key too would
    number the jobs across both sweeps: ``--seeds`` is for entries that sweep only the seed."""
    seeds = entry_seeds(entry, spec)
    if seed is None:
        pinned = [f"seed={','.join(str(s) for s in seeds)}"]
    else:
        pinned = [f"seed={seed}", f"hydra.sweep.subdir={seeds.index(seed)}"]
    overrides = merge_overrides(
        ["eval_at_start=true"],  # the step-0 value of the weak-baseline rule (a spec or entry may turn it off)
        evaluate_overrides(entry, spec),
        shlex.split(spec.get("overrides", "")),
        shlex.split(entry.get("overrides", "")),
        extra,
        [
            *pinned,
            *claim_logger(slug, entry, spec),
            "trainer.enable_progress_bar=false",
            "print_config=false",  # the config is in each run folder; a tree per run would bury the claim's log
            f"hydra.sweep.dir={out / entry['name']}",
        ],
    )
    return [sys.executable, "-m", "train", "-m", f"experiment={entry_experiment(slug, entry, spec)}", *overrides]


WANDB = "_wandb"  # the spec key `main` sets from --wandb/--no-wandb (absent: the spec's `logger`, csv by default)


def claim_logger(slug: str, entry: dict, spec: dict) -> list[str]:
    """The logger overrides of an entry's runs: with wandb (``--wandb``) CSV + wandb, grouped by claim and entry and
    named ``<slug>-<entry>-s<seed>``; else the spec's ``logger`` (csv)."""
    if not spec.get(WANDB):
        return [f"logger={spec.get('logger', 'csv')}"]
    name = entry["name"]
    return [
        "logger=wandb",
        f"group={slug}",
        f"logger.wandb.job_type={name}",
        "logger.wandb.system_metadata=false",  # ~2 s less a run; the data file records the machine and commit
        f"run_name={slug}-{name}-s${{seed}}",
    ]


def evaluate_overrides(entry: dict, spec: dict) -> list[str]:
    """The overrides that make a run test its best-validation checkpoint (the spec's ``evaluate: best``, the
    default): keep the checkpoint with the best sizing metric and test it. None for ``evaluate: last``, a spec with
    no sizing metric, or an entry that trains nothing (``sizing_untrained``)."""
    metric = spec.get("sizing_metric")
    if str(spec.get("evaluate", "best")) != "best" or not str(metric or "").startswith("val/"):
        return []  # a sizing metric that is no validation metric (a solver's train/nll) has no best-validation weights
    if entry["name"] in (spec.get("sizing_untrained") or {}):
        return []
    mode = "max" if spec.get("sizing_higher_is_better") else "min"
    return [
        f"callbacks.model_checkpoint.monitor={metric}",
        f"callbacks.model_checkpoint.mode={mode}",
        "test_weights=best",
    ]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


_LIVE: set[subprocess.Popen] = set()  # runs started by this process (several at once with --jobs)


def run_entry(
    slug: str, entry: dict, spec: dict, out: Path, extra: list[str], seed: object | None = None
) -> tuple[int, float]:
    cmd = entry_command(slug, entry, spec, out, extra, seed)
    print("$", shlex.join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    _LIVE.add(proc)
    try:
        rc = proc.wait()
    finally:  # the claim was stopped (SIGTERM/Ctrl-C): stop its run too, so nothing keeps writing into the folders
        _stop(proc)
        _LIVE.discard(proc)
    return rc, time.perf_counter() - t0


def run_entries_at_once(slug: str, entries: list[dict], spec: dict, out: Path, extra: list[str]) -> dict:
    """Start every entry's multirun together (each one submits its seeds to SLURM and waits for its jobs), then wait
    for all: ``{name: (exit code, wall seconds)}``. Stopping the claim stops the submitters; submitit then cancels
    their jobs, and a rerun resumes each job from its ``last.ckpt`` (``ckpt_path: last`` in ``launcher/slurm``)."""
    procs, t0 = {}, time.perf_counter()
    try:
        for entry in entries:
            cmd = entry_command(slug, entry, spec, out, extra)
            print("$", shlex.join(cmd[1:]), flush=True)
            procs[entry["name"]] = subprocess.Popen(cmd, cwd=ROOT)
        result = {}
        for name, proc in procs.items():
            rc = proc.wait()
            result[name] = (rc, time.perf_counter() - t0)
        return result
    finally:
        for proc in procs.values():
            _stop(proc)


def published_section(slug: str, spec: dict, records: list[RunRecord], argv: list[str]) -> str:
    """Markdown for a paper-profile page: the command, the expected GPU-hours, and the paper's published numbers
    beside the measured mean ± std over seeds (``—`` where no run finished, *not in the paper* where the profile has
    ``null``)."""
    args = f" ARGS={shlex.quote(' '.join(argv))}" if argv else ""
    lines = [
        "## Paper-scale profile",
        "",
        f"Produced by `make claim METHOD={slug} PROFILE=paper{args}`; spec `conf/claim/paper/{slug}.yaml`. "
        f"Expected GPU-hours (whole claim): {spec.get('gpu_hours', 'not given')}. "
        f"Paper's model size: {_count(spec.get('paper_params'))} parameters.",
        "",
        "## Published numbers beside this run",
        "",
    ]
    published = spec.get("published") or {}
    if not published:
        return "\n".join([*lines, "The paper publishes no number this profile can be compared with."])
    lines += ["| run | metric | paper | here (mean ± std, n) | here − paper |", "|---|---|---|---|---|"]
    for name, metrics in published.items():
        for metric, paper in (metrics or {}).items():
            vals = [r.metrics[metric] for r in records if r.name == name and metric in r.metrics]
            vals = [v for v in vals if math.isfinite(v)]
            here = "—"
            if vals:
                mean = statistics.fmean(vals)
                std = statistics.stdev(vals) if len(vals) > 1 else 0.0
                here = f"{mean:.4g} ± {std:.2g} ({len(vals)})"
            paper_cell = "not in the paper" if paper is None else f"{paper:.4g}"
            delta = f"{statistics.fmean(vals) - paper:+.3g}" if vals and paper is not None else "—"
            lines.append(f"| {name} | {metric} | {paper_cell} | {here} | {delta} |")
    return "\n".join(lines)


def _count(n: object) -> str:
    if not isinstance(n, (int, float)):
        return "not reported"
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M" if n >= 1e6 else f"{int(n):,}"


def point_page_at_profile(page: Path, slug: str, profile: str) -> str:
    """The page's text with its header's command and spec path naming ``profile`` (paper, gpu)."""
    text = page.read_text()
    text = text.replace(f"`make claim METHOD={slug}", f"`make claim METHOD={slug} PROFILE={profile}", 1)
    text = text.replace(f"`python -m suite.claim {slug}", f"`python -m suite.claim {slug} --profile {profile}", 1)
    return text.replace(f"spec: `conf/claim/{slug}.yaml`", f"spec: `conf/claim/{profile}/{slug}.yaml`", 1)


def finish_paper_page(page: Path, slug: str, spec: dict, records: list[RunRecord], argv: list[str]) -> None:
    """Point the page's header at the paper profile and append :func:`published_section`."""
    text = point_page_at_profile(page, slug, "paper")
    page.write_text(text.rstrip() + "\n\n" + published_section(slug, spec, records, argv) + "\n")


MACHINE_FILE = "machine.json"  # written beside the runs by a script that ran them elsewhere (benchmarks/gpu_claims.sh)


def machine_line(out: Path) -> str | None:
    """One line naming the machine the runs came from and the wall time of the script that ran them, read from
    ``<out>/machine.json`` (device, host_cpus, torch, parallel, wall_s, date); None without one."""
    try:
        m = json.loads((out / MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict):
        return None
    parts = [f"runs made on **{m.get('device', 'an unnamed machine')}**"]
    if m.get("host_cpus"):
        parts.append(f"{m['host_cpus']} CPU cores")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    if m.get("parallel"):
        parts.append(f"up to {m['parallel']} runs at once on the one device")
    if m.get("wall_s") is not None:
        parts.append(f"**{float(m['wall_s']) / 60:.1f} minutes** wall for all of them")
    if m.get("date"):
        parts.append(f"on {m['date']}")
    return "Machine: " + ", ".join(parts) + f" (`{MACHINE_FILE}` beside the runs)."


def data_machine_line(data: dict | None) -> str | None:
    """The machine line from the data file's ``machine`` (where the runs were made: a page rebuilt on a clean clone
    names it as the page built after the runs did), or None without one."""
    m = (data or {}).get("machine")
    if not isinstance(m, dict):
        return None
    if m.get("device") not in (None, "CPU"):  # written from a machine.json by the script that ran them elsewhere
        parts = [f"runs made on **{m['device']}**"]
        parts += [f"{m['host_cpus']} CPU cores"] if m.get("host_cpus") else []
    else:
        parts = [f"runs made on **{m.get('cpus', '?')} CPU cores**"]
    parts += [f"torch {m['torch']}"] if m.get("torch") else []
    parts += [f"Python {m['python']}"] if m.get("python") else []
    parts += [f"up to {m['parallel']} runs at once"] if m.get("parallel") else []
    return "Machine: " + ", ".join(parts) + "."


SEED_KEY = "{name}@seed={seed}"  # per-seed status of a `--seeds` run, beside the entry's summed status
EARLIER = "*"  # the seed key that keeps a whole-entry run's status once one of its seeds is rerun alone


def split_seeds(status: dict, name: str) -> list[str]:
    """The seeds of ``name`` with a status of their own (``--seeds`` runs; ``*``: the earlier whole-entry run)."""
    prefix = SEED_KEY.format(name=name, seed="")
    return [k[len(prefix) :] for k in status if k.startswith(prefix)]


def record_status(
    status: dict, name: str, seed: object | None, result: tuple[int, float], seeds: list | None = None
) -> dict:
    """Record ``(exit code, wall seconds)`` of a run of ``name``. A whole-entry run (``seed`` None) replaces the
    entry's status and drops its per-seed ones. A one-seed run keeps its own status and, on the first one, the
    earlier whole-entry status (under seed ``*``: its other seeds still come from that run), until every one of the
    entry's ``seeds`` has a status of its own; the entry's status becomes the worst exit code and the summed wall
    time over those."""
    status = dict(status)
    if seed is None:
        for s in split_seeds(status, name):
            del status[SEED_KEY.format(name=name, seed=s)]
        status[name] = result
        return status
    if not split_seeds(status, name) and name in status:
        status[SEED_KEY.format(name=name, seed=EARLIER)] = status[name]
    status[SEED_KEY.format(name=name, seed=seed)] = result
    if seeds is not None and {str(s) for s in seeds} <= set(split_seeds(status, name)):
        status.pop(SEED_KEY.format(name=name, seed=EARLIER), None)  # every seed rerun: the earlier run is gone
    per = [status[SEED_KEY.format(name=name, seed=s)] for s in split_seeds(status, name)]
    status[name] = (max(rc for rc, _ in per), sum(t for _, t in per))
    return status


@contextlib.contextmanager
def status_lock(path: Path):
    """Hold an exclusive lock on ``<status file>.lock`` while a process reads, updates and writes the status: claim
    processes split with ``--only`` / ``--seeds`` finish at the same moment on a machine that runs many at once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_status(path: Path, status: dict) -> None:
    """Write the status file atomically: a claim split over processes reads it while another one writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, indent=1))
    os.replace(tmp, path)


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


def _override_values(overrides: list[str]) -> dict[str, object]:
    """``{key: value}`` of the overrides that set one value (sweeps left out), values as Hydra parses them, so
    ``eval_at_start=true`` as typed and ``eval_at_start=True`` as a multirun job saves it compare equal."""
    parser = OverridesParser.create()
    values: dict[str, object] = {}
    for o in overrides:
        try:
            parsed = parser.parse_override(o)
        except Exception:  # noqa: BLE001 - an override Hydra cannot parse compares as its text
            values[override_key(o)] = o.split("=", 1)[-1]
            continue
        if not parsed.is_sweep_override():
            values[override_key(o)] = parsed.value()
    return values


def stale_runs(slug: str, spec: dict, records: list[RunRecord], extra: list[str]) -> dict[Path, str]:
    """The runs on disk that the spec, as it reads now, would not have made: ``{run folder: why}``. A run is stale
    when its seed is not one of its entry's seeds, or when an override the spec gives the entry (its ``overrides``, the
    entry's, the best-checkpoint ones, the experiment) is missing from the run or set to another value (a claim
    redesigned since the runs, whose folders still hold runs of an earlier design). A key the command line sets
    (``extra``) is the user's choice for this call and is not checked."""
    entries = {e["name"]: e for e in spec["runs"]}
    mine = {override_key(o) for o in extra}
    stale: dict[Path, str] = {}
    for r in records:
        entry = entries.get(r.name)
        if entry is None:
            continue
        if r.seed is not None and r.seed not in entry_seeds(entry, spec):
            stale[r.path] = f"seed {r.seed} is not one of the entry's seeds {entry_seeds(entry, spec)}"
            continue
        made = read_overrides(r.path)
        if made is None:
            continue  # a run folder without Hydra's record (copied by hand) cannot be checked
        want = merge_overrides(
            [f"experiment={entry_experiment(slug, entry, spec)}"],
            evaluate_overrides(entry, spec),
            shlex.split(spec.get("overrides", "")),
            shlex.split(entry.get("overrides", "")),
        )
        have = _override_values(made)
        for key, value in _override_values(want).items():
            if key in mine or key.startswith("hydra."):  # Hydra keeps hydra.* in .hydra/hydra.yaml, not here
                continue
            if key not in have:
                stale[r.path] = f"made without {key}={value!r}"
                break
            if have[key] != value:
                stale[r.path] = f"made with {key}={have[key]!r}, the spec gives {value!r}"
                break
    return stale


def _call_hook(hook: str, records: list[RunRecord], spec: ClaimSpec, folder: Path) -> tuple[HookResult, str]:
    """Run the spec's report hook, always as ``hook(records, spec, out_dir)``: ``(its HookResult, a failure line or
    "")``. A failing hook, or one that returns anything but data, is reported on the page; the declared claims'
    verdicts are never lost to it."""
    mod, fn = hook.split(":")
    try:
        out = getattr(importlib.import_module(mod), fn)(records, spec, folder)
    except Exception as err:  # noqa: BLE001 - a broken report hook must not lose the verdicts of the declared claims
        return HookResult(), f"Report hook `{hook}` failed: {type(err).__name__}: {err}"
    if not isinstance(out, HookResult):
        return HookResult(), f"Report hook `{hook}` returned {type(out).__name__}, not a HookResult: nothing shown"
    return out, ""


def judge_page(
    spec: ClaimSpec, records: list[RunRecord], folder: Path
) -> tuple[list[ClaimResult], list[str], HookResult, str, dict, list[str]]:
    """Everything a page states, as data: ``(verdicts, weak-baseline notes, the hook's result, the hook's failure
    line or "", the convergence per entry, the baseline section's lines)``.

    The order: the convergence rule on every entry; the hook (which may replace an entry's convergence reading with
    stronger evidence, mark a claim's phenomenon absent, and add verdicts); the declared claims judged with that;
    the weak-baseline rule; Holm's correction across the primary claims."""
    convergence = spec.convergence(records)
    weak_lines, weak = baseline_section(records, spec.raw)
    hook_md = ""
    result = HookResult()
    if spec.get("report"):
        result, hook_md = _call_hook(spec["report"], records, spec, folder)
    convergence = {**convergence, **result.convergence}
    verdicts = judge_claims(spec.claims, records, convergence, result.absent)
    own = {v.id: v for v in result.verdicts}
    verdicts = [own.pop(v.id, v) for v in verdicts] + list(own.values())
    verdicts = apply_holm(sorted(verdicts, key=lambda v: not v.primary))  # the paper's headline claims first
    verdicts, weak_notes = apply_weak_baselines(verdicts, weak)  # after Holm: a flip never shrinks the family
    return verdicts, weak_notes, result, hook_md, convergence, weak_lines


def write_page(
    slug: str,
    spec: dict,
    records: list[RunRecord],
    status: dict,
    out: Path,
    argv: list[str],
    page: Path | None = None,
    *,
    data: dict | None = None,
) -> Path:
    """Write the claim page from ``records`` (the runs, as read back from the data file) and return its path.

    The answer comes first (one sentence, a short table of every claim with its interval and the paper's, the scale
    run beside the paper's), then the full verdict table, the per-seed values behind it, the runs, final metrics,
    budget, convergence, baselines, the hook's tables and figures, and the hand-written notes (``<page>_notes.md``).
    ``data``: the results data file's content, whose ``claims`` key receives the verdicts."""
    page = page or ROOT / "docs" / "results" / f"{slug}.md"
    cspec = spec if isinstance(spec, ClaimSpec) else ClaimSpec.from_dict(slug, spec)
    raw = cspec.raw
    shown_out = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out.name  # no machine paths in pages
    page.parent.mkdir(parents=True, exist_ok=True)
    verdicts, weak_notes, result, hook_md, convergence, weak_lines = judge_page(cspec, records, page.parent)
    if data is not None:
        data["claims"] = [v.to_dict() for v in verdicts]
    keys, table = aggregate(records, raw.get("metrics"))
    plot = plot_final(records, keys, page.parent / f"{slug}.png") if records else None
    wanted = [t for v in verdicts for t in v.metric.split() if "/" in t]  # the curves of what the claims read
    wanted += [cspec.sizing_metric or "", "train/loss"]
    curves_png = page.parent / f"{slug}_curves.png"
    curves = (
        plot_curves(records, curve_keys(records, wanted), curves_png, shared=False, max_panels=12) if records else None
    )
    data_rel = results_data.data_path(page).relative_to(page.parent)
    made = (data or {}).get("written") or datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = (data or {}).get("commit")
    glossary = glossary_link(page, ROOT / "docs" / "results")
    lines = [
        f"# Claim check: {slug}",
        "",
        *summary_section(verdicts, raw.get("budget"), glossary),
        "",
        f"Produced by `make claim METHOD={slug}{(' ARGS=' + shlex.quote(' '.join(argv))) if argv else ''}` "
        f"(`python -m suite.claim {slug}{(' ' + ' '.join(argv)) if argv else ''}`) on {made}"
        f"{f' at commit `{commit[:12]}`' if commit else ''}; spec: `conf/claim/{slug}.yaml`; runs in `{shown_out}`; "
        f"per-seed data: [`{data_rel}`]({data_rel}) (`make claim METHOD={slug} ARGS=--report-only` rebuilds this "
        "page from it).",
        f"Seeds: {raw.get('seeds', [0])}. Every run uses the same budget: `{raw.get('overrides', '')}`. Verdicts read "
        + (
            "the test metrics of the best-validation checkpoint (on the sizing metric)."
            if cspec.evaluate == "best"
            else f"the test metrics of the final weights ({raw.get('evaluate_why', 'the paper scores the last')})."
        ),
        *([line] if (line := machine_line(out) or data_machine_line(data)) else []),
        "",
        *verdict_section(verdicts, weak_notes, glossary=glossary),
    ]
    if hook_md:
        lines += ["", hook_md]
    seeds = per_seed_section(verdicts)
    if seeds:
        lines += ["", *seeds]
    lines += ["", "## Runs", "", "| name | overrides | status | wall time |", "|---|---|---|---|"]
    for entry in raw["runs"]:
        rc, secs = status.get(entry["name"], (None, None))
        state = "reused" if rc is None else ("ok" if rc == 0 else f"FAILED (exit {rc})")
        if rc is None and not any(r.name == entry["name"] for r in records):
            state = "not run (no runs on disk)"
        wall = "—" if secs is None else f"{secs:.0f} s"
        split = split_seeds(status, entry["name"])
        if split and secs is not None:
            alone = sorted((s for s in split if s != EARLIER), key=lambda s: (len(s), s))  # numeric order
            earlier = "an earlier run of all seeds and " if EARLIER in split else ""
            wall += f" (sum of {earlier}one-seed runs of seed{'s' * (len(alone) > 1)} {', '.join(alone)})"
        own_seeds = f" (seeds {entry['seeds']})" if "seeds" in entry else ""
        lines.append(f"| {entry['name']} | `{entry.get('overrides', '')}`{own_seeds} | {state} | {wall} |")
    most = max((sum(r.name == n for r in records) for n in {r.name for r in records}), default=0)
    over = "mean ± std over seeds" if most >= 2 else "one seed per run: no spread"
    lines += ["", f"## Final metrics ({over})", "", markdown_table(keys, table) if records else "none"]
    if plot:
        lines += ["", f"![final metrics]({plot.name})", "", f"![curves of the metrics the claims read]({curves.name})"]
    lines += ["", "## Budget: the paper's and the one run here", "", budget_table(raw.get("budget"))]
    lines += ["", *sizing_section(slug, cspec, records, page.parent, convergence)]
    lines += ["", *weak_lines]
    lines += hook_sections(result)
    notes = page.parent / f"{page.stem}_notes.md"  # hand-written reading of the results, kept across reruns
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    page.write_text("\n".join(lines) + "\n")
    return page


def sizing_section(
    slug: str, spec: ClaimSpec, records: list[RunRecord], folder: Path, convergence: dict | None = None
) -> list[str]:
    """The page's convergence section: every entry's sizing curve (mean over seeds, ``<slug>_sizing.png``, the stop
    marked) and whether it converged (:meth:`ClaimSpec.convergence`, replaced by a hook's stronger evidence)."""
    metric = spec.sizing_metric
    head = ["## Convergence: has every entry converged?", ""]
    if not metric:
        return [*head, "No `sizing_metric` in the claim spec: the page cannot say whether the runs converged."]
    judged = convergence if convergence is not None else spec.convergence(records)
    trained = {n: v for n, v in judged.items() if n not in spec.untrained}
    shown_untrained = [n for n in dict.fromkeys(r.name for r in records) if n in spec.untrained]
    if not trained and not shown_untrained:
        return [*head, "No runs."]
    png = plot_sizing(
        [r for r in records if r.name in trained],
        metric,
        trained,
        folder / f"{slug}_sizing.png",
        patience=spec.patience,
        higher_is_better=spec.higher_is_better,
    )
    lines = [
        *head,
        f"Criterion: {spec.rule_text()}. A verdict whose entries did not converge reads `inconclusive: underfit`.",
        "",
        "| entry | converged | reading |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'yes' if ok else 'no'} | {why} |" for name, (ok, why) in trained.items()]
    lines += [f"| {name} | n/a | trains nothing: {spec.untrained[name]} |" for name in shown_untrained]
    if png:
        lines += ["", f"![sizing curves]({png.name})"]
    return lines


def plot_sizing(
    records: list[RunRecord],
    metric: str,
    judged: dict,
    out: Path,
    *,
    patience: int | None = None,
    higher_is_better: bool = False,
) -> Path | None:
    """Mean-over-seeds ``metric`` curve per entry; a dotted vertical line marks the stop (the last logged step), and a
    thick segment over the last 20% of training sits at the final value: solid when the entry plateaued, dashed not.
    With ``patience`` (runs ended by early stopping) the thick segment spans the last ``patience`` validations and a
    star marks the best point of the mean curve (the weights a best-validation test scores, up to seed spread).
    Where fewer seeds than the entry's logged a step (seeds that early stopping ended sooner), the curve is drawn
    thin: that tail is the mean of the remaining seeds only."""
    seeds = {n: entry_curves(records, n, metric) for n in judged}
    mean = {n: mean_curve(c, counts=True) for n, c in seeds.items()}
    mean = {n: c for n, c in mean.items() if c}
    if not mean:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    stops = set()
    thin_tails = False
    for i, (name, curve) in enumerate(mean.items()):
        xs, ys, ns = zip(*curve, strict=True)
        full = max(j for j, n in enumerate(ns) if n == len(seeds[name])) + 1 if len(seeds[name]) in ns else len(xs)
        marker = "." if len(xs) < 30 else None
        ax.plot(xs[:full], ys[:full], color=f"C{i % 10}", lw=1.2, marker=marker, label=name[:30])
        if full < len(xs):  # the seeds that ran on: their mean, thin
            ax.plot(xs[full - 1 :], ys[full - 1 :], color=f"C{i % 10}", lw=0.6, alpha=0.6)
            thin_tails = True
        x0 = xs[-1] - 0.2 * (xs[-1] - xs[0]) if patience is None else xs[max(len(xs) - 1 - patience, 0)]
        ax.hlines(ys[-1], x0, xs[-1], colors=f"C{i % 10}", lw=3, linestyles="solid" if judged[name][0] else "dashed")
        if patience is not None:
            best = (max if higher_is_better else min)(range(len(ys)), key=ys.__getitem__)
            ax.plot(xs[best], ys[best], marker="*", ms=9, color=f"C{i % 10}")
        stops.add(xs[-1])
    for s in stops:
        ax.axvline(s, color="gray", ls=":", lw=1)
    span = "last 20%" if patience is None else f"last {patience} validations; star: best"
    tails = "; thin: fewer seeds" if thin_tails else ""
    ax.set_xlabel(f"step (dotted: stop; thick: {span}, solid = plateaued{tails})")
    ax.set_title(f"sizing: {metric}, mean over seeds", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def longest_first(pairs: list[tuple[dict, object]], spec: dict, status: dict) -> list[tuple[dict, object]]:
    """``(entry, seed)`` pairs ordered by the wall time an earlier run of the entry took per seed (longest first, so
    that two workers finish together); entries never run keep the spec's order, ahead of the timed ones (their cost
    is unknown). The sort is stable."""

    def cost(pair: tuple[dict, object]) -> float:
        entry = pair[0]
        rc_secs = status.get(entry["name"])
        if not rc_secs or rc_secs[1] is None:
            return math.inf
        return float(rc_secs[1]) / max(len(entry_seeds(entry, spec)), 1)

    return sorted(pairs, key=cost, reverse=True)


def run_pairs(
    slug: str,
    pairs: list[tuple[dict, object]],
    spec: dict,
    out: Path,
    extra: list[str],
    status_file: Path,
    *,
    jobs: int,
) -> list[str]:
    """Run ``(entry, seed)`` pairs (``seed`` None: all of the entry's seeds in one multirun), at most ``jobs`` at
    once, recording each result in the status file under its lock; returns the failed runs. Stopping the claim
    stops every run it started (``run_entry`` terminates its process when its wait is interrupted)."""
    import concurrent.futures as cf

    failures: list[str] = []

    def one(entry: dict, seed: object) -> None:
        name = entry["name"]
        result = run_entry(slug, entry, spec, out, extra, seed)
        if result[0]:  # this process's own runs decide its exit code, not another process's seeds
            failures.append(name if seed is None else SEED_KEY.format(name=name, seed=seed))
        with status_lock(status_file):  # re-read: another invocation may have written meanwhile
            status = load_status(status_file)
            status = record_status(status, name, seed, result, entry_seeds(entry, spec))
            write_status(status_file, status)

    if jobs <= 1:
        for entry, seed in pairs:
            one(entry, seed)
        return failures
    names = [e["name"] for e in spec["runs"]]
    later = [p for p in pairs if depends_on(p[0], names)]  # entries that load another entry's checkpoint run after

    def source_failed(entry: dict, seed: object) -> bool:
        return any(n in failures or SEED_KEY.format(name=n, seed=seed) in failures for n in depends_on(entry, names))

    for wave in ([p for p in pairs if p not in later], later):
        skipped = [p for p in wave if source_failed(*p)]  # never load the checkpoint of a run that failed
        failures += [
            f"{SEED_KEY.format(name=e['name'], seed=seed)} (not run: its source failed)" for e, seed in skipped
        ]
        wave = [p for p in wave if p not in skipped]
        pool = cf.ThreadPoolExecutor(max_workers=jobs)
        try:
            futures = [pool.submit(one, entry, seed) for entry, seed in wave]
            for f in cf.as_completed(futures):
                f.result()
        finally:
            for proc in list(_LIVE):
                _stop(proc)
            pool.shutdown(wait=True, cancel_futures=True)
    return failures


def depends_on(entry: dict, names: list[str]) -> list[str]:
    """The entries whose run folders ``entry`` reads (an override naming ``../<entry>/``, e.g. a test-only entry
    loading its training entry's checkpoint): with ``--jobs`` they run first."""
    text = str(entry.get("overrides", ""))
    return [n for n in names if n != entry["name"] and f"/../{n}/" in text]


def plan(spec: ClaimSpec, records: list[RunRecord], status: dict) -> list[str]:
    """``--plan``: per declared claim, the spread seen in ``records`` (the sd of the paired differences, or the
    larger side's sd for Welch), the seeds a 95% interval of half-width ``delta`` needs, and what they cost in CPU
    time at the wall time per seed the entries took (from the status file or the data file)."""

    def per_seed(name: str) -> float | None:
        rc_secs = status.get(name)
        n = len({str(r.seed) for r in records if r.name == name})
        return None if not rc_secs or rc_secs[1] is None or not n else float(rc_secs[1]) / n

    rows = [["claim", "delta", "test", "n now", "spread", "seeds needed", "CPU time"]]
    for c in spec.claims:
        a, b = (seed_values(records, e, m) for e, m in zip(c.entries, c.metrics, strict=True))
        paired = c.paired if c.paired is not None else default_paired(records, *c.entries)
        test = "paired" if paired else "Welch"
        try:
            iv = stats.interval(a, b, paired=paired, sign=c.sign)
        except ValueError as err:
            rows.append([c.id, f"{c.delta:g}", test, f"{len(a)}/{len(b)}", f"no spread yet ({err})", "—", "—"])
            continue
        sd = stats.spread_for_plan(iv, list(a.values()), list(b.values()))
        need = stats.seeds_for_half_width(sd, c.delta, paired=paired) if c.delta > 0 else None
        costs = [per_seed(e) for e in set(c.entries)]
        more = None if need is None else max(need - min(len(a), len(b)), 0)  # seeds to add to those on disk
        cpu = "—" if more is None or None in costs else f"{more * sum(costs) / 60:.0f} min for {more} more"
        needed = "no delta declared" if c.delta <= 0 else (str(need) if need else "> 1000")
        rows.append([c.id, f"{c.delta:g}", test, f"{len(a)}/{len(b)}", f"{sd:.3g}", needed, cpu])
    if len(rows) == 1:
        return ["no declared claims in the spec: nothing to plan"]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def select_entries(slug: str, spec: dict, only: str | None) -> list[dict]:
    """The spec's entries that ``--only`` names, in the order given there (so a queue split over processes can put
    its slow entries first); every entry, in the spec's order, without ``--only``. An unknown name is a ConfigError."""
    by_name = {e["name"]: e for e in spec["runs"]}
    if only is None:
        return list(spec["runs"])
    wanted = list(dict.fromkeys(n.strip() for n in only.split(",") if n.strip()))
    unknown = sorted(set(wanted) - set(by_name))
    if unknown:
        raise ConfigError(f"--only names {unknown} are not runs of {slug} (runs: {', '.join(by_name)})")
    return [by_name[n] for n in wanted]


def select_seeds(slug: str, spec: dict, entries: list[dict], seeds: str | None) -> dict[str, list]:
    """``--seeds``: per selected entry, the named seeds it runs (in the order given; an entry whose own ``seeds:``
    lacks one skips it). ``{}`` without ``--seeds``. A seed that no selected entry runs is a ConfigError."""
    if seeds is None:
        return {}
    wanted = []
    for tok in dict.fromkeys(t.strip() for t in seeds.split(",") if t.strip()):
        try:
            wanted.append(int(tok))
        except ValueError:
            raise ConfigError(f"--seeds takes comma-separated integers, got {tok!r}") from None
    if not wanted:
        raise ConfigError("--seeds names no seed")
    picked = {e["name"]: [s for s in wanted if s in entry_seeds(e, spec)] for e in entries}
    missing = sorted(set(wanted) - {s for v in picked.values() for s in v})
    if missing:
        raise ConfigError(f"--seeds {missing} are not seeds of the selected runs of {slug}")
    return {n: v for n, v in picked.items() if v}


# A profile's runs on one CPU process for one batch: `--smoke` (tests/suite/test_paper_profiles uses the same).
SMOKE_CPU = [
    "trainer=cpu",
    "trainer.devices=1",
    "trainer.num_nodes=1",
    "trainer.precision=32-true",
    "trainer.accumulate_grad_batches=1",
    "data.num_workers=0",
    "debug=fdr",
    "logger=csv",
]


def smoke(slug: str, spec: dict, profile: str, out: str | None, extra: list[str]) -> None:
    """``--smoke``: run one seed of the profile's smoke entry (``smoke: {entry, overrides}``, else its first entry) on
    CPU for one batch (``debug=fdr``) at the reduced width of ``smoke.overrides``, on the profile's real data, into
    ``logs/claim/<profile>-smoke/<slug>/``: the data layout, the packages and the code path, before booking GPUs.
    Never writes a page."""
    cfg = dict(spec.get("smoke") or {})
    names = [e["name"] for e in spec["runs"]]
    name = cfg.get("entry", names[0])
    if name not in names:
        raise ConfigError(f"smoke.entry={name} is not a run of the profile ({', '.join(names)})")
    entry = spec["runs"][names.index(name)]
    folder = Path(out or ROOT / "logs" / "claim" / f"{profile}-smoke" / slug).resolve()
    seed = entry_seeds(entry, spec)[0]
    base = compose_run(slug, entry_command(slug, entry, spec, folder, extra, seed)[4:])
    cpu = [o for o in SMOKE_CPU if o != "data.num_workers=0" or "num_workers" in (base.get("data") or {})]
    overrides = merge_overrides(shlex.split(str(cfg.get("overrides", ""))), cpu, extra)
    missing = preflight(slug, {name: entry_command(slug, entry, spec, folder, overrides, seed)[4:]})
    if missing:
        raise SuiteError(missing)
    rc, secs = run_entry(slug, entry, spec, folder, overrides, seed)
    run = folder / name / str(entry_seeds(entry, spec).index(seed))
    if rc:
        fail(f"smoke of the {profile} profile of {slug} failed (exit {rc}, entry {name}); see {run}")
    print(f"smoke of the {profile} profile of {slug} passed in {secs:.0f} s (entry {name}, seed {seed}): {run}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run a paper's claim check and write docs/results/<slug>.md")
    parser.add_argument("slug")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides applied to every run")
    parser.add_argument("--out", default=None, help="run folder (default: logs/claim/<slug>)")
    parser.add_argument("--spec", default=None, help="claim spec (default: conf/claim/<slug>.yaml)")
    parser.add_argument("--page", default=None, help="results page (default: docs/results/<slug>.md)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the page from existing runs")
    parser.add_argument(
        "--profile",
        default="cpu",
        choices=PROFILES,
        help="cpu: conf/claim/<slug>.yaml (default); paper: the "
        "paper's own experiment, conf/claim/paper/<slug>.yaml; gpu: the CPU claim at a budget that converges on one "
        "GPU, conf/claim/gpu/<slug>.yaml (runs in logs/claim/gpu/<slug>, page docs/results/gpu/<slug>.md)",
    )
    parser.add_argument(
        "--no-page",
        action="store_true",
        help="run and record status only (many claim processes at once: build the page afterwards with --report-only)",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated run names to (re)run; the others are reused from disk"
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds to (re)run of the selected entries, one process each "
        "(into the folders a full run uses), e.g. to split one entry's seeds over processes",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check a profile on this machine's CPU before booking GPUs: one seed of "
        "its smoke entry, a few steps at reduced width (the spec's `smoke: overrides`), into logs/claim/<profile>-"
        "smoke/<slug>; no page",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="run (entry, seed) pairs as this many parallel one-thread processes, longest first (make claim JOBS=2)",
    )
    parser.add_argument(
        "--wandb",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log the runs to wandb besides CSV (offline unless logged in), grouped by claim and entry, and a summary "
        "run with the claim table and verdicts after the page is built (default: on; --no-wandb: CSV only)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print, from the runs on disk or the data file, the seeds each declared "
        "claim needs for a 95%% interval of half-width delta and what that costs; runs nothing",
    )
    args = parser.parse_intermixed_args(argv)
    # unwind through run_entry's cleanup; the caller's handler comes back when main returns (tests call main in-process)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        spec = load_spec(args.slug, args.spec, args.profile)
        if args.smoke:
            return smoke(args.slug, spec, args.profile, args.out, args.overrides)
        spec = {**spec, WANDB: args.wandb}
        if args.plan:
            out = Path(
                args.out or ROOT / "logs" / "claim" / ("" if args.profile == "cpu" else args.profile) / args.slug
            )
            disk, status = collect(spec, out.resolve()), load_status(out.resolve() / "claim_status.json")
            stale = stale_runs(args.slug, spec, disk, args.overrides)
            disk = [r for r in disk if r.path not in stale]  # plan from runs of the design the spec holds now
            page = Path(
                args.page
                or ROOT / "docs" / "results" / ("" if args.profile == "cpu" else args.profile) / f"{args.slug}.md"
            )
            if not disk and results_data.data_path(page).exists():
                data = results_data.load(results_data.data_path(page))
                disk, status = results_data.records_from(data), results_data.status_from(data)
            print("\n".join(plan(ClaimSpec.from_dict(args.slug, spec), disk, status)))
            return None
        if args.jobs < 1:
            raise ConfigError(f"--jobs {args.jobs} must be >= 1")
        if (
            args.jobs > 1
            and args.seeds is None
            and uses_slurm([*shlex.split(spec.get("overrides", "")), *args.overrides])
        ):
            raise ConfigError("--jobs runs local processes; with launcher=slurm every seed is already a job")
        paper = args.profile == "paper"
        default_out = ROOT / "logs" / "claim" / ("" if args.profile == "cpu" else args.profile) / args.slug
        out = Path(args.out or default_out).resolve()
        status_file = out / "claim_status.json"  # exit code + wall time per run, kept for --report-only
        status = load_status(status_file)
        todo = select_entries(args.slug, spec, args.only)
        picked = select_seeds(args.slug, spec, todo, args.seeds)
        if args.seeds is not None:
            todo = [e for e in todo if e["name"] in picked]
        failures = []
        slurm = uses_slurm([*shlex.split(spec.get("overrides", "")), *args.overrides])
        if not args.report_only and not slurm and args.profile != "cpu":  # what is missing, before anything runs
            missing = preflight(
                args.slug, {e["name"]: entry_command(args.slug, e, spec, out, args.overrides)[4:] for e in todo}
            )
            if missing:
                raise SuiteError(missing)
        if not args.report_only and slurm and args.seeds is not None:
            raise ConfigError("--seeds splits local runs over processes; with launcher=slurm every seed is a job")
        if not args.report_only and slurm:
            results = run_entries_at_once(args.slug, todo, spec, out, args.overrides)
            out.mkdir(parents=True, exist_ok=True)
            with status_lock(status_file):
                status = load_status(status_file)
                for name, result in results.items():
                    status = record_status(status, name, None, result)
                write_status(status_file, status)
            failures = [n for n, (rc, _) in results.items() if rc]
        elif not args.report_only:
            pairs = [(e, seed) for e in todo for seed in picked.get(e["name"], [None])]
            if args.jobs > 1:  # (entry, seed) pairs as one-thread processes, longest first
                pairs = longest_first(
                    [(e, seed) for e in todo for seed in picked.get(e["name"], entry_seeds(e, spec))], spec, status
                )
            extra = [*args.overrides, "num_threads=1"] if args.jobs > 1 else args.overrides
            failures = run_pairs(args.slug, pairs, spec, out, extra, status_file, jobs=args.jobs)
            status = load_status(status_file)
        if args.no_page:
            if failures:
                fail(f"claim runs failed: {', '.join(failures)} (no page written: --no-page)")
            return
        page_path = Path(args.page).resolve() if args.page else None
        disk = collect(spec, out)
        if args.profile != "cpu" and page_path is None:  # never the CPU claim's page
            page_path = ROOT / "docs" / "results" / args.profile / f"{args.slug}.md"
            if failures or (not disk and not results_data.data_path(page_path).exists()):
                page_path = out / f"{args.slug}.md"  # never a page over docs/ from a failed run: beside the runs
        page_path = page_path or ROOT / "docs" / "results" / f"{args.slug}.md"
        data_file = results_data.data_path(page_path)
        stale = stale_runs(args.slug, spec, disk, args.overrides)
        if stale:
            path, why = next(iter(stale.items()))
            if args.report_only and data_file.exists():  # runs of another design: the page comes from the data file
                print(
                    f"note: {len(stale)} of the {len(disk)} runs under {out} were made under another design than the "
                    f"spec's (e.g. {path}: {why}); the page is rebuilt from {data_file} alone "
                    "(move those runs away, or rerun the claim)"
                )
                disk = []
            elif args.report_only:  # no data file: these runs are all there is
                print(
                    f"note: {len(stale)} of the {len(disk)} runs under {out} were made under another design than the "
                    f"spec's (e.g. {path}: {why}); no data file to prefer, the page is built from them"
                )
            else:
                print(
                    f"note: {len(stale)} runs under {out} left out: made under another design than the spec's "
                    f"(e.g. {path}: {why})"
                )
                disk = [r for r in disk if r.path not in stale]
        if disk:
            data = results_data.build(args.slug, spec, disk, status, profile=args.profile, root=ROOT, out=out)
            if args.report_only and data_file.exists():  # the runs were made then, at that commit, on that machine
                try:
                    made = results_data.load(data_file)
                    data.update({k: made[k] for k in ("written", "commit", "machine") if k in made})
                except results_data.DataFileError:
                    pass
        elif args.report_only and data_file.exists():  # a clean clone: the page rebuilds from its data file alone
            try:
                data = results_data.load(data_file)
            except results_data.DataFileError as err:
                raise ConfigError(str(err)) from None
            status = results_data.status_from(data)
        elif args.report_only:  # never blank a page that holds results
            raise ConfigError(
                f"--report-only found no runs under {out} and no data file {data_file}: the page was left as it is "
                "(run the claim, or unpack the run folders there first)"
            )
        else:
            data = results_data.build(args.slug, spec, [], status, profile=args.profile, root=ROOT, out=out)
        results_data.dumps(data)  # a value the file cannot hold fails here, before the page is replaced
        with tempfile.TemporaryDirectory(prefix="claim-data-") as tmp:
            paths = {(r.name, str(r.seed)): r.path for r in disk}
            records = results_data.records_from(data, Path(tmp), paths=paths)
            page = write_page(args.slug, spec, records, status, out, args.overrides, page_path, data=data)
            if disk and spec.get("data_files"):  # a hook may have written its data files beside the runs just now
                again = results_data.build(args.slug, spec, disk, status, profile=args.profile, root=ROOT, out=out)
                if [r.get("files") for r in again["runs"]] != [r.get("files") for r in data["runs"]]:
                    data = again
                    records = results_data.records_from(data, Path(tmp) / "again", paths=paths)
                    page = write_page(args.slug, spec, records, status, out, args.overrides, page_path, data=data)
            if paper:
                finish_paper_page(page, args.slug, spec, records, args.overrides)
            elif args.profile != "cpu":
                page.write_text(point_page_at_profile(page, args.slug, args.profile))
        results_data.write(data_file, data)
        print(f"wrote {page} ({len(records)} runs)")
        if args.wandb:
            plots = [page.parent / f"{args.slug}{end}.png" for end in ("", "_curves", "_sizing")]
            summary = log_claim_summary(data_file, out, plots)
            if summary is not None:
                print(f"wandb summary run: {summary}")
        if failures:
            fail(f"claim runs failed: {', '.join(failures)} (see {page})")
    except SuiteError as err:
        fail(str(err))
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
