"""One registry mechanism: modules of a registry's home package register themselves, found without a list."""

from __future__ import annotations

import sys

import pytest

from reservoir.errors import UsageError
from reservoir.registry import ENGINES, HEADS, Registry


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A package ``plugins_pkg`` whose modules register into ``plugins_pkg.THINGS`` (a fresh import)."""
    package = tmp_path / "plugins_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from reservoir.registry import Registry\nTHINGS = Registry('thing', home=__name__, ordered=True)\n"
    )
    for name, things in (("b_second", ("zeta",)), ("a_first", ("omega", "alpha"))):
        lines = ["from plugins_pkg import THINGS"]
        lines += [f"THINGS.register({t!r}, lambda: {t!r}, help='the {t}')" for t in things]
        (package / f"{name}.py").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for module in [m for m in sys.modules if m == "plugins_pkg" or m.startswith("plugins_pkg.")]:
        del sys.modules[module]


def test_modules_of_the_home_package_register_in_name_order(plugins):
    from plugins_pkg import THINGS

    assert "plugins_pkg.a_first" not in sys.modules  # nothing imported before the first lookup
    assert THINGS.names() == ["omega", "alpha", "zeta"]  # a_first's, in its order, then b_second's
    assert THINGS.create("zeta") == "zeta" and THINGS.help("alpha") == "the alpha"
    (plugins / "c_new.py").write_text("from plugins_pkg import THINGS\nTHINGS.register('new', object)\n")
    assert "new" not in THINGS  # discovered once; a module added later is found by the next process


def test_unknown_and_repeated_names_are_refused_in_words():
    things = Registry("thing")
    things.register("a", object)
    with pytest.raises(UsageError, match=r"^unknown thing 'b'; choose from \['a'\]$"):
        things["b"]
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        things.register("a", object)


def test_engines_and_heads_are_found_where_they_live():
    assert ENGINES.names()[0] == "torch"  # first in --engine's order
    assert {"torch", "openvino", "onnxruntime"} <= set(ENGINES.names())
    assert {"logreg", "ridge", "torch"} <= set(HEADS.names())
    assert type(ENGINES["onnxruntime"]).__module__ == "reservoir.runtime.onnx"


def test_the_command_lines_choices_are_the_declared_ones():
    from reservoir.cli import main
    from reservoir.config import ExtractConfig, FitConfig
    from reservoir.settings import choices

    options = {
        (command, p.name): p.type for command in ("extract", "fit") for p in main.commands[command].params
    }
    assert list(options["extract", "engine"].choices) == ["auto", *ENGINES.names()]
    assert list(options["fit", "head"].choices) == HEADS.names() == choices(FitConfig, "head").values()
    assert list(options["extract", "dtype"].choices) == choices(ExtractConfig, "dtype").values()
