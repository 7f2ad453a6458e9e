"""Settings declared once: the constraint vocabulary, the one validator that writes every message, and
the :func:`setting` a config field is declared with (type, default, rules, help, command-line spelling).

The configs of the commands are in :mod:`reservoir.config`; the command line's options are generated from
their fields (:func:`declared`, used by ``reservoir.cli``), the API checks the same fields
(``reservoir.api.configure``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from reservoir.errors import UsageError

# ---------------------------------------------------------------- constraints: declared once, one validator


class Constraint:
    """A rule a parameter's value meets; :func:`check` writes the message when it does not.

    ``owner`` is the object the parameter belongs to (a config, an estimator), for rules that
    depend on its other parameters."""

    def ok(self, value: Any, owner: Any = None) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def text(self, owner: Any = None) -> str:
        """What the value must be, completing "must be ..."."""
        raise NotImplementedError  # pragma: no cover - abstract

    def why(self, value: Any, owner: Any = None) -> str:
        """What ``value``, refused, should have been (the rule's text; a compound rule's failing part)."""
        return self.text(owner)


@dataclass(frozen=True)
class Interval(Constraint):
    """A number in ``[low, high]`` (``closed``: ``"both"``, ``"left"``, ``"right"``, ``"neither"``);
    a bound ``None`` is open, a callable bound is computed from the owner; ``each``: a non-empty
    sequence whose every value is; ``note`` (from the owner) follows the rule; ``integer``: an int
    only. NaN is in no interval."""

    low: float | Callable[[Any], float] | None = None
    high: float | Callable[[Any], float] | None = None
    closed: str = "both"
    each: bool = False
    note: Callable[[Any], str] | None = None
    integer: bool = False

    def _bounds(self, owner: Any) -> tuple[Any, Any]:
        return tuple(b(owner) if callable(b) else b for b in (self.low, self.high))

    def _in(self, x: Any, owner: Any) -> bool:
        low, high = self._bounds(owner)
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        try:
            return (low is None or (x >= low if left else x > low)) and (
                high is None or (x <= high if right else x < high)
            )
        except TypeError:
            return False

    def ok(self, value: Any, owner: Any = None) -> bool:
        if self.each:
            return isinstance(value, (list, tuple)) and bool(value) and all(self._in(x, owner) for x in value)
        if self.integer and not isinstance(value, (int, np.integer)):
            return False
        return not isinstance(value, bool) and self._in(value, owner)

    def text(self, owner: Any = None) -> str:
        low, high = self._bounds(owner)
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        if low is not None and high is not None:
            rule = f"in {'[' if left else '('}{low}, {high}{']' if right else ')'}"
        elif low is not None:
            rule = f"{'>=' if left else '>'} {low}"
        else:
            rule = f"{'<=' if right else '<'} {high}"
        return (
            ("an integer " if self.integer else "")
            + rule
            + (" (each)" if self.each else "")
            + (self.note(owner) if self.note else "")
        )


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of ``choices``: a tuple, or a registry (:class:`reservoir.registry.Registry`) read when
    asked, after the ``first`` fixed choices (``"auto"``). The command line's ``click.Choice`` of
    the parameter lists :meth:`values`."""

    choices: Any
    first: tuple[str, ...] = ()

    def values(self) -> list[Any]:
        found = self.choices.names() if hasattr(self.choices, "names") else self.choices
        return [*self.first, *found]

    def ok(self, value: Any, owner: Any = None) -> bool:
        try:
            return value in self.values()
        except TypeError:  # an unhashable value
            return False

    def text(self, owner: Any = None) -> str:
        values = self.values()
        return repr(values[0]) if len(values) == 1 else f"one of {values}"


@dataclass(frozen=True)
class Divides(Constraint):
    """A positive integer dividing ``number``."""

    number: int

    def ok(self, value: Any, owner: Any = None) -> bool:
        return isinstance(value, (int, np.integer)) and value >= 1 and self.number % value == 0

    def text(self, owner: Any = None) -> str:
        divisors = ", ".join(str(d) for d in range(1, self.number + 1) if self.number % d == 0)
        return f"a divisor of {self.number} ({divisors})"


@dataclass(frozen=True)
class Matches(Constraint):
    """Text matching ``pattern`` whole; ``said`` says which in words."""

    pattern: str
    said: str

    def ok(self, value: Any, owner: Any = None) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None

    def text(self, owner: Any = None) -> str:
        return self.said


@dataclass(frozen=True)
class Suffix(Constraint):
    """A path whose name ends ``suffix`` (an output of one kind: a file of another kind named there by mistake,
    perhaps a user's own, is never written)."""

    suffix: str

    def ok(self, value: Any, owner: Any = None) -> bool:
        return isinstance(value, (str, Path)) and Path(value).suffix.lower() == self.suffix

    def text(self, owner: Any = None) -> str:
        return f"a file named *{self.suffix} (another kind of file is never written)"


@dataclass(frozen=True)
class Distinct(Constraint):
    """A sequence without repeated values; ``named``: nor values that read alike as it writes them (the
    names of files and keys they make), ``how`` says how."""

    named: Callable[[Any], str] | None = None
    how: str = ""

    def ok(self, value: Any, owner: Any = None) -> bool:
        return len(set(map(self.named or (lambda v: v), value))) == len(value)

    def text(self, owner: Any = None) -> str:
        return "distinct values" + (f" {self.how}" if self.how else "")


@dataclass(frozen=True)
class NotEmpty(Constraint):
    """A non-empty sequence; ``said`` names one element ("at least one group")."""

    said: str

    def ok(self, value: Any, owner: Any = None) -> bool:
        return bool(value)

    def text(self, owner: Any = None) -> str:
        return self.said


@dataclass(frozen=True)
class AllOf(Constraint):
    """Every one of ``rules`` (a list of learning rates: each in range, and distinct)."""

    rules: tuple[Constraint, ...]

    def ok(self, value: Any, owner: Any = None) -> bool:
        return all(r.ok(value, owner) for r in self.rules)

    def text(self, owner: Any = None) -> str:
        return " and ".join(r.text(owner) for r in self.rules)

    def why(self, value: Any, owner: Any = None) -> str:
        return next(r.why(value, owner) for r in self.rules if not r.ok(value, owner))


#: the rules of a parameter: any one passing admits the value (scikit-learn's any-of constraints);
#: ``None`` among them admits ``None``
Rules = tuple["Constraint | None", ...]


def check(
    owner: str,
    name: str,
    value: Any,
    *rules: Constraint | None,
    obj: Any = None,
    note: str = "",
    noun: str = "parameter",
) -> None:
    """``value`` of ``name`` meets one of ``rules`` (``None`` among them admits ``None``); else a UsageError
    in scikit-learn's words: "The 'depth' parameter of fit must be in [0, 12]. Got 13 instead." (``note``
    follows the rule; ``noun`` "option" for a task's options). The one place such a message is written."""
    if value is None and None in rules:
        return
    real = [r for r in rules if r is not None]
    if not real or any(r.ok(value, obj) for r in real):
        return
    shown = list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
    rule = " or ".join(r.why(value, obj) for r in real)
    raise UsageError(f"The {name!r} {noun} of {owner} must be {rule}{note}. Got {shown!r} instead.")


def constraints(owner: Any) -> dict[str, Rules]:
    """The declared rules of a config dataclass's fields (or a task's options), or an estimator's
    ``parameter_constraints``, by parameter name."""
    if dataclasses.is_dataclass(owner):
        return {f.name: f.metadata["rules"] for f in dataclasses.fields(owner) if f.metadata.get("rules")}
    return dict(getattr(owner, "parameter_constraints", {}))


def validate(obj: Any, owner: str, noun: str = "parameter") -> None:
    """Every declared rule of ``obj``'s parameters (:func:`constraints`), by :func:`check`."""
    for name, rules in constraints(obj).items():
        check(owner, name, getattr(obj, name), *rules, obj=obj, noun=noun)


def choices(cls: type, name: str) -> OneOf:
    """The :class:`OneOf` declared for field ``name`` of ``cls`` (the command line's choices)."""
    return next(r for r in constraints(cls)[name] if isinstance(r, OneOf))


# ---------------------------------------------------------------- settings: one declaration each

#: what a setting may say of its command-line form (:func:`setting`); the command line builds its options
#: from these (``reservoir.cli.declared``)
CLI_KEYS = frozenset(
    {
        "option",  # the option's name when not --FIELD-NAME; False: no option
        "short",  # a one-letter alias, "-t"
        "metavar",
        "flag",  # "single" (--force) or "pair" (--compile/--no-compile)
        "path",  # "file", "dir" or "any": a path (``exists``: it must exist)
        "exists",
        "multiple",  # the option may be repeated; the values arrive as a tuple
        "argument",  # a positional argument (``nargs`` -1: any number of them)
        "nargs",
        "hidden",
        "default_text",  # the help's [default: ...] when the field's default does not say it
    }
)


def setting(
    default: Any = dataclasses.MISSING,
    *rules: Constraint | None,
    help: str = "",
    factory: Any = dataclasses.MISSING,
    parse: Callable[[Any], Any] | None = None,
    selects: str | None = None,
    **cli: Any,
) -> Any:
    """A setting, declared once: a config field with its ``default`` (``factory`` for a mutable one), its
    ``rules`` (any one passing admits a value; ``None`` among them admits ``None``), its ``help`` (the
    command line's and the docs'), ``parse`` (a value as text, or in a looser form, to the field's form;
    ValueError or UsageError on a bad one), ``selects`` (the key of a feature file's identity the value must
    equal, for a setting that chooses among files) and how the command line spells it (:data:`CLI_KEYS`).

    The command line's options (``reservoir.cli``), the API's keyword checks (:func:`build`) and the docs'
    option tables (``docs/guide/options.md``) are generated from these declarations."""
    unknown = sorted(set(cli) - CLI_KEYS)
    if unknown:
        raise TypeError(f"unknown key {unknown[0]!r} of a setting; choose from {sorted(CLI_KEYS)}")
    return field(
        default=default,
        default_factory=factory,
        metadata={"rules": rules, "help": help, "parse": parse, "cli": cli, "selects": selects},
    )


def selecting(cls: type) -> dict[str, str]:
    """The settings of a config dataclass that choose a feature file: identity key -> field name."""
    return {f.metadata["selects"]: f.name for f in dataclasses.fields(cls) if f.metadata.get("selects")}


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of a config dataclass (help texts show it from here)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return None
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def option_name(cls: type, name: str) -> str:
    """The command-line option that sets field ``name`` of a config dataclass (``--extract-seed``)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.metadata.get("cli", {}).get("option") or f"--{name.replace('_', '-')}"


def shown_default(f: dataclasses.Field) -> str:
    """A setting's default as its help shows it ("" when it has none to show)."""
    text = f.metadata.get("cli", {}).get("default_text")
    if text is not None:
        return text
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return ""
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if isinstance(value, (tuple, list)):
        value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return "" if value in (None, "", (), {}) else str(value)


class Config:
    """A run's settings (the base of every config dataclass): each field a :func:`setting`.

    Building one parses the values given in a looser form (``parse``: text from the command line, a
    number where a list is kept), checks every field's rules (:func:`validate`) and then the checks across
    fields (:meth:`combined`), so the command line and the API refuse the same values with the same words.
    """

    #: the command the config belongs to, as messages name it ("The 'limit' parameter of extract ...")
    command = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            parse = f.metadata.get("parse")
            value = getattr(self, f.name)
            if parse is not None and value is not None:
                try:
                    object.__setattr__(self, f.name, parse(value))
                except (UsageError, TypeError, ValueError) as e:
                    said = str(e)  # a message opening with the bare value gets its option's name first
                    raise UsageError(
                        f"{option_name(type(self), f.name)} {said}" if said.startswith(repr(value)) else said
                    ) from None
        validate(self, self.command)
        self.combined()

    def combined(self) -> None:
        """Checks across fields (one option excluding another, say): UsageError naming both."""

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values: paths as text, tuples as lists."""

        def plain(v: Any) -> Any:
            if isinstance(v, Path):
                return str(v)
            if isinstance(v, tuple):
                return [plain(x) for x in v]
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def build(cls: type, **settings: Any) -> Any:
    """A config from keyword settings: an unknown name is refused naming the known ones (nanoGPT's
    configurator), and ``None`` means unset, so the dataclass default applies."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in settings if k not in names]
    if unknown:
        raise UsageError(f"unknown setting {unknown[0]!r}; choose from {sorted(names)}")
    return cls(**{k: v for k, v in settings.items() if v is not None})


def comma_list(kind: type) -> Callable[[Any], tuple[Any, ...]]:
    """A parser of a list setting: ``"a,b,c"``, one value, or a sequence, to a tuple of ``kind``; an empty
    item (``"a,,b"``, ``"a,"``) is refused."""

    def parse(value: Any) -> tuple[Any, ...]:
        items = value
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",")]
            items = [p for p in parts if p]
            if items and len(items) < len(parts):
                raise UsageError(
                    f"{value!r} has an empty item; separate the values by single commas ({','.join(items)!r})"
                )
        if isinstance(items, (str, int, float)):
            items = [items]
        try:
            out = tuple(kind(v) for v in items)
        except (TypeError, ValueError):
            raise UsageError(f"{value!r} must be a comma-separated list of {kind.__name__} values") from None
        if not out:
            raise UsageError(f"{value!r} names no values")
        return out

    return parse


def key_values(value: Any) -> dict[str, Any]:
    """A task's options: a dict as it is, or ``("key=value", ...)`` pairs (``--task-opt``) to a dict of text
    (the task converts and checks them: ``reservoir.tasks.check_options``); a key given twice is refused."""
    if isinstance(value, dict):
        return dict(value)
    out = {}
    for pair in [value] if isinstance(value, str) else value:
        key, sep, text = str(pair).partition("=")
        if not sep or not key:
            raise UsageError(f"task option {pair!r} is not of the form key=value")
        key = key.strip()
        if key in out:
            raise UsageError(f"--task-opt {key} is given twice ({out[key]} and {text.strip()}); give it once")
        out[key] = text.strip()
    return out


# ---------------------------------------------------------------- the command line's options, from the declarations


class DeclaredChoice(click.Choice):
    """The ``click.Choice`` of a config field: the values its :class:`reservoir.settings.OneOf` declares,
    read when click first needs them (a registry's, such as the engines', then fills: its modules are not
    imported before). Any text passes here; the config refuses a value outside them."""

    def __init__(self, cls: type, name: str):
        self.rule = choices(cls, name)
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.rule.values())

    def convert(self, value, param, ctx):
        return value


def _shown_range(kind: type, rule: Interval) -> click.ParamType:
    """A number type whose help shows ``rule``'s range (``[x>=1]``) without checking it: the config does,
    in the words the API uses."""
    base = click.IntRange if kind is int else click.FloatRange

    class Shown(base):  # type: ignore[valid-type, misc]
        def convert(self, value, param, ctx):
            return click.types._NumberParamTypeBase.convert(self, value, param, ctx)

    return Shown(
        min=rule.low,
        max=rule.high,
        min_open=rule.closed in ("right", "neither"),
        max_open=rule.closed in ("left", "neither"),
    )


def _type(cls: type, f: dataclasses.Field) -> click.ParamType | None:
    cli, rules, kind = f.metadata["cli"], [r for r in f.metadata["rules"] if r is not None], str(f.type)
    if cli.get("path"):
        path = cli["path"]
        return click.Path(
            exists=cli.get("exists", False), file_okay=path != "dir", dir_okay=path != "file", path_type=Path
        )
    if any(isinstance(r, OneOf) for r in rules):
        return DeclaredChoice(cls, f.name)
    number = int if kind.startswith("int") else float if kind.startswith("float") else None
    if number is None or f.metadata["parse"] is not None:
        return None
    ranges = [r for r in rules if isinstance(r, Interval) and not r.each]
    static = ranges and not any(callable(b) for b in (ranges[0].low, ranges[0].high))
    return _shown_range(number, ranges[0]) if static else click.INT if number is int else click.FLOAT


def _parameter(cls: type, f: dataclasses.Field):
    """The click option (or argument) a config field declares."""
    cli = f.metadata["cli"]
    if cli.get("argument"):
        return click.argument(f.name, type=_type(cls, f), nargs=cli.get("nargs", 1))
    names = [option_name(cls, f.name)]
    flag = cli.get("flag")
    if flag == "pair":
        names = [f"{names[0]}/--no-{names[0][2:]}"]
    if cli.get("short"):
        names.insert(0, cli["short"])
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    shown = shown_default(f) if flag != "single" and not required else ""
    return click.option(
        *names,
        f.name,
        type=None if flag else _type(cls, f),
        is_flag=flag == "single" or None,
        multiple=cli.get("multiple", False),
        **({} if required else {"default": None}),  # click 8.5 takes a default of None as given
        required=required,
        metavar=cli.get("metavar"),
        hidden=cli.get("hidden", False),
        help=f.metadata["help"] + (f" [default: {shown}]" if shown else ""),
    )


def declared(cls: type, *, only: tuple[str, ...] = ()):
    """Decorator: the options of every field of ``cls`` the command line spells (or of ``only`` these), in
    the order of the fields."""

    def add(fn):
        for f in reversed(dataclasses.fields(cls)):
            if f.metadata.get("cli", {}).get("option") is False or (only and f.name not in only):
                continue
            fn = _parameter(cls, f)(fn)
        return fn

    return add
