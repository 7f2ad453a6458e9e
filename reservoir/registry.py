"""A name -> factory registry shared by tasks and backbones (timm's ``register_model`` shape)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from reservoir.errors import UsageError

T = TypeVar("T")


@dataclass
class Registry(Generic[T]):
    """Factories keyed by name; ``kind`` names the thing in error messages."""

    kind: str
    _entries: dict[str, Callable[..., T]] = field(default_factory=dict)
    _help: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, factory: Callable[..., T] | None = None, *, help: str = ""):
        """Register ``factory`` under ``name``; usable as a decorator."""

        def add(f: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = f
            self._help[name] = (
                help or (f.__doc__ or "").strip().splitlines()[0] if (help or f.__doc__) else ""
            )
            return f

        return add(factory) if factory is not None else add

    def names(self) -> list[str]:
        return sorted(self._entries)

    def help(self, name: str) -> str:
        return self._help.get(name, "")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def factory(self, name: str) -> Callable[..., T]:
        try:
            return self._entries[name]
        except KeyError:
            raise UsageError(f"unknown {self.kind} {name!r}; choose from {self.names()}") from None

    def create(self, name: str, **options: Any) -> T:
        return self.factory(name)(**options)
