"""Run claims' GPU profiles (``conf/claim/gpu/<slug>.yaml``) on one GPU machine, many small runs at once.

The CPU claims of small models are bound by the 60-minute rule, not by the models: one GPU with many CPU cores runs
dozens of them side by side. This script is what ``benchmarks/gpu_claims.sh`` runs there:

``run``   every (entry, seed) of the named GPU profiles as its own ``python -m suite.claim <slug> --profile gpu
          --only <entry> --seeds <seed> --no-page`` process, ``--parallel`` at a time (default: one per CPU core), in
          the spec's order (put the longest runs first), each ended at ``--deadline-s`` after the script started (an
          unfinished run shows as FAILED with its curve so far). Then writes ``machine.json`` beside each profile's
          runs (the device, cores, torch, concurrency, wall time: the page's ``Machine:`` line) and packs the run
          folders (configs, metrics, curves, step times; no checkpoints) into ``--pack`` (``.tar.gz``).
``pilot`` short runs (``--steps``) of a few entries of each profile at once, with ``callbacks=step_timer``: the
          wall time per training step under the same load as the real run, to size the profiles' step budgets.

Rebuild the pages where the archive is unpacked: ``make claim METHOD=<slug> PROFILE=gpu ARGS=--report-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

BENCH_SKIP = "runs claims on a GPU machine and needs a subcommand (run | pilot): benchmarks/gpu_claims.sh"
"""Why ``make bench`` does not run this script (the Makefile reads this line)."""
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.errors import SuiteError  # noqa: E402
from suite.claim import MACHINE_FILE, entry_seeds, load_spec, merge_overrides  # noqa: E402

GPU_OUT = ROOT / "logs" / "claim" / "gpu"
WALL: dict[str, float] = {}  # wall seconds of each finished process of the last run_pool


def device_info() -> dict:
    import torch

    info = {"host_cpus": os.cpu_count(), "torch": torch.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"] = f"one {props.name} ({props.total_memory / 2**30:.0f} GiB)"
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = "no CUDA device (CPU)"
    return info


def jobs_of(slugs: list[str], entries: set[str] | None = None, seeds: set[int] | None = None) -> list[tuple]:
    """(slug, entry, seed) of every run of the GPU profiles, in the specs' order, slugs interleaved by position so
    each profile's first (longest) entries start first; ``entries`` / ``seeds`` keep only those."""
    per = []
    for slug in slugs:
        spec = load_spec(slug, profile="gpu")
        per.append(
            [
                (slug, e["name"], s)
                for e in spec["runs"]
                for s in entry_seeds(e, spec)
                if (entries is None or e["name"] in entries) and (seeds is None or s in seeds)
            ]
        )
    out = []
    for i in range(max(map(len, per), default=0)):
        out += [p[i] for p in per if i < len(p)]
    return out


def run_pool(cmds: list[tuple[str, list[str]]], parallel: int, deadline: float, log_dir: Path) -> dict[str, int]:
    """Run the commands ``parallel`` at a time; kill whatever still runs at ``deadline`` (``time.monotonic``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    pending, running, codes = list(cmds), {}, {}
    started: dict[str, float] = {}
    WALL.clear()
    while pending or running:
        while pending and len(running) < parallel and time.monotonic() < deadline - 20:
            name, cmd = pending.pop(0)
            log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed when the process ends
            started[name] = time.monotonic()
            running[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log)
            print(
                f"{time.strftime('%H:%M:%S')} start {name} ({len(running)} running, {len(pending)} queued)", flush=True
            )
        for name, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                codes[name] = proc.returncode
                WALL[name] = time.monotonic() - started[name]
                log.close()
                del running[name]
                print(f"{time.strftime('%H:%M:%S')} end {name}: exit {proc.returncode}", flush=True)
        if time.monotonic() >= deadline:
            for proc, _ in running.values():
                proc.terminate()  # suite.claim stops its run and records the status
            for name, (proc, log) in running.items():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                codes[name] = proc.returncode
                log.close()
                print(f"{time.strftime('%H:%M:%S')} stopped at the deadline: {name}", flush=True)
            running = {}
            for name, _ in pending:
                codes[name] = None
                print(f"not started (deadline): {name}", flush=True)
            pending = []
        time.sleep(0.5)
    return codes


def pack(folders: list[Path], archive: Path) -> None:
    """The run folders without checkpoints (configs, metrics, CSV curves, step times, status, machine.json)."""
    archive.parent.mkdir(parents=True, exist_ok=True)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "/checkpoints" in info.name or info.name.endswith((".ckpt", ".pt")) else info

    with tarfile.open(archive, "w:gz") as tar:
        for folder in folders:
            if folder.exists():
                name = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else Path(folder.name)
                tar.add(folder, arcname=str(name), filter=keep)
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)


def cmd_run(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    root = Path(args.out_root).resolve()
    entries = set(args.entries.split(",")) if args.entries else None
    seeds = {int(s) for s in args.seeds.split(",")} if args.seeds else None
    jobs = jobs_of(args.slugs, entries, seeds)
    if not jobs:
        raise SystemExit("error: no run selected (check --entries / --seeds against the GPU profiles)")
    cmds = [
        (
            f"{slug}.{entry}.s{seed}",
            [
                sys.executable,
                "-m",
                "suite.claim",
                slug,
                "--profile",
                "gpu",
                "--only",
                entry,
                "--seeds",
                str(seed),
                "--no-page",
                "--out",
                str(root / slug),
                *args.overrides,
            ],
        )
        for slug, entry, seed in jobs
    ]
    print(
        f"{len(cmds)} runs of {', '.join(args.slugs)}, {args.parallel} at a time, deadline {args.deadline_s:.0f} s",
        flush=True,
    )
    codes = run_pool(cmds, args.parallel, t0 + args.deadline_s, root / "_logs")
    wall = time.monotonic() - t0
    info = {
        **device_info(),
        "parallel": args.parallel,
        "wall_s": round(wall, 1),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": len(cmds),
        "finished": sum(c == 0 for c in codes.values()),
        "failed_or_stopped": sorted(n for n, c in codes.items() if c not in (0, None)),
        "not_started": sorted(n for n, c in codes.items() if c is None),
    }
    for slug in args.slugs:
        (root / slug).mkdir(parents=True, exist_ok=True)
        (root / slug / MACHINE_FILE).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1), flush=True)
    if args.pack:
        pack([root / s for s in args.slugs] + [root / "_logs"], Path(args.pack))


def pilot_spec(slug: str) -> dict:
    """The GPU profile, or the CPU claim moved to the GPU (``trainer=gpu``) for a claim that has none yet."""
    try:
        return load_spec(slug, profile="gpu")
    except SuiteError:
        spec = load_spec(slug)
        spec["overrides"] = spec.get("overrides", "") + " trainer=gpu"
        return spec


def cmd_pilot(args: argparse.Namespace) -> None:
    """One short run per named entry (``slug:entry`` or every entry of a slug), all at once, with step timing."""
    t0 = time.monotonic()
    picks = []
    for item in args.slugs:
        slug, _, entry = item.partition(":")
        spec = pilot_spec(slug)
        names = [entry] if entry else [e["name"] for e in spec["runs"]]
        picks += [(slug, n) for n in names]
    picks = picks * max(1, args.copies)
    out = Path(args.out_root).resolve() if args.out_root else ROOT / "logs" / "gpu_pilot"
    cmds = []
    for i, (slug, name) in enumerate(picks):
        spec = pilot_spec(slug)
        entry = next(e for e in spec["runs"] if e["name"] == name)
        overrides = merge_overrides(
            shlex.split(spec.get("overrides", "")),
            shlex.split(entry.get("overrides", "")),
            args.overrides,
            [
                f"trainer.max_steps={args.steps}",
                "trainer.max_epochs=-1",
                "callbacks=step_timer",
                "callbacks.model_checkpoint=null",
                "logger=csv",
                "trainer.enable_progress_bar=false",
                f"trainer.val_check_interval={args.steps}",
                "trainer.check_val_every_n_epoch=null",
                f"hydra.run.dir={out / f'{slug}.{name}.{i}'}",
                "seed=0",
            ],
        )
        cmds.append((f"{slug}.{name}.{i}", [sys.executable, "-m", "train", f"experiment={slug}", *overrides]))
    codes = run_pool(cmds, len(cmds), t0 + args.deadline_s, out / "_logs")
    rows = []
    for name, _ in cmds:
        f = out / name / "step_times.json"
        t = json.loads(f.read_text()) if f.exists() else {}
        rows.append((name, codes.get(name), t.get("steps"), t.get("median_s"), t.get("fit_s"), WALL.get(name)))
    print(f"\npilot: {len(cmds)} runs at once, {args.steps} steps each; wall {time.monotonic() - t0:.0f} s")
    print(f"{'run':50s} exit steps median_ms  fit_s process_s (process - fit: start-up + test)")
    for name, code, steps, med, fit, wall in rows:
        med_ms = f"{1000 * med:9.2f}" if isinstance(med, float) else "        —"
        fit_s = f"{fit:6.1f}" if isinstance(fit, float) else "     —"
        wall_s = f"{wall:9.1f}" if isinstance(wall, float) else "        —"
        print(f"{name:50s} {code!s:>4} {steps!s:>5} {med_ms} {fit_s} {wall_s}")
    (out / "pilot.json").write_text(json.dumps({"info": device_info(), "rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the GPU profiles' entries, many at once")
    r.add_argument("slugs", nargs="+")
    r.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    r.add_argument("--deadline-s", type=float, default=420.0)
    r.add_argument("--pack", default=None, help="archive of the run folders (.tar.gz)")
    r.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides for every run")
    r.add_argument("--entries", default=None, help="comma-separated entries to run (default: all)")
    r.add_argument("--seeds", default=None, help="comma-separated seeds to run (default: each entry's)")
    r.add_argument("--out-root", default=str(GPU_OUT), help="runs go to <out-root>/<slug> (default logs/claim/gpu)")
    q = sub.add_parser("pilot", help="time a few steps of entries at once (step_times.json)")
    q.add_argument("slugs", nargs="+", help="slug or slug:entry")
    q.add_argument("--steps", type=int, default=150)
    q.add_argument("--copies", type=int, default=1, help="launch each pick this many times (load like the real run)")
    q.add_argument("--deadline-s", type=float, default=90.0)
    q.add_argument("--overrides", nargs="*", default=[])
    q.add_argument("--out-root", default=None, help="pilot runs go here (default logs/gpu_pilot)")
    args = p.parse_args(argv)
    (cmd_run if args.cmd == "run" else cmd_pilot)(args)


if __name__ == "__main__":
    main()
