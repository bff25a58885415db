"""``make gpu-wheels``: the few pure-Python wheels a bare GPU machine lacks, for a machine without a network.

A lent or rented GPU machine often comes with its own Python holding torch, lightning, torchmetrics, timm,
torch-geometric and the scientific stack, but no network and none of the suite's configuration layer. The suite
runs there from its source tree (``PYTHONPATH``) once these wheels are installed into a temporary target:

* ``hydra-core`` and ``omegaconf`` (the configs) at the versions ``pyproject.toml`` pins, and
  ``antlr4-python3-runtime`` 4.9.3, the parser both need (PyPI has only its sdist: it is built into a wheel here);
* ``flash-linear-attention`` and ``fla-core`` at the ``[gpu]`` extra's version (the fla parity test and kernel
  benchmark of ``benchmarks/gpu_check.sh``).

Every wheel is pure Python (``py3-none-any``), so one folder serves any CPython 3 on any platform. The folder
(default ``.whl/``, git-ignored) is written atomically: a failed download leaves the previous folder as it was.
``benchmarks/gpu_env.sh`` installs it with ``pip install --no-index --no-deps --target`` and checks that the
modules resolve from that target (``benchmarks/gpu_preflight.py``).

Usage: ``python -m suite.gpu_wheels [--dest .whl] [--python-version 3.12]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FROM_PYPROJECT = ("hydra-core", "omegaconf", "flash-linear-attention")  # pinned there (fla in the [gpu] extra)
ANTLR = "antlr4-python3-runtime==4.9.3"  # hydra-core and omegaconf require 4.9.*; sdist only on PyPI
# The top-level modules each wheel provides: what the preflight checks resolves from the install target.
MODULES = {
    "hydra-core": "hydra",
    "omegaconf": "omegaconf",
    "antlr4-python3-runtime": "antlr4",
    "flash-linear-attention": "fla",
    "fla-core": "fla",
}


def pins(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """``name==version`` of every wheel to fetch, read from ``pyproject.toml`` (one source of truth); fla-core is
    pinned to flash-linear-attention's version, which requires exactly it."""
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    reqs = list(project["dependencies"]) + [
        r for extra in project.get("optional-dependencies", {}).values() for r in extra
    ]
    found = {}
    for req in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^;\s]+)\s*(;.*)?", req)
        if m and m.group(1).lower() in FROM_PYPROJECT:
            found[m.group(1).lower()] = m.group(2)
    missing = [n for n in FROM_PYPROJECT if n not in found]
    if missing:
        raise SystemExit(f"error: pyproject.toml pins no exact version of {missing} (suite/gpu_wheels.py needs them)")
    out = [f"{n}=={found[n]}" for n in FROM_PYPROJECT]
    out.append(f"fla-core=={found['flash-linear-attention']}")
    return out


def fetch(dest: Path, python_version: str = "3.12", python: str = sys.executable) -> list[Path]:
    """Download the wheels (and build antlr4's) into ``dest``, replacing it only when everything succeeded."""
    dest = dest.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=".whl.", dir=dest.parent))
    try:
        base = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run(
            [
                *base,
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python_version,
                "--implementation",
                "py",
                "--abi",
                "none",
                "--platform",
                "any",
                "-d",
                str(tmp),
                *pins(),
            ],
            check=True,
        )
        subprocess.run([*base, "wheel", "--no-deps", "-w", str(tmp), ANTLR], check=True)
        wheels = sorted(tmp.glob("*.whl"))
        impure = [w.name for w in wheels if not w.name.endswith("-none-any.whl")]
        if impure:
            raise SystemExit(f"error: not pure-Python wheels: {impure}")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        return sorted(dest.glob("*.whl"))
    except subprocess.CalledProcessError as err:
        msg = f"error: pip failed ({err.returncode}) while fetching the GPU wheels; {dest} left as it was"
        raise SystemExit(msg) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", default=str(ROOT / ".whl"), help="wheel folder (default: .whl, git-ignored)")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (the wheels are py3-none-any)")
    args = p.parse_args(argv)
    wheels = fetch(Path(args.dest), args.python_version)
    size = sum(w.stat().st_size for w in wheels)
    print(f"wrote {len(wheels)} wheels ({size / 2**20:.1f} MiB) to {args.dest}:")
    for w in wheels:
        print(f"  {w.name}")


if __name__ == "__main__":
    main()
