"""The documentation site builds strictly, a dangling cross-reference fails that build, and the
package's docstrings and comments carry no speed measurements and cite no file outside the repository."""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a number followed by a speed unit: measurements live in docs/benchmarks.md, linked, not retold
SPEED = re.compile(r"\d[\d,.]*\s*(?:tokens/s|GFLOP/s|GB/s|rows/s|img/s|images/s)", re.I)
#: files outside the repository that the project must not cite
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|/work/shared")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the project at ``root`` into ``site``."""
    pytest.importorskip("mkdocs", reason="the docs extra builds the site: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra builds the site: pip install -e '.[docs]'")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_docs_site_builds_strictly(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()
    page = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "ReservoirFeatures" in page and "read_features" in page  # the reference is generated


def copy_project(tmp_path: Path) -> Path:
    """The docs, their configuration and the package, copied to be broken."""
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "reservoir", copy / "reservoir", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "CHANGELOG.md", "CITATION.cff"):
        shutil.copy(ROOT / name, copy / name)
    return copy


def test_a_dangling_cross_reference_fails_the_build(tmp_path):
    """A copy of the project whose API page names an object that does not exist does not build."""
    copy = copy_project(tmp_path)
    page = copy / "docs" / "reference" / "api.md"
    page.write_text(page.read_text() + "\nSee [the moved class][reservoir.api.NoSuchThing].\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "reservoir.api.NoSuchThing" in done.stderr


def test_a_docstring_naming_a_moved_object_fails_the_build(tmp_path):
    """A Sphinx role in any docstring of the package (``:class:`X```) must name an object of the
    package (docs/_griffe/sphinx_roles.py): one that names a moved class does not build."""
    copy = copy_project(tmp_path)
    module = copy / "reservoir" / "registry.py"
    text = module.read_text()
    module.write_text(text.replace('"""A name', '"""See :class:`reservoir.runtime.NoSuchEngine`. A name', 1))
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert ":class:`reservoir.runtime.NoSuchEngine`" in done.stderr


def texts(path: Path):
    """``(line, text)`` of every docstring and comment of a module."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def test_docstrings_carry_no_measurements_and_cite_nothing_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
        for path in sorted((ROOT / "reservoir").rglob("*.py"))
        for line, text in texts(path)
        for pattern in (SPEED, OUTSIDE)
        for match in pattern.finditer(text)
    ]
    assert not found, "move these to docs/benchmarks.md and link it:\n" + "\n".join(found)


def test_the_docstring_rule_finds_what_it_forbids(tmp_path):
    """The check above can fail: a module with a measured rate and an outside file is caught."""
    module = tmp_path / "m.py"
    module.write_text('"""Fast: 2,950 tokens/s on a Zen 4 (see DESIGN.md)."""\n\n# 3.5 GB/s here\nx = 1\n')
    hits = [m.group(0) for _, text in texts(module) for p in (SPEED, OUTSIDE) for m in p.finditer(text)]
    assert hits == ["2,950 tokens/s", "DESIGN.md", "3.5 GB/s"]


def test_the_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    first = readme.split("```")[1].splitlines()
    assert first[1].startswith("make demo") and first[2].startswith("make test")
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|cff))(?:#[\w-]+)?\)", readme):
        assert (ROOT / link).exists(), link


def test_the_readme_quotes_the_measured_accuracies_as_they_stand():
    """Every quotation in the README's results headline is in docs/results.md, which the pipelines
    generate: a result rendered again with other numbers fails here until the README follows."""
    readme = (ROOT / "README.md").read_text()
    headline = " ".join(readme[readme.index("## Results") : readme.index("## Documentation")].split())
    quotes = re.findall(r'"([^"]+)"', headline)
    assert len(quotes) >= 3
    measured = " ".join((ROOT / "docs" / "results.md").read_text().split())
    assert [q for q in quotes if q not in measured] == []
