"""Static contracts: imports flow down the pipeline's stages only (import-linter, setup.cfg's [importlinter]); ruff format and lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_imports_flow_down_the_pipeline():
    """``lint-imports`` checks the ``[importlinter]`` contract in setup.cfg: task data -> model ->
    runtime -> extraction -> probes and training -> report -> cli; an import that climbs back up
    (a lazy one included) fails here."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' (import-linter)")
    done = subprocess.run(
        [exe, "--config", str(ROOT / "setup.cfg"), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("check", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_clean(check):
    """``ruff format --check`` and ``ruff check`` (pyproject.toml's ``[tool.ruff]``) pass on the whole
    repository: a file the formatter would change, or a lint rule broken, fails here with ruff's report."""
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    done = subprocess.run([exe, *check, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def import_graph() -> dict[str, set[str]]:
    """Every module of ``reservoir`` -> the modules of ``reservoir`` it imports anywhere (lazy imports inside
    functions included, ``TYPE_CHECKING`` blocks too)."""
    import ast

    root = ROOT / "reservoir"
    mods = {}
    for p in root.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def test_no_import_cycles_lazy_imports_included():
    """No two modules of reservoir import each other, directly or through others, even inside a function:
    a cycle is a design question, not a lazy import to hide (a lower module that needs a higher one's entries
    takes them from a registry the higher one fills)."""
    graph = import_graph()
    assert graph["reservoir.tasks.userfile"] >= {"reservoir.tasks"}  # the walk sees imports at all
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


#: the longest a module of ``reservoir`` may grow (docs/contributing.md, "Layout": past it, split by concern)
MAX_MODULE_LINES = 800


def test_no_module_grows_past_its_bound():
    """Every module of ``reservoir`` has at most ``MAX_MODULE_LINES`` lines."""
    lines = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "reservoir").rglob("*.py")
    }
    assert lines["reservoir/config.py"] > 100  # the walk sees the package
    assert {p: n for p, n in lines.items() if n > MAX_MODULE_LINES} == {}
