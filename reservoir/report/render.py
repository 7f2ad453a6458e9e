"""A report as ``reservoir report`` prints it and :func:`reservoir.api.results` returns it: the results a
:class:`~reservoir.config.ReportConfig` names, laid out, with the paper's table beside them when asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reservoir.config import ReportConfig
from reservoir.errors import DataError, UsageError
from reservoir.paths import home
from reservoir.progress import log
from reservoir.report.tables import Report
from reservoir.results import load_results


@dataclass
class Rendered:
    """A report and its markdown text (the paper table's caption first, when one is laid out)."""

    report: Report
    text: str


def paper_table(cfg: ReportConfig) -> tuple[Any, dict[str, str]]:
    """The paper's table ``cfg.paper`` (``None`` when not asked) and the rows of ours that stand for its rows
    (``--as BACKBONE[:GROUPS]=ROW``); UsageError naming the choices otherwise."""
    table = None
    if cfg.paper is not None:
        from reservoir.report.paper import TABLES

        if cfg.paper not in TABLES:
            raise UsageError(f"the paper has no table {cfg.paper} here; choose from {sorted(TABLES)}")
        table = TABLES[cfg.paper]
    mapping = {}
    for item in cfg.paper_rows:
        ours, sep, row = item.partition("=")
        if not sep or table is None or row not in table.rows:
            known = sorted(table.rows) if table else []
            raise UsageError(
                f"--as {item!r}: expected BACKBONE[:GROUPS]=ROW with --paper N, ROW one of {known}"
            )
        mapping[ours] = row
    return table, mapping


def check_asked(report: Report, mapping: dict[str, str]) -> None:
    """Refuse a ``--depth N`` no probe result holds (UsageError naming the depths they hold), and say so of an
    ``--as BACKBONE`` no result has (a table whose runs are not all done): neither leaves a silent gap."""
    probes = [row for row in report.rows if row.mode == "output-only"]
    held = sorted({d for row in probes for d in row.by_depth})
    absent = [d for d in report.depths if isinstance(d, int) and d not in held]
    if absent and probes:
        raise UsageError(
            f"--depth {absent[0]}: no probe result of these has depth {absent[0]}; they hold depths "
            f"{', '.join(map(str, held))} (or use chosen or last)"
        )
    backbones = sorted({row.backbone for row in report.rows})
    for ours in (o for o in mapping if o.split(":")[0] not in backbones):
        log(
            f"--as {ours}={mapping[ours]}: no result has backbone {ours.split(':')[0]!r} (the results' "
            f"backbones: {', '.join(backbones)}); that row stays without our number"
        )


def render(cfg: ReportConfig) -> Rendered:
    """The report of ``cfg``: its results (default: ``results/`` under ``$RESERVOIR_HOME``) laid out
    (default: as the paper's table, else by depth). DataError when no result is found; UsageError for a
    paper table or row that does not exist, or depth rules the layout cannot show."""
    table, mapping = paper_table(cfg)
    layout = cfg.layout or ("depth" if table is None or all(c.isdigit() for c in table.columns) else "task")
    if cfg.depths != ("chosen",) and layout == "depth":
        raise UsageError(
            f"--depth picks the depth of the task layout ({', '.join(map(str, cfg.depths))} here), and this "
            "report is laid out by depth (every depth a column); add --layout task (layout='task' in api.results)"
        )
    paths = list(cfg.paths) or [home() / "results"]
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise DataError(f"{missing[0]} does not exist; pass result files or folders (default: results/)")
    found = load_results([Path(p) for p in paths])
    if not found:
        raise DataError(
            f"no results found in {', '.join(map(str, paths))}; run `reservoir fit` or `reservoir train` "
            "(api.fit, api.train) first"
        )
    report = Report(found, paper=table, paper_rows=mapping, depths=cfg.depths)
    check_asked(report, mapping)
    text = report.markdown(layout)
    if table is not None:
        caption = f"Paper table {table.number}: {table.caption}" + (f" ({table.note})" if table.note else "")
        text = f"{caption}\n\n{text}"
    return Rendered(report, text)
