"""A griffe extension for the docs build: Sphinx roles in docstrings (``:class:`X```, ``:func:`f```,
``:mod:`m```, ...) are rendered as inline code, and each must name an object of the package (resolved
from where it is written: the object, its module, then the package), else the build warns, which
``mkdocs build --strict`` turns into a failure: a docstring naming a moved or renamed object fails."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(class|func|meth|mod|data|attr|exc|obj):`~?([^`<>]+?)(?:\(\))?`")
LOG = logging.getLogger("mkdocs.plugins.sphinx_roles")


def _found(scope: griffe.Object, dotted: str) -> bool:
    try:
        scope[dotted]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def resolves(obj: griffe.Object, target: str, package: griffe.Module) -> bool:
    """``target`` names an object of the package: absolute, or relative to ``obj``'s scopes (the object,
    its class, its module), or a name those scopes assign that griffe does not list (tuple unpacking:
    ``A, B = 1, 2``; ``self.a, self.b = ...``). A dotted name whose first part is not the package's
    (``pickle.Unpickler``, ``sklearn.pipeline.Pipeline``) is another package's, and not checked."""
    root = package.name + "."
    if target == package.name:
        return True
    if target.startswith(root):
        return _found(package, target[len(root) :])
    scope: griffe.Object | None = obj
    while scope is not None:
        if _found(scope, target) or _assigned(scope, target):
            return True
        scope = scope.parent
    return "." in target and not _ours(obj, target.split(".")[0], package)


def _assigned(scope: griffe.Object, name: str) -> bool:
    """``scope``'s source assigns ``name`` (or ``self.name``) in a tuple unpacking."""
    if "." in name or scope.is_alias:
        return False
    try:
        source = Path(scope.filepath).read_text() if scope.is_module else scope.source
    except (OSError, ValueError, TypeError):
        return False
    pattern = rf"^\s*(?:(?:self\.)?\w+\s*,\s*)*(?:self\.)?{re.escape(name)}\s*(?:,\s*(?:self\.)?\w+\s*)*="
    return re.search(pattern, source, flags=re.M) is not None


def _ours(obj: griffe.Object, first: str, package: griffe.Module) -> bool:
    """``first`` is a name of the package in one of ``obj``'s scopes (not an import of another package)."""
    scope: griffe.Object | None = obj
    while scope is not None:
        member = scope.members.get(first)
        if member is not None:
            return not member.is_alias or member.target_path.startswith(package.name)
        scope = scope.parent
    return False


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "reservoir":
            return
        self._walk(pkg, pkg)

    def _walk(self, obj: griffe.Object, package: griffe.Module) -> None:
        if obj.is_alias:
            return
        if obj.docstring is not None:
            text = obj.docstring.value
            for match in ROLE.finditer(text):
                if not resolves(obj, match.group(2), package):
                    LOG.warning(
                        "%s: its docstring names %s, which is not an object of the package",
                        obj.path,
                        match.group(0),
                    )
            obj.docstring.value = ROLE.sub(lambda m: f"`{m.group(2)}`", text)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, package)
