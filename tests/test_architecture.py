"""The layers stay apart: the scaffolding, the results layer, the study and the launcher plugin
know no pipeline (a pipeline is the registry's: horst_sparse.pipeline); the results layer loads
neither torch nor Hydra; no module edits sys.path or loads a file by path; the libraries import
torch alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from horst_sparse import pipeline as registry

PIPELINE_PACKAGES = {registry.get(name).run.__module__.rsplit(".", 1)[0] for name in registry.names()}
# Code that serves every pipeline: it takes a pipeline from a config's `pipeline` key.
SHARED = [
    p
    for p in (ROOT / "horst_sparse").rglob("*.py")
    if not any(p.is_relative_to(ROOT / Path(*package.split("."))) for package in PIPELINE_PACKAGES)
] + list((ROOT / "hydra_plugins").rglob("*.py"))
EVERY_FILE = [p for p in ROOT.rglob("*.py") if not {".venv", "build", ".git"} & set(p.relative_to(ROOT).parts)]


def imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def named_pipelines(tree: ast.AST) -> list[str]:
    """Places where code branches on, or keys a map by, a pipeline's name: a comparison with the
    name, or a dict literal with it as a key."""
    names = set(registry.names())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                if isinstance(operand, ast.Constant) and operand.value in names:
                    found.append(f"line {node.lineno}: compares with {operand.value!r}")
        elif isinstance(node, ast.Dict):
            found += [
                f"line {node.lineno}: a map keyed by {k.value!r}"
                for k in node.keys
                if isinstance(k, ast.Constant) and k.value in names
            ]
    return found


@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shared_code_knows_no_pipeline(path):
    tree = ast.parse(path.read_text())
    foreign = sorted(m for m in imported(tree) if any(m == p or m.startswith(p + ".") for p in PIPELINE_PACKAGES))
    assert not foreign, f"{path.relative_to(ROOT)} imports a pipeline's package: {foreign}"
    assert not named_pipelines(tree), f"{path.relative_to(ROOT)}: {named_pipelines(tree)}"


def test_no_module_edits_sys_path_or_loads_a_file_by_path():
    for path in EVERY_FILE:
        text = path.read_text()
        for forbidden in ("sys.path.insert", "sys.path.append", "spec_from_file_location", "syspath_prepend"):
            assert forbidden not in text or path == Path(__file__), f"{path.relative_to(ROOT)}: {forbidden}"


def test_the_results_layer_loads_neither_torch_nor_hydra():
    code = (
        "import sys, horst_sparse.analysis.report, horst_sparse.analysis.sweep, horst_sparse.analysis.runs; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'hydra', 'omegaconf'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert loaded.strip() == "[]"


def test_the_registry_imports_no_pipeline():
    code = "import sys, horst_sparse.pipeline as p; p.names(); print(sorted(m for m in sys.modules if m.startswith('horst_sparse.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    # horst_sparse.cpu_mode: the package's own first import (it pins the CPU mode before torch), no pipeline
    assert loaded.strip() == "['horst_sparse.cpu_mode', 'horst_sparse.pipeline']"


def test_unknown_pipelines_are_named_with_the_closest():
    with pytest.raises(registry.UnknownPipeline, match=r"no pipeline 'vitt'; did you mean vit\?"):
        registry.get("vitt")


@pytest.mark.parametrize("library", ["horst", "pruning"])
def test_the_libraries_import_torch_alone(library):
    integrations = {
        ROOT / "horst" / "timm.py"
    }  # timm's registry entries: imported only once timm is (horst/__init__.py)
    for path in set((ROOT / library).rglob("*.py")) - integrations:
        roots = {m.split(".")[0] for m in imported(ast.parse(path.read_text()))}
        assert roots <= {"torch", library, "__future__"} | set(sys.stdlib_module_names), (path, roots)


def test_the_study_is_shorter_than_the_optimizer_library():
    """The study's machinery (jobs, protocol, provenance, budget, ledger, report, rerun) stays smaller
    than what it studies: every line of horst_sparse/study/ against every line of horst/."""

    def lines(folder: str) -> int:
        return sum(len(p.read_text().splitlines()) for p in (ROOT / folder).glob("*.py"))

    assert lines("horst_sparse/study") < lines("horst")
