"""Tables, CSV and plots across results (:mod:`reservoir.results` owns the schema, the writer and
the reader).

A row is one setting: task, backbone, mode, head, trained groups, input scale and the producing run.
The number an output-only row reports is the test accuracy at the depth chosen on validation (the best
mean validation accuracy over seeds; ties go to the shallower depth), never the best test accuracy,
which appears only labelled as such. Results of several seeds share a row: mean, and spread over seeds.
Baselines (:mod:`reservoir.probe.baselines`) are shown only beside results of the same data
(:func:`reservoir.report.rows.data_key`) and head; a table mixing data shows each data's rows under a
line naming it. The FPT paper's number (:mod:`reservoir.report.paper`) is shown beside ours where a row
is mapped to a row of the paper's table (``--as BACKBONE=ROW``).
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from reservoir.probe.metrics import METRICS
from reservoir.report.paper import CRITIQUE_SOURCE
from reservoir.report.rows import (
    DataGroup,
    Row,
    baseline_name,
    baseline_rank,
    baselines_of,
    class_names_of,
    classes_line,
    collect,
    data_groups,
    data_label,
    drawn_data,
    fit_settings,
    pct,
    score_text,
)

#: how an output-only setting's depth is picked in the task layout (or a depth number), and the label of each
DEPTH_RULES = {"chosen": "depth chosen on validation", "last": "last depth"}


def baseline_text(b: dict[str, Any]) -> str:
    """A baseline's test score as cells show it: the mean over the fits of a row of several, how many, and whether
    it was fitted otherwise than the row's probes."""
    metric = METRICS[b.get("metric", "accuracy")]
    text = score_text(b["test_score"], b.get("test_std"), b.get("n_data", 1), metric)
    if b.get("of_data") and b["n_data"] < b["of_data"]:
        text += f" ({b['n_data']} of {b['of_data']} fits)"
    if b.get("other_fit"):
        text += " (not fitted at the probes' seeds and held-out share)"
    return text


def table_line(cells: list[str]) -> str:
    """One line of a markdown table."""
    return "| " + " | ".join(cells) + " |"


def table_head(cells: list[str]) -> list[str]:
    """The heading line of a markdown table and the rule under it."""
    return [table_line(cells), "|" + "---|" * len(cells)]


def rule_label(rule: str | int) -> str:
    return DEPTH_RULES[rule] if isinstance(rule, str) else f"depth {rule}"


def paper_cell(ours: str, paper: float | str | None, pm: float | None = None, who: str = "paper") -> str:
    """``ours (paper N)``; ``who`` names the source (``critique`` for Rothermel et al.), ``pm`` its printed error."""
    if paper is None:
        return ours
    if pm is not None:  # as the critique prints it, one decimal each
        return f"{ours} ({who} {paper:.1f} ± {pm:.1f})"
    return f"{ours} ({who} {paper:g})" if isinstance(paper, float) else f"{ours} ({who} {paper})"


def swept_lr(result: dict[str, Any]) -> float | None:
    """The learning rate an end-to-end result chose on validation, when it swept more than one."""
    return result["lr"] if len(result.get("sweep") or {}) > 1 else None


def row_label(row: Row) -> str:
    label = row.backbone
    if row.mode == "end-to-end":
        label += f" [{row.trainable}]"
    if row.scale != "paper":
        label += f", input scale {row.scale}"
    return label


#: identity fields that never tell two settings apart in a label (they follow the data or the seed)
UNLABELLED = (
    "data",
    "subset",
    "backbone_fingerprint",
    "backbone_fingerprints",
    "matched_std",
    "matched_stds",
)


def metric_words(metric: Any) -> str:
    """A metric and its direction, in words: ``nrmse, lower is better``."""
    return f"{metric.name}, {'higher' if metric.greater_is_better else 'lower'} is better"


def _settings(row: Row) -> dict[str, str]:
    """A row's identity, nested options flattened to ``key.option``, each value as short text."""
    out = {}
    for key, value in row.results[0].get("identity", {}).items():
        if key in UNLABELLED:
            continue
        for k, v in value.items() if isinstance(value, dict) else [(None, value)]:
            text = v if isinstance(v, str) else "none" if v is None else json.dumps(v, sort_keys=True)
            out[key if k is None else f"{key}.{k}"] = text if len(text) <= 24 else text[:21] + "..."
    out |= {f"fit {k}": json.dumps(v) for k, v in fit_settings(row.results[0]).items()}
    if all(drawn_data(r) for r in row.results):  # the data's seed is the run's: the seed says it
        out.pop("task_options.seed", None)
    seeds = sorted(
        {x["seed"] for r in row.results for x in r.get("runs") or [] if x.get("lr") == r.get("lr")}
    )
    if "seeds" in out and seeds:  # seeds run apart fold into one row: it shows them all
        out["seeds"] = json.dumps(seeds)
    folded = sorted(
        {r.get("identity", {}).get("seed") for r in row.results}, key=lambda s: (s is None, s or 0)
    )
    if "seed" in out and len(folded) > 1:  # a probe's row of several features' seeds
        out["seed"] = json.dumps(folded)
    return out


def row_labels(rows: list[Row]) -> dict[int, str]:
    """Each row's label (by ``id``): :func:`row_label`, plus the settings that tell apart rows sharing it."""
    labels = {id(r): row_label(r) for r in rows}
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(labels[id(r)], r.head)].append(r)
    for (label, _), group in groups.items():
        settings = {id(r): _settings(r) for r in group}
        keys: set[str] = set()
        for task in {r.task for r in group}:
            same = [settings[id(r)] for r in group if r.task == task]
            if len(same) > 1:
                keys |= {k for k in set().union(*same) if len({s.get(k, "-") for s in same}) > 1}
        for r in group:
            labels[id(r)] = label + "".join(f", {k} {settings[id(r)].get(k, '-')}" for k in sorted(keys))
            if r.data:  # one seed on several data sets or weights (rows.collect)
                labels[id(r)] += f", {r.data}"
            if missing := r.missing_depths:
                labels[id(r)] += (
                    f" (incomplete: depths {', '.join(map(str, missing))} of its fit have no result)"
                )
    alike: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in rows:
        alike[(labels[id(r)], r.head, r.task)].append(r)
    for group in alike.values():  # settings alike in words (values cut short): told apart by their run
        if len(group) > 1:
            for r in group:
                labels[id(r)] += f", run {r.run}"
    return labels


class Report:
    """Markdown and CSV of results, laid out by depth (one table per task) or by task (one row per setting)."""

    def __init__(
        self,
        results: list[dict[str, Any]],
        *,
        paper: Any = None,
        paper_rows: dict[str, str] | None = None,
        depths: tuple[str | int, ...] = ("chosen",),
    ):
        self.rows, self.baselines = collect(results)
        self.paper, self.paper_rows = paper, dict(paper_rows or {})
        #: the task layout's rules for output-only rows (DEPTH_RULES)
        self.depths = tuple(depths) or ("chosen",)
        self.records: list[dict[str, Any]] = []  # the CSV, one line per cell
        self.labels = row_labels(self.rows)

    def label(self, row: Row) -> str:
        return self.labels[id(row)]

    def paper_row(self, row: Row) -> str | None:
        """The paper's row ``row`` stands for (``--as BACKBONE:GROUPS=ROW``, else ``--as BACKBONE=ROW``)."""
        return self.paper_rows.get(f"{row.backbone}:{row.trainable}", self.paper_rows.get(row.backbone))

    def paper_number(self, row: Row, column: str) -> float | None:
        name = self.paper_row(row)
        return self.paper.rows.get(name, {}).get(column) if self.paper is not None and name else None

    @property
    def who(self) -> str:
        """How cells name the source of the numbers beside ours: "paper", or "critique" (Rothermel et al.)."""
        return "critique" if self.paper is not None and self.paper.source == CRITIQUE_SOURCE else "paper"

    def beside(self, row: Row, column: str, ours: str) -> str:
        """``ours`` with the paper's (or the critique's) number of the row ``row`` stands for, and its printed error."""
        paper = self.paper_number(row, column)
        if paper is None:
            return ours
        pm = self.paper.plus_minus.get(self.paper_row(row), {}).get(column)
        return paper_cell(ours, paper, pm, self.who)

    def record(self, row: Row, column: str, **values: Any) -> None:
        self.records.append(
            {
                "task": row.task,
                "setting": self.label(row),
                "backbone": row.backbone,
                "mode": row.mode,
                "head": row.head,
                "trainable": row.trainable,
                "input_scale": row.scale,
                "run": row.run,
                "n_train/n_test": row.size,
                "data": self.data_of(row),
                **({"classes": "; ".join(names)} if (names := class_names_of(row)) else {}),
                "column": column,
                "metric": row.metric.name,
                **values,
            }
        )

    def groups(self, task: str, every_mode: bool = False) -> list[DataGroup]:
        """The output-only rows of ``task`` (``every_mode``: every row) by their data (:func:`data_groups`),
        computed once."""
        cache = self.__dict__.setdefault("_groups", {})
        if (task, every_mode) not in cache:
            cache[task, every_mode] = data_groups(self.rows, task, every_mode)
        return cache[task, every_mode]

    def data_of(self, row: Row) -> str:
        """The data of a row in words (:func:`data_label`), as its data group names it."""
        return next(g.label for g in self.groups(row.task, every_mode=True) if any(r is row for r in g.rows))

    def record_baseline(self, b: dict[str, Any], task: str, column: str, data: str = "") -> None:
        self.records.append(
            {
                "task": task,
                "setting": f"baseline: {baseline_name(b)}",
                "backbone": b["backbone"],
                "mode": "baseline",
                "head": b["head"],
                "n_train/n_test": f"{b['n_train']}/{b['n_test']}",
                "data": data or data_label(b),
                "column": column,
                "metric": b.get("metric", "accuracy"),
                "test": b["test_score"],
                "val": b["val_score"],
                **({"test_std": b.get("test_std"), "n_seeds": b["n_data"]} if "n_data" in b else {}),
                **({"of_fits": b["of_data"]} if b.get("of_data") else {}),
                **({"other_fit": True} if b.get("other_fit") else {}),
            }
        )

    def record_missing(self, group: DataGroup, column: str) -> None:
        """A CSV line saying a data group of ``column`` has no baselines."""
        self.records.append(
            {
                "task": group.task,
                "setting": "baselines: none found for this data",
                "mode": "baseline",
                "data": group.label,
                "column": column,
            }
        )

    # ---------------------------------------------------------------- depth layout
    def depth_tables(self) -> str:
        out = []
        for task in dict.fromkeys(r.task for r in self.rows):
            rows = [r for r in self.rows if r.task == task]
            depths = sorted({d for r in rows for d in r.by_depth})
            head = (
                ["setting", "head", "n train/test"]
                + [f"d{d}" for d in depths]
                + ["chosen on val: depth", "test at chosen", "best by test (not for claims)"]
            )
            metric = rows[0].metric if rows else METRICS["accuracy"]
            notes = [] if metric.name == "accuracy" else [metric_words(metric)]
            splits = rows[0].test_splits if rows else ["test"]
            if splits != ["test"]:  # which test split the cells score, and where the others are
                notes.append(
                    f"test split {splits[0]}" + ("; every test split in the CSV" if len(splits) > 1 else "")
                )
            title = f"### {task}" + (f" ({'; '.join(notes)})" if notes else "")
            classes = classes_line(rows)
            lines = [title, "", *([classes, ""] if classes else [])]
            lines += table_head(head)
            groups, every = self.groups(task), self.groups(task, every_mode=True)
            if len(every) <= 1:  # one data: its rows, then its baselines
                lines += self.row_lines(rows, depths)
                lines += [line for g in groups for line in self.baseline_lines(g, len(depths))]
            else:  # each data under a line naming it, with its own baselines
                for group in every:
                    lines.append(table_line([f"*data: {group.label}*"] + [""] * (len(head) - 1)))
                    lines += self.row_lines(group.rows, depths)
                    probes = next((g for g in groups if g.keys == group.keys), None)
                    lines += self.baseline_lines(probes, len(depths), say_missing=True) if probes else []
            out.append("\n".join(lines))
        return "\n\n".join(out)

    def row_lines(self, rows: list[Row], depths: list[int]) -> list[str]:
        """The depth layout's line of each row (and its CSV records)."""
        lines = []
        for row in rows:
            cells = []
            for d in depths:
                if d not in row.by_depth:
                    cells.append("")
                    continue
                mean, std, n = row.spread(d)
                paper = self.paper_number(row, str(d))
                cells.append(self.beside(row, str(d), row.text(mean, std, n) + row.short_of(d)))
                self.record(
                    row,
                    f"d{d}",
                    test=mean,
                    test_std=std,
                    n_seeds=n,
                    val=row.val(d),
                    paper=paper,
                    **row.other_tests(d),
                )
            c, b = row.chosen, row.best_by_test
            mean, std, n = row.spread(c)
            self.record(
                row,
                "chosen",
                depth=c,
                test=mean,
                test_std=std,
                n_seeds=n,
                val=row.val(c),
                paper=self.paper_number(row, str(c)),
            )
            lines.append(
                table_line(
                    [self.label(row), row.head, row.size]
                    + cells
                    + [str(c), row.text(mean, std, n), f"{row.text(row.spread(b)[0])} (d{b})"]
                )
            )
        return lines

    def baseline_lines(self, group: DataGroup, n_depths: int, say_missing: bool = False) -> list[str]:
        """The baselines of a data group, a line each (and their CSV records); ``say_missing``: say when none."""
        lines = []
        found = baselines_of(group, self.baselines)
        for b in found:
            label = f"baseline: {baseline_name(b)}"
            n = f"{b['n_train']}/{b['n_test']}"
            lines.append(table_line([label, b["head"], n] + [""] * n_depths + ["", baseline_text(b), ""]))
            self.record_baseline(b, group.task, "baseline", group.label)
        if not found and say_missing:
            lines.append(
                table_line(
                    ["baselines: none found for this data (fit its features with baselines)", "", ""]
                    + [""] * (n_depths + 3)
                )
            )
            self.record_missing(group, "baseline")
        return lines

    # ---------------------------------------------------------------- task layout
    def task_table(self) -> str:
        ours = list(dict.fromkeys(r.task for r in self.rows))
        columns = self.paper.columns if self.paper is not None else ()
        tasks = [t for t in columns if t in ours] + [t for t in ours if t not in columns]  # the paper's first
        rules = self.depths
        settings: dict[tuple, dict[str, tuple[Row, str | int]]] = defaultdict(dict)
        for row in self.rows:
            for rule in rules if row.mode == "output-only" else ("chosen",):
                label = self.label(row)
                if row.mode == "output-only" and rules != ("chosen",):
                    label += f", {rule_label(rule)}"
                settings[(label, row.head)][row.task] = (row, rule)
        metrics = {r.task: r.metric for r in self.rows}
        head = ["setting", "head"] + [
            f"{t} ({'' if metrics[t].name == 'accuracy' else metric_words(metrics[t]) + '; '}n train/test)"
            for t in tasks
        ]
        lines = table_head(head)
        for (label, headname), by_task in settings.items():
            cells = []
            for t in tasks:
                row, rule = by_task.get(t, (None, None))
                c = None if row is None else row.depth_for(rule)
                if c is None:
                    cells.append("")
                    continue
                mean, std, n = row.spread(c)
                paper = self.paper_number(row, t)
                depth = f", d{c}" if row.mode == "output-only" and len(row.by_depth) > 1 else ""
                extra = (
                    {"depth_rule": str(rule)} if rules != ("chosen",) and row.mode == "output-only" else {}
                )
                if self.paper is not None and self.paper.unit == "steps":  # steps to the target (table 6)
                    r = row.by_depth[c][0]
                    steps, target = r.get("steps_to_target_mean"), r.get("target")
                    reached = [s for s in r.get("steps_to_target") or [] if s is not None]
                    runs = len(r.get("steps_to_target") or [])
                    text = (
                        f"{steps:,.0f} steps to {100 * target:g}%"
                        if steps is not None
                        else f"{len(reached)} of {runs} seeds reached {100 * target:g}% (in "
                        f"{', '.join(f'{s:,}' for s in reached)} steps)"
                        if reached
                        else f"not reached ({100 * target:g}%)"
                        if target
                        else "no --target"
                    )
                    lowest = (
                        f", lowest seed {pct(r['test_min'])}"
                        if n > 1 and r.get("test_min") is not None
                        else ""
                    )
                    cells.append(
                        paper_cell(
                            f"{text}; test {pct(mean, std, n)}{lowest} ({row.size})",
                            None if paper is None else f"{paper:,.0f} steps",
                            who=self.who,
                        )
                    )
                    self.record(
                        row,
                        t,
                        depth=c,
                        steps_to_target=steps,
                        target=target,
                        test=mean,
                        test_std=std,
                        test_min=r.get("test_min"),
                        n_seeds=n,
                        paper=paper,
                        **extra,
                    )
                    continue
                lr = swept_lr(row.by_depth[c][0]) if row.mode == "end-to-end" else None
                text = (
                    f"{row.text(mean, std, n)} ({row.size}{depth}{f', lr {lr:g}' if lr is not None else ''})"
                    + row.short_of(c)
                )
                cells.append(self.beside(row, t, text))
                self.record(
                    row,
                    t,
                    depth=c,
                    test=mean,
                    test_std=std,
                    n_seeds=n,
                    val=row.val(c),
                    paper=paper,
                    **({"lr": lr} if lr is not None else {}),
                    **extra,
                )
            lines.append(table_line([label, headname] + cells))
        # a line per baseline and head (and per data, where a task mixes data)
        by_name: dict[tuple[str, str], dict[str, tuple[dict[str, Any] | None, DataGroup]]] = defaultdict(dict)
        for t in tasks:
            groups = self.groups(t)
            for g in groups:
                suffix = f", data: {g.label}" if len(groups) > 1 else ""
                found = baselines_of(g, self.baselines)
                for b in found:
                    by_name[(f"baseline: {baseline_name(b)}{suffix}", b["head"])][t] = (b, g)
                if not found and len(groups) > 1:
                    by_name[(f"baselines: none found{suffix}", "")][t] = (None, g)

        def rank(item):
            b = next(iter(item[1].values()))[0]
            return (1, "") if b is None else (0, *baseline_rank(b["baseline"]))

        for (label, headname), by_task in sorted(by_name.items(), key=rank):
            cells = []
            for t in tasks:
                b, g = by_task.get(t, (None, None))
                if g is None:
                    cells.append("")
                elif b is None:
                    cells.append("none found")
                    self.record_missing(g, t)
                else:
                    cells.append(f"{baseline_text(b)} ({b['n_train']}/{b['n_test']})")
                    self.record_baseline(b, t, t, g.label)
            lines.append(table_line([label, headname] + cells))
        return "\n".join(lines) + self.sweep_table()

    def sweep_table(self) -> str:
        """The end-to-end results that swept learning rates, one line per setting and task: test
        accuracy at each rate, the rate chosen on validation in bold; empty without one."""
        swept = [
            (row, r)
            for row in self.rows
            if row.mode == "end-to-end"
            for r in (row.by_depth[row.chosen][0],)
            if swept_lr(r) is not None
        ]
        if not swept:
            return ""
        rates = sorted({lr for _, r in swept for lr in r["sweep"]}, key=float)  # as the result names them
        head = ["setting", "task"] + [f"lr {lr}" for lr in rates]
        lines = [
            "",
            "",
            "Test accuracy at each learning rate of the sweep (mean ± std over seeds, validation in "
            "brackets); **bold**: the rate chosen on validation.",
            "",
            *table_head(head),
        ]
        for row, r in swept:
            cells = []
            for lr in rates:
                cell = r["sweep"].get(lr)
                if cell is None:
                    cells.append("")
                elif "diverged" in cell:
                    cells.append("diverged")
                else:
                    seeds = len(r.get("seeds", [0]))
                    n = cell.get("n", seeds)  # a rate some seeds did not run: over those that did
                    std = f" ± {100 * cell['test_std']:.1f}" if n > 1 else ""
                    fewer = f" (n={n})" if n != seeds else ""
                    text = f"{pct(cell['test_mean'])}{std}{fewer} [{pct(cell['val_mean'])}]"
                    cells.append(f"**{text}**" if lr == f"{r['lr']:g}" else text)
            lines.append(table_line([self.label(row), row.task] + cells))
        return "\n".join(lines)

    def markdown(self, layout: str) -> str:
        return self.depth_tables() if layout == "depth" else self.task_table()

    def csv(self) -> str:
        columns = list(dict.fromkeys(k for rec in self.records for k in rec))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.records)
        return buf.getvalue()

    # ---------------------------------------------------------------- plots
    def plots(self, folder: Path) -> list[Path]:
        """Accuracy against depth per task, and the training curves of end-to-end results that recorded them."""
        from reservoir.report.plots import depth_plot, training_curves

        folder = Path(folder)
        written = []
        for task in dict.fromkeys(r.task for r in self.rows):
            groups = self.groups(task)  # one plot per data: a row only beside its own data's baselines
            for k, group in enumerate(groups, 1):
                rows = group.rows
                metric = rows[0].metric  # percentages as the tables show them; errors as they are
                scale = 100 if metric.percent else 1
                curves = {
                    f"{self.label(r)} ({r.head})": {d: scale * r.spread(d)[0] for d in sorted(r.by_depth)}
                    for r in rows
                }
                chosen = {f"{self.label(r)} ({r.head})": r.chosen for r in rows}
                paper = {}  # each paper row once, at the depths we ran
                deepest = max(d for r in rows for d in r.by_depth)
                for r in rows:
                    name = self.paper_row(r)
                    numbers = {
                        int(c): v
                        for c in (self.paper.columns if self.paper else ())
                        if c.isdigit() and int(c) <= deepest
                        for v in [self.paper_number(r, c)]
                        if v is not None
                    }
                    if numbers:
                        paper[f"paper: {name}"] = numbers
                baselines = {
                    f"{baseline_name(b)} ({b['head']})": scale * b["test_score"]
                    for b in baselines_of(group, self.baselines)
                }
                written.append(
                    depth_plot(
                        curves,
                        folder / (f"{task}-depth.png" if len(groups) == 1 else f"{task}-depth-{k}.png"),
                        baselines=baselines,
                        chosen=chosen,
                        paper=paper or None,
                        title=f"{task}: test {metric.name} by depth ({group.label}); ring: depth chosen on "
                        "validation",
                        ylabel=f"test {metric.name}"
                        + (" (%)" if metric.percent else f" ({metric_words(metric)})"),
                    )
                )
            runs = {
                f"{self.label(r)} d{d} lr{run.get('lr', '')} seed{run.get('seed', '')}": run["history"]
                for r in self.rows
                if r.task == task and r.mode == "end-to-end"
                for d, rs in r.by_depth.items()
                for res in rs
                for run in res.get("runs", [])
                if run.get("history")
            }
            if runs:
                written.append(
                    training_curves(
                        runs,
                        folder / f"{task}-training.png",
                        title=f"{task}: end-to-end training, validation accuracy and loss",
                    )
                )
        return written


def depth_table(results: list[dict[str, Any]]) -> str:
    """Markdown, one table per task: test accuracy by depth per setting, and the baselines of the same data."""
    return Report(results).depth_tables()
