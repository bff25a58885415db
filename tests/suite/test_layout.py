"""The layout rules of DESIGN.md that a test can check."""

from __future__ import annotations

import ast
import functools
import graphlib
import re
from pathlib import Path

import pytest

from suite.report import sizing_patience, sizing_untrained
from tests.conftest import ROOT

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("folder", ["ops", "layers"])
def test_ops_and_layers_do_not_import_lightning(folder: str):
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / folder).rglob("*.py")
        if _imports(p) & {"lightning", "pytorch_lightning", "lightning_modules", "datamodules", "callbacks"}
    ]
    assert offenders == []


@pytest.mark.parametrize("folder", ["datamodules", "callbacks"])
def test_datamodules_and_callbacks_do_not_import_papers(folder: str):
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py") if "lightning_modules" in _imports(p)]
    assert offenders == []


PAPERS = sorted(p.stem for p in (ROOT / "docs" / "methods").glob("*.md"))
"""One slug per paper: its methods page, its ``lightning_modules/<slug>/`` folder."""


def paper_of(name: str) -> str | None:
    """The paper an experiment or claim spec belongs to: its own slug, or the longest paper slug it extends
    (``semdice_deep``, ``badloss_vit``); ``None`` for a cross-paper study (``quant_outliers``)."""
    owners = [p for p in PAPERS if name == p or name.startswith(f"{p}_")]
    return max(owners, key=len) if owners else None


@pytest.mark.parametrize("paper", PAPERS)
def test_each_paper_has_its_folder_of_lightning_modules(paper: str):
    init = ROOT / "lightning_modules" / paper / "__init__.py"
    assert init.exists(), f"lightning_modules/{paper}/__init__.py is missing: every paper has its folder"
    exported = [n for n in re.findall(r"\b(\w+LitModule)\b", init.read_text())]
    assert exported, f"lightning_modules/{paper}/__init__.py exports no LitModule"


def test_lightning_modules_holds_only_paper_folders():
    """The top of ``lightning_modules/`` lists the papers: one folder each, plus ``_base.py`` and ``_shared/`` (the
    systems several papers use, each re-exported by the folders of the papers that use it)."""
    top = {p.name for p in (ROOT / "lightning_modules").iterdir() if p.name != "__pycache__"}
    allowed = {"__init__.py", "_base.py", "_shared", *PAPERS}
    assert sorted(top - allowed) == [], "a paper's module lives in lightning_modules/<slug>/, nothing else at the top"


FILE_KINDS = ("module", "experiment", "model", "data", "datamodule", "claim", "report", "layers", "ops", "tests")
"""The kinds of file a methods page's front matter lists (``files: {kind: [path, ...]}``)."""


def front_matter(text: str) -> dict:
    """The YAML front matter of a page (between a first line ``---`` and the next ``---``); ``{}`` when none."""
    import yaml

    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    return (yaml.safe_load(match.group(1)) or {}) if match else {}


def listed_file_problems(paper: str, text: str) -> list[str]:
    """What is wrong with the file list in the front matter ``text`` of ``docs/methods/<paper>.md``: a path that does
    not exist, a kind not in :data:`FILE_KINDS`, and each of the paper's own files it leaves out (its module folder
    and the shared systems that folder imports, each experiment with its model config, each claim spec)."""
    files = front_matter(text).get("files")
    if not isinstance(files, dict):
        return ["no `files:` mapping in the front matter"]
    problems = [f"unknown kind {kind!r}" for kind in files if kind not in FILE_KINDS]
    listed = {path for paths in files.values() for path in paths or []}
    for path in sorted(listed):
        if not ((ROOT / path).is_dir() if path.endswith("/") else (ROOT / path).is_file()):
            problems.append(f"{path}: no such {'folder' if path.endswith('/') else 'file'}")
    own = [f"lightning_modules/{paper}/"]
    init = ROOT / "lightning_modules" / paper / "__init__.py"
    if init.exists():
        shared = {n.split(".")[2] for n in _imported_names(init) if n.startswith("lightning_modules._shared.")}
        own += [f"lightning_modules/_shared/{name}.py" for name in sorted(shared)]
    for slug in (e for e in SLUGS if paper_of(e) == paper):
        own.append(f"conf/experiment/{slug}.yaml")
        if model := re.search(
            r"override /model:\s*([\w-]+)", (ROOT / "conf" / "experiment" / f"{slug}.yaml").read_text()
        ):
            own.append(f"conf/model/{model.group(1)}.yaml")
    own += [f"conf/claim/{c}.yaml" for c in CLAIMS if paper_of(c) == paper]
    problems += [f"{path} is not listed" for path in own if path not in listed]
    return problems


@pytest.mark.parametrize("paper", PAPERS)
def test_each_methods_page_lists_the_files_of_its_paper(paper: str):
    page = ROOT / "docs" / "methods" / f"{paper}.md"
    assert listed_file_problems(paper, page.read_text()) == [], f"{page.relative_to(ROOT)} front matter"


def test_the_file_list_check_finds_a_missing_path_and_an_unlisted_file():
    text = (ROOT / "docs" / "methods" / "ts_lif.md").read_text()
    assert listed_file_problems("ts_lif", text) == []
    assert listed_file_problems("ts_lif", text.replace("  - conf/experiment/ts_lif.yaml\n", "")) == [
        "conf/experiment/ts_lif.yaml is not listed"
    ]
    moved = text.replace("reports/ts_lif.py", "reports/ts_lif_old.py")
    assert listed_file_problems("ts_lif", moved) == ["reports/ts_lif_old.py: no such file"]
    assert listed_file_problems("ts_lif", text.replace("  layers:", "  layer:")) == ["unknown kind 'layer'"]
    assert listed_file_problems("ts_lif", text.split("---\n", 2)[2]) == ["no `files:` mapping in the front matter"]


@pytest.mark.parametrize("slug", SLUGS)
def test_each_experiment_has_model_config_module_and_tests(slug: str):
    import yaml

    assert (ROOT / "conf" / "model" / f"{slug}.yaml").exists(), f"conf/model/{slug}.yaml is missing"
    exp = (ROOT / "conf" / "experiment" / f"{slug}.yaml").read_text()
    assert yaml.safe_load(exp).get("experiment_slug") == slug
    # The model target of the composed experiment is a LitModule its paper's folder exports.
    from tests.conftest import compose_train

    paper = paper_of(slug)
    assert paper, f"conf/experiment/{slug}.yaml: no docs/methods/<slug>.md names its paper"
    target = compose_train([f"experiment={slug}"], ROOT / "logs" / "unused").model._target_
    module, cls = target.rsplit(".", 1)
    assert module == f"lightning_modules.{paper}", f"{slug}: model target {target} is not lightning_modules.{paper}.*"
    generic = {"test_experiments.py", "test_layout.py"}
    tests = [p for p in (ROOT / "tests").rglob("test_*.py") if p.name not in generic and _imports_any(p, [module], cls)]
    assert tests, f"no test file besides the generic ones imports {module} (the model of '{slug}')"


@functools.cache  # every slug reads every test file
def _imported_names(path: Path) -> frozenset[str]:
    """Every dotted name ``path`` imports, anywhere in the file: ``import a.b`` gives ``a.b``, ``from a.b import c``
    gives ``a.b`` and ``a.b.c`` (``c`` may be a module or a name defined in ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return frozenset(names)


def _imports_any(path: Path, modules: list[str], cls: str) -> bool:
    """Whether ``path`` imports one of ``modules`` (or a module inside one), or the class ``cls`` of the first from a
    package above it (``from lightning_modules.preworld import PreWorldLitModule`` for ``....preworld.module``)."""
    for name in _imported_names(path):
        if any(name == m or name.startswith(f"{m}.") for m in modules):
            return True
        package, _, last = name.rpartition(".")
        if last == cls and package and modules[0].startswith(f"{package}."):
            return True
    return False


def test_the_slug_check_counts_imports_not_mentions(tmp_path: Path):
    cases = {
        "import lightning_modules.grass\n": True,
        "from lightning_modules.grass import GrassLitModule\n": True,
        "from lightning_modules import grass\n": True,
        "def f():\n    from lightning_modules.grass.layers import x\n": True,  # a module inside it, imported lazily
        "from lightning_modules import GrassLitModule\n": True,  # the class, from a package above its module
        "# tests grass: lightning_modules.grass\nCMD = 'experiment=grass'\n": False,  # named, never imported
        "from lightning_modules.grass_extra import x\n": False,  # another module whose name starts the same
        "from lightning_modules import OtherLitModule\n": False,
        "from . import grass\n": False,  # relative: not the suite's package
    }
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"test_{i}.py"
        path.write_text(text)
        assert _imports_any(path, ["lightning_modules.grass"], "GrassLitModule") is expected, text


CLAIMS = sorted(p.stem for p in (ROOT / "conf" / "claim").glob("*.yaml"))  # not recursive: conf/claim/paper/ is no slug


def test_one_report_hook_per_claim_spec():
    """Each claim spec names ``reports.<slug>:claim_report``; each ``reports/<name>.py`` (not ``_*.py``) is a spec's."""
    import importlib

    import yaml

    for slug in CLAIMS:
        spec = yaml.safe_load((ROOT / "conf" / "claim" / f"{slug}.yaml").read_text())
        hook = spec.get("report")
        assert hook == f"reports.{slug}:claim_report", f"conf/claim/{slug}.yaml: report: {hook}"
        assert callable(importlib.import_module(f"reports.{slug}").claim_report), slug
        budget = spec.get("budget") or {}
        for side in ("paper", "here"):  # the page's budget table: the paper's budget beside the one run here
            assert {"model", "steps", "data"} <= set(budget.get(side) or {}), f"conf/claim/{slug}.yaml budget.{side}"
        assert str(spec.get("sizing_metric", "")).startswith(("val/", "train/")), f"conf/claim/{slug}.yaml sizing"
        assert isinstance(spec.get("sizing_higher_is_better"), bool), slug
        if (patience := sizing_patience(spec)) is not None:  # the stopping rule judges runs that early stopping ends
            stop = re.search(r"EarlyStopping,monitor:([^,]+),patience:(\d+)", str(spec.get("overrides")))
            assert stop and stop.groups() == (spec["sizing_metric"], str(patience)), f"conf/claim/{slug}.yaml"
        sizing_untrained(spec)  # entries exempt from the plateau rule are runs of the claim, each with its reason
    hooks = sorted(p.stem for p in (ROOT / "reports").glob("*.py") if not p.name.startswith("_"))
    assert hooks == CLAIMS, "reports/<slug>.py must match conf/claim/<slug>.yaml one to one"


def test_nothing_outside_reports_imports_reports():
    skip = {"reports", "tests", ".venv", "logs", "docs"}
    offenders = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in skip and "reports" in _imports(p)
    ]
    assert offenders == []


LAYERS = ("core", "ops", "layers", "datamodules", "callbacks", "lightning_modules", "suite", "reports")
"""The packages from the floor up: each imports only packages before it (``core`` nothing of the suite's, ``suite``
none of ``ops`` ... ``lightning_modules``: it builds them from their configs' ``_target_``)."""
BELOW_SUITE = ("core", "ops", "layers", "datamodules", "callbacks", "lightning_modules")
DRAWING = ROOT / "docs" / "design.md"


def _files(folders: tuple[str, ...] | list[str]) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", BELOW_SUITE)
def test_nothing_below_the_runner_imports_suite(folder: str):
    offenders = [str(p.relative_to(ROOT)) for p in _files([folder]) if "suite" in _imports(p)]
    assert offenders == [], f"{folder}/ imports suite (the runner): use core/ (errors, rng, smoke, checkpoint)"


def test_suite_imports_no_shared_callbacks():
    """The runner's own callbacks live in ``suite/plumbing/``; ``callbacks/`` is the papers' and builds on suite."""
    offenders = [str(p.relative_to(ROOT)) for p in _files(["suite"]) if "callbacks" in _imports(p)]
    assert offenders == []


def test_core_is_lightning_free_and_imports_no_other_package():
    offenders = {
        str(p.relative_to(ROOT)): sorted(bad)
        for p in _files(["core"])
        if (bad := _imports(p) & ({"lightning", "pytorch_lightning", "hydra"} | set(LAYERS) - {"core"}))
    }
    assert offenders == {}


def deferred_imports(path: Path) -> list[str]:
    """``line: statement`` of every import of a project package (one of :data:`LAYERS`) inside a function body:
    an import that hides an edge of the package graph (or a circle) until the function runs."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                if getattr(child, "level", 0) == 0 and any(n.split(".")[0] in LAYERS for n in names):
                    found.append(f"{child.lineno}: {ast.unparse(child)}")
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(path.read_text()), False)
    return found


def test_no_project_import_is_deferred_into_a_function():
    offenders = {str(p.relative_to(ROOT)): d for p in _files(LAYERS) if (d := deferred_imports(p))}
    assert offenders == {}, "import these at the top of the module (a circle they close is a layering error)"


def test_the_deferred_import_check_sees_imports_in_any_function(tmp_path: Path):
    cases = {
        "from suite.errors import ConfigError\n": 0,  # module level
        "def f():\n    from suite.run import train\n": 1,
        "class A:\n    def m(self):\n        if x:\n            import ops.quant\n": 1,
        "def f():\n    import numpy\n    from . import sibling\n": 0,  # third-party, relative
        "def f():\n    def g():\n        from core import smoke\n": 1,
    }
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"m{i}.py"
        path.write_text(text)
        assert len(deferred_imports(path)) == expected, text


def package_edges() -> dict[str, set[str]]:
    """Package -> the packages of :data:`LAYERS` its modules import (at any depth of the module)."""
    edges: dict[str, set[str]] = {pkg: set() for pkg in LAYERS}
    for pkg in LAYERS:
        for path in _files([pkg]):
            edges[pkg] |= (_imports(path) & set(LAYERS)) - {pkg}
    return edges


def reduced_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The edges no longer path implies (the transitive reduction of an acyclic graph), sorted by layer."""

    def reachable(start: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in edges[node]:
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    kept = [(a, b) for a in edges for b in edges[a] if b not in reachable(a, (a, b))]
    return sorted(kept, key=lambda e: (LAYERS.index(e[0]), LAYERS.index(e[1])))


def mermaid(edges: dict[str, set[str]]) -> str:
    """The package graph as a mermaid flowchart, floor at the bottom, one arrow per edge of its reduction."""
    return "\n".join(["```mermaid", "graph BT", *(f"  {a} --> {b}" for a, b in reduced_edges(edges)), "```"])


def test_the_package_graph_has_no_circle_and_no_arrow_back_up():
    edges = package_edges()
    graphlib.TopologicalSorter(edges).prepare()  # CycleError names the circle
    up = sorted(f"{a} -> {b}" for a in edges for b in edges[a] if LAYERS.index(b) > LAYERS.index(a))
    assert up == [], f"imports against the layer order {' < '.join(LAYERS)}"


def test_a_circle_is_found():
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"core": {"ops"}, "ops": {"layers"}, "layers": {"core"}}).prepare()
    assert reduced_edges({"core": set(), "ops": {"core"}, "layers": {"ops", "core"}}) == [
        ("ops", "core"),
        ("layers", "ops"),
    ]


def test_the_drawing_in_the_design_notes_is_the_package_graph():
    assert mermaid(package_edges()) in DRAWING.read_text(), (
        f"{DRAWING.relative_to(ROOT)}: redraw with `python -m tests.suite.test_layout`"
    )


if __name__ == "__main__":  # print the package graph: edges, then the drawing docs/design.md shows
    graph = package_edges()
    for pkg in LAYERS:
        print(f"{pkg} -> {', '.join(sorted(graph[pkg], key=LAYERS.index)) or '(nothing)'}")
    print(mermaid(graph))
