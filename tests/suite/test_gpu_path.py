"""The GPU path for a bare GPU machine: ``make gpu-wheels`` builds a wheel folder that installs
with ``--no-index`` into a fresh target, from which the check's imports resolve; ``gpu_check.sh --bare --preflight``
passes on it; the GPU claim profiles load and compose; ``benchmarks/gpu_claims.sh`` runs, packs and rebuilds a page
(on the CPU here: ``--cpu``); the step timer leaves validation out of a step's time.

The wheel folder is fetched from PyPI (the package registry every install of the suite uses; pip's cache answers a
second time); nothing else here touches the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time

import lightning.pytorch as pl
import pytest
import torch

from core.errors import ConfigError
from suite.claim import load_spec, machine_line, spec_path
from suite.gpu_wheels import pins
from suite.preflight import compose_run
from tests.conftest import ROOT

GPU_SPECS = sorted(p.stem for p in (ROOT / "conf" / "claim" / "gpu").glob("*.yaml"))


def _pip_setting(name: str) -> str | None:
    """A pip setting as pip reads it (``PIP_<NAME>`` first, then its config files), or None."""
    env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
    if env is not None:
        return env
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", f"global.{name}"], capture_output=True, text=True, timeout=60
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def registry_unreachable(timeout: float = 5.0) -> str | None:
    """Why the package index pip downloads from cannot be reached (one line), or None when it can: a TCP connection
    to the index's host (or to the HTTPS proxy pip would use), an existing folder for a ``file://`` index."""
    import socket
    from urllib.parse import urlparse

    if (_pip_setting("no-index") or "").lower() in ("1", "true", "yes", "on"):
        return "pip is configured with no-index"
    url = _pip_setting("index-url") or "https://pypi.org/simple"
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return None if os.path.isdir(parsed.path) else f"{url} is not a folder"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") if parsed.scheme == "https" else None
    target = urlparse(proxy) if proxy else parsed
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=timeout).close()
    except OSError as err:
        return f"{'proxy ' if proxy else ''}{target.hostname}:{port} for {url}: {err}"
    return None


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    dest = tmp_path_factory.mktemp("gpu") / "whl"
    proc = subprocess.run(
        [sys.executable, "-m", "suite.gpu_wheels", "--dest", str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        why = registry_unreachable()  # pip may still have answered from a local wheel folder, so only now
        if why:
            pytest.skip(f"the package registry cannot be reached ({why}); make gpu-wheels downloads from it")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dest


def test_an_unreachable_registry_is_a_skip_with_its_reason(tmp_path):
    """With no network (here: an index on a closed local port, no local wheel folders, no retries) the tests that
    need the registry skip, naming it, as the SLURM tests do without a cluster; the others still run."""
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "5",
        "PIP_NO_CACHE_DIR": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("HTTPS_PROXY", None), env.pop("https_proxy", None)
    test = "tests/suite/test_gpu_path.py::test_wheels_are_pure_and_install_offline_into_a_fresh_target"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            test,
            "tests/suite/test_gpu_path.py::test_wheel_pins_follow_pyproject",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 passed, 1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "the package registry cannot be reached (127.0.0.1:9 for http://127.0.0.1:9/simple:" in proc.stdout


def test_wheel_pins_follow_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    got = dict(p.split("==") for p in pins())
    for name in ("hydra-core", "omegaconf", "flash-linear-attention"):
        assert f'"{name}=={got[name]}"' in pyproject, name
    assert got["fla-core"] == got["flash-linear-attention"]


def test_wheels_are_pure_and_install_offline_into_a_fresh_target(wheels, tmp_path):
    names = sorted(w.name for w in wheels.glob("*.whl"))
    assert [n.split("-")[0] for n in names] == sorted(
        ["antlr4_python3_runtime", "fla_core", "flash_linear_attention", "hydra_core", "omegaconf"]
    )
    assert all(n.endswith("-py3-none-any.whl") for n in names)
    target = tmp_path / "target"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            *map(str, wheels.glob("*.whl")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for mod in ("hydra", "omegaconf", "antlr4", "fla"):
        assert (target / mod / "__init__.py").exists(), mod


def test_bare_preflight_imports_from_the_wheel_target(wheels):
    env = {**os.environ, "GPU_WHEELS": str(wheels), "PY": sys.executable}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--bare", "--preflight"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "wheels from" in proc.stdout and "fla 0.6.0" in proc.stdout
    assert "gated_deltanet: composes (gpu)" in proc.stdout and "preflight: ok" in proc.stdout


def test_preflight_refuses_modules_that_do_not_come_from_the_target(tmp_path, capsys):
    # hydra is importable from the suite's venv, but not from this (empty) target: a wheel that failed to install
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_preflight import check_imports

    with pytest.raises(SystemExit) as exc:
        check_imports(tmp_path, fla=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "hydra imports from" in err and "not from the wheel target" in err


def test_bare_check_without_wheels_is_one_line(tmp_path):
    env = {**os.environ, "GPU_WHEELS": str(tmp_path), "PY": sys.executable}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--bare", "--preflight"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: no wheels in {tmp_path}: run 'make gpu-wheels' first"]


@pytest.mark.parametrize("slug", GPU_SPECS)
def test_gpu_profile_loads_and_every_entry_composes(slug):
    spec = load_spec(slug, profile="gpu")
    assert spec_path(slug, "gpu") == ROOT / "conf" / "claim" / "gpu" / f"{slug}.yaml"
    cpu = load_spec(slug)
    assert spec["report"] == cpu["report"]  # the CPU claim's hook reads the GPU runs
    assert {e["name"] for e in cpu["runs"]} <= {e["name"] for e in spec["runs"]}  # every CPU entry, maybe more
    assert spec["budget"]["here"]
    for entry in spec["runs"]:
        overrides = [*spec["overrides"].split(), *entry["overrides"].split()]
        cfg = compose_run(slug, overrides)
        assert cfg.trainer.accelerator == "gpu", entry["name"]


def test_gpu_profile_must_say_so(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("runs:\n  - {name: a, overrides: ''}\n")
    with pytest.raises(ConfigError, match="must say `profile: gpu`"):
        load_spec("gated_deltanet", bad, profile="gpu")


def test_machine_line(tmp_path):
    assert machine_line(tmp_path) is None
    (tmp_path / "machine.json").write_text(
        json.dumps({"device": "one NVIDIA H200 (140 GiB)", "host_cpus": 16, "parallel": 16, "wall_s": 385.5})
    )
    line = machine_line(tmp_path)
    assert "**one NVIDIA H200 (140 GiB)**" in line and "16 CPU cores" in line and "**6.4 minutes**" in line


def test_gpu_claims_script_runs_packs_and_rebuilds_a_page_on_the_cpu(wheels, tmp_path):
    root, archive, page = tmp_path / "runs", tmp_path / "runs.tar.gz", tmp_path / "page.md"
    env = {**os.environ, "GPU_WHEELS": str(wheels), "PY": sys.executable, "BARE": "1"}
    cmd = [
        "bash",
        "benchmarks/gpu_claims.sh",
        "--cpu",
        "--entries",
        "gdn_mqar4",
        "--seeds",
        "0,1",
        "--parallel",
        "2",
        "--deadline-s",
        "240",
        "--out-root",
        str(root),
        "--pack",
        str(archive),
        "--override",
        "trainer.max_steps=4",
        "--override",
        "trainer.val_check_interval=2",
        "--override",
        "data.n_train=64",
        "gated_deltanet",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    machine = json.loads((root / "gated_deltanet" / "machine.json").read_text())
    assert machine["runs"] == 2 and machine["finished"] == 2 and machine["parallel"] == 2
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(n.endswith("gdn_mqar4/0/step_times.json") for n in names)
    assert any(n.endswith("gdn_mqar4/1/csv/metrics.csv") for n in names)
    rebuilt = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite.claim",
            "gated_deltanet",
            "--profile",
            "gpu",
            "--report-only",
            "--out",
            str(root / "gated_deltanet"),
            "--page",
            str(page),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    text = page.read_text()
    assert "PROFILE=gpu" in text and "Machine: runs made on **no CUDA device (CPU)**" in text
    assert "| gdn_mqar4 |" in text and "| ok |" in text and "sum of one-seed runs of seeds 0, 1" in text


def test_pack_leaves_checkpoints_behind(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_claims import pack

    run = tmp_path / "slug" / "entry" / "0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_text("weights")
    (run / "model.pt").write_text("weights")
    (run / "metrics.json").write_text("{}")
    pack([tmp_path / "slug"], tmp_path / "a.tar.gz")
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        names = tar.getnames()
    assert "slug/entry/0/metrics.json" in names
    assert not [n for n in names if "checkpoints" in n or n.endswith((".ckpt", ".pt"))]


class _Tiny(pl.LightningModule):
    def __init__(self, val_sleep: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.val_sleep = val_sleep

    def training_step(self, batch, _):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, _):
        time.sleep(self.val_sleep)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_step_timer_leaves_validation_out_of_the_step_time(tmp_path):
    from suite.plumbing.step_timer import StepTimer

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 2)), batch_size=4)
    timer = StepTimer(warmup=0)
    trainer = pl.Trainer(
        max_steps=15,
        val_check_interval=5,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        default_root_dir=tmp_path,
    )
    trainer.fit(_Tiny(val_sleep=0.3), data, data)
    out = json.loads((tmp_path / "step_times.json").read_text())
    assert out["steps"] == 15 and len(timer.intervals) == 14
    assert out["val_s"] >= 0.3 * 2  # validations after steps 5 and 10 (and 15)
    assert max(timer.intervals) < 0.25  # no interval carries a validation's 0.3 s
    assert out["fit_s"] >= out["train_s"] + out["val_s"] - 0.05


def test_gpu_claims_pilot_prints_step_times_on_the_cpu(wheels, tmp_path):
    """The README's pilot line (`gpu_claims.sh --pilot SLUG:ENTRY ...`), on the CPU: one short run per entry, all at
    once, each with its median step time."""
    env = {**os.environ, "GPU_WHEELS": str(wheels), "PY": sys.executable}
    cmd = [
        "bash",
        "benchmarks/gpu_claims.sh",
        "--bare",
        "--cpu",
        "--pilot",
        "--steps",
        "12",
        "--deadline-s",
        "200",
        "--out-root",
        str(tmp_path),
        "--override",
        "data.n_train=64",
        "gated_deltanet:gdn_mqar16",
        "gated_deltanet:mamba2_mqar16",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("gated_deltanet.")]
    rows = [r for r in rows if len(r) >= 6]
    assert [r[0] for r in rows] == ["gated_deltanet.gdn_mqar16.0", "gated_deltanet.mamba2_mqar16.1"]
    for r in rows:
        assert r[1] == "0" and r[2] == "12" and float(r[3]) > 0  # exit 0, 12 steps, a median in ms
    pilot = json.loads((tmp_path / "pilot.json").read_text())
    assert len(pilot["rows"]) == 2
