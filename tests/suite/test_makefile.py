"""The Makefile: every target documented in `make help`; the install is skipped once done (stamp file)."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

TARGETS = [
    "install",
    "train",
    "eval",
    "sweep",
    "claim",
    "compare",
    "bench",
    "test",
    "test-fast",
    "test-gpu",
    "gpu-wheels",
    "lint",
    "format",
    "clean",
    "slurm",
]


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_help_documents_every_target():
    out = _make("help").stdout
    for target in TARGETS:
        assert re.search(rf"^\s+(\x1b\[36m)?{re.escape(target)}\b", out, re.M), f"`make help` misses {target}"
    declared = re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M)
    undocumented = [t for t in declared if t not in TARGETS + ["help"]]
    assert undocumented == []


def test_install_is_skipped_when_up_to_date():
    # `make test` (how CI got here) has just run the install: the stamp must be newer than pyproject.toml.
    proc = _make("--question", ".venv/.install-stamp")
    assert proc.returncode == 0, "a second `make train`/`make test` would reinstall"


def test_unknown_method_for_every_method_target():
    for target in ("train", "sweep", "claim", "slurm"):
        proc = _make("-s", target, "METHOD=nope")
        assert proc.returncode == 2
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert len(lines) == 1 and "error: unknown METHOD 'nope'; valid: " in lines[0], lines


def test_claim_accepts_a_cross_paper_study_and_only_claim_does():
    # a claim spec that says `study:` (quant_outliers, tta_arch) has no experiment of its own: `make claim` runs it,
    # the other METHOD targets still refuse it
    studies = sorted(p.stem for p in (ROOT / "conf" / "claim").glob("*.yaml") if "\nstudy:" in p.read_text())
    assert "tta_arch" in studies
    for study in studies:
        proc = _make("-n", "claim", f"METHOD={study}")
        assert proc.returncode == 0 and f"-m suite.claim {study}" in proc.stdout, proc.stderr
        assert _make("-s", "train", f"METHOD={study}").returncode == 2


def test_help_tells_the_debug_modes_and_where_outputs_go():
    out = _make("help").stdout
    for mode in sorted(p.stem for p in (ROOT / "conf" / "debug").glob("*.yaml")):
        assert re.search(rf"\b{mode} \(", out), f"`make help` does not describe debug={mode}"
    assert "logs/train/<slug>/runs/" in out and "logs/debug/<slug>/" in out and "ckpt_path=last" in out


def test_readme_has_a_row_for_every_method():
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `([a-z0-9_]+)` \|", readme, re.M))
    slugs = {p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")}
    assert slugs - rows == set(), f"README method table misses {sorted(slugs - rows)}"
