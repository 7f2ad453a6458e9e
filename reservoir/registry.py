"""A name -> entry registry: the one mechanism by which tasks, backbones, heads and engines register.

timm's ``register_model`` shape: a decorator fills a table keyed by name, :meth:`Registry.names`
lists it, and an unknown name is a :class:`reservoir.errors.UsageError` naming the choices
("unknown head 'lasso'; choose from ['logreg', 'ridge', 'torch']").

A registry is filled by the modules of its ``home`` package, found by walking the package
(:func:`discover`): a new module registers itself without being added to any list. Discovery runs
on the first lookup, so a lower layer (:mod:`reservoir.config`, the command line's choices) can
read a registry that a higher layer fills without importing that layer. Modules are imported in
the order of their names, so registration order is the same on every machine.

The registries the lowest layers read are declared here (:data:`ENGINES`, :data:`HEADS`); the
others beside what they hold (``reservoir.tasks.TASKS``, ``reservoir.model.backbones.BACKBONES``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from reservoir.errors import UsageError

T = TypeVar("T")


def discover(package: str) -> list[str]:
    """Import every module of ``package`` (subpackages not walked), in the order of their names;
    returns their names."""
    pkg = importlib.import_module(package)
    names = sorted(m.name for m in pkgutil.iter_modules(getattr(pkg, "__path__", [])))
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


@dataclass
class Registry(Generic[T]):
    """Entries keyed by name; ``kind`` names the thing in error messages.

    Parameters
    ----------
    kind
        what an entry is, in messages ("task", "engine").
    home
        the package whose modules register the entries (:func:`discover`), imported on the first
        lookup; ``None``: the registry is filled by whoever imports it.
    ordered
        :meth:`names` in registration order (a choice list whose first entry is the usual one);
        else sorted.
    """

    kind: str
    home: str | None = None
    ordered: bool = False
    _entries: dict[str, Callable[..., T]] = field(default_factory=dict)
    _help: dict[str, str] = field(default_factory=dict)
    _found: bool = False

    def register(self, name: str, factory: Callable[..., T] | None = None, *, help: str = ""):
        """Register ``factory`` (a class, a function or an object) under ``name``; usable as a decorator."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = f
            doc = help or (f.__doc__ or "").strip()
            self._help[name] = doc.splitlines()[0] if doc else ""
            return f

        return add(factory) if factory is not None else add

    def _discover(self) -> None:
        if not self._found and self.home is not None:
            self._found = True  # before importing: a module may look its own registry up
            discover(self.home)

    def names(self) -> list[str]:
        self._discover()
        return list(self._entries) if self.ordered else sorted(self._entries)

    def help(self, name: str) -> str:
        self._discover()
        return self._help.get(name, "")

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def factory(self, name: str) -> Callable[..., T]:
        """The entry registered under ``name``; UsageError naming the choices if there is none."""
        self._discover()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UsageError(f"unknown {self.kind} {name!r}; choose from {self.names()}") from None

    __getitem__ = factory

    def create(self, name: str, **options: Any) -> T:
        return self.factory(name)(**options)


#: engines that run the frozen forward (:class:`reservoir.runtime.engines.Engine`), torch first
ENGINES: Registry[Any] = Registry("engine", home="reservoir.runtime", ordered=True)
#: linear heads ``fit`` trains (:class:`reservoir.probe.heads.Head`)
HEADS: Registry[Any] = Registry("head", home="reservoir.probe")
