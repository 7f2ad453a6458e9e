"""The findings that open docs/results.md, computed from the tables' CSVs (``reservoir report --csv``).

For every table and task: the pretrained stand-in against its random twin (output-only, the paper's
input scale, the depth chosen on validation), each as mean over seeds with its spread, and the
strongest baseline; the difference is called decided only where it exceeds twice the combined
spread. A side's spread is the larger of its seeds' standard deviation and the binomial
standard error of one accuracy on its test rows, so a single seed still carries the sampling
error of its test set. The standard error is Agresti and Coull's (two successes and two failures
added), which stays above zero at 0% and 100%, where the plain one would claim no error at all.
The paper's pair of numbers is set beside ours when the table holds it.

A table of steps to a target (table 6, end to end) gives each side's test mean, spread and lowest
seed, whether every seed solves the task (at least 99%), and the paper's steps and accuracies.

The ablation tables (18: pretrained, 20: random) give, per task, each column (the output layer
alone, then one group trained beside it) with its spread and the paper's number, which group
helps most and whether that is decided, and, when both tables are there, the pretrained model
against its random twin column by column beside the paper's difference. The critique's table
(101) sets its four variants (frozen or every parameter trained, pretrained or random) against
each other in the critique's four comparisons, each beside the critique's difference.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

#: a difference decides when it exceeds this many combined spreads
DECIDES = 2.0


@dataclass
class Side:
    name: str
    test: float  # accuracy in [0, 1], mean over seeds
    std: float  # over seeds (0 for one seed)
    seeds: int
    n_test: int
    paper: float | None  # percent

    @property
    def spread(self) -> float:
        n = self.n_test + 4  # Agresti-Coull: 2 successes and 2 failures added
        p = (self.test * self.n_test + 2) / n
        return max(self.std, math.sqrt(p * (1 - p) / n))

    def text(self) -> str:
        seeds = f"{self.seeds} seeds" if self.seeds > 1 else "1 seed"
        return f"{100 * self.test:.1f} ± {100 * self.spread:.1f}% ({seeds})"


def _side(row: dict[str, str]) -> Side:
    n_test = int(row["n_train/n_test"].split("/")[-1]) if "/" in row.get("n_train/n_test", "") else 0
    return Side(
        row["setting"],
        float(row["test"]),
        float(row["test_std"] or 0.0),
        int(row["n_seeds"] or 1),
        n_test,
        float(row["paper"]) if row.get("paper") else None,
    )


def _chosen(rows: list[dict[str, str]]) -> dict[str, str]:
    """A backbone's row at the chosen depth: the task layout has one; the depth layout (table 12) a row per
    depth and the "chosen" one."""
    return next((r for r in rows if r.get("column") == "chosen"), rows[-1])


def pairs(rows: list[dict[str, str]], pretrained: str) -> dict[str, tuple[Side, Side, Side | None]]:
    """Per task: (pretrained, random twin, strongest baseline) rows of one table's CSV."""
    out = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [
            r
            for r in rows
            if r["task"] == task
            and r["mode"] == "output-only"
            and r["input_scale"] == "paper"
            and r.get("depth_rule", "chosen") in ("chosen", "")
        ]
        by_backbone = {
            r["backbone"]: _chosen([m for m in mine if m["backbone"] == r["backbone"]]) for r in mine
        }
        if pretrained not in by_backbone or f"{pretrained}-random" not in by_backbone:
            continue
        baselines = [r for r in rows if r["task"] == task and r["mode"] == "baseline"]
        best = max(baselines, key=lambda r: float(r["test"]), default=None)
        out[task] = (
            _side(by_backbone[pretrained]),
            _side(by_backbone[f"{pretrained}-random"]),
            _side(best) if best else None,
        )
    return out


def _decides(a: Side, b: Side) -> tuple[float, float, bool]:
    """(a - b, the combined spread, whether the difference exceeds DECIDES times it)."""
    diff, combined = a.test - b.test, math.hypot(a.spread, b.spread)
    return diff, combined, abs(diff) > DECIDES * combined


def _verdict(a: Side, b: Side, names: tuple[str, str]) -> tuple[str, float, bool]:
    """How ``a`` and ``b`` (called ``names``) compare: the sentence, a - b, and whether it is decided."""
    diff, combined, decided = _decides(a, b)
    if decided:
        return (
            (
                f"{names[0] if diff > 0 else names[1]} is ahead by {100 * abs(diff):.1f} points, more than "
                f"{DECIDES:g} times the combined spread ({100 * combined:.1f}): decided"
            ),
            diff,
            decided,
        )
    return (
        (
            f"they differ by {100 * abs(diff):.1f} points, within {DECIDES:g} times the combined spread "
            f"({100 * combined:.1f}): not decided at this size"
        ),
        diff,
        decided,
    )


def _against(paper_diff: float, diff: float, decided: bool) -> str:
    """Ours (a difference, decided or not) against the paper's difference of the same two sides."""
    if not paper_diff:
        return "ours is not level" if decided else "ours is level too, within the spread"
    if not decided:
        return "ours does not decide a direction"
    return "ours agrees in direction" if (paper_diff > 0) == (diff > 0) else "ours goes the other way"


def paragraph(table: int, task: str, pre: Side, rand: Side, base: Side | None) -> str:
    verdict, diff, decided = _verdict(pre, rand, ("the pretrained model", "the random twin"))
    text = (
        f"**Table {table}, {task}.** Output only, depth chosen on validation: pretrained {pre.name} "
        f"{pre.text()}, random twin {rand.text()}; {verdict}."
    )
    if pre.paper is not None and rand.paper is not None:
        paper_diff = pre.paper - rand.paper
        text += (
            f" The paper's table {table}: {pre.paper:g} against {rand.paper:g} "
            + ("(pretrained ahead)" if paper_diff > 0 else "(random ahead)" if paper_diff < 0 else "(level)")
            + "; "
            + _against(paper_diff, diff, decided)
            + "."
        )
    if base is not None:
        best = max(pre, rand, key=lambda side: side.test)
        gap, spread, beyond = _decides(base, best)
        where = (
            f"{100 * gap:.1f} points above both"
            if gap > 0
            else f"{100 * -gap:.1f} points below the better of the two"
        )
        text += (
            f" Strongest baseline: {base.name.removeprefix('baseline: ')} {100 * base.test:.1f}%, {where}"
            + (
                "."
                if beyond
                else f", within {DECIDES:g} times the combined spread ({100 * spread:.1f}): level."
            )
        )
    return text


#: a run "solves" a task when its test accuracy is at least this (the paper's 100% on the bit tasks)
SOLVED = 0.99


def _solved_text(row: dict[str, str]) -> str:
    """How the seeds of one end-to-end setting did: test mean ± std, the lowest seed, the steps to the target."""
    seeds, test = int(row["n_seeds"] or 1), float(row["test"])
    lowest = float(row["test_min"]) if row.get("test_min") else test
    steps, target = row.get("steps_to_target"), row.get("target")
    text = f"{100 * test:.1f}" + (
        f" ± {100 * float(row['test_std'] or 0):.1f}% over {seeds} seeds, lowest seed {100 * lowest:.1f}%"
        if seeds > 1
        else "% (1 seed)"
    )
    if target:
        text += (
            f", validation {100 * float(target):g}% in {float(steps):,.0f} steps (mean over seeds)"
            if steps
            else f", {100 * float(target):g}% validation not reached by every seed"
        )
    verdict = (
        "every seed solves it"
        if lowest >= SOLVED
        else f"not solved on every seed (a seed below {100 * SOLVED:g}% test)"
    )
    return f"{text}: {verdict}"


def end_to_end(table: int, rows: list[dict[str, str]], pretrained: str) -> list[str]:
    """Per task of an end-to-end table with steps to a target (table 6): how the pretrained stand-in and its
    random twin did on every seed, beside the paper's steps and its test accuracies (table 2, same runs)."""
    from reservoir.report.paper import TABLES

    out = []
    for task in dict.fromkeys(r["task"] for r in rows if r["mode"] == "end-to-end"):
        sides = {r["backbone"]: r for r in rows if r["task"] == task and r["mode"] == "end-to-end"}
        pre, rand = sides.get(pretrained), sides.get(f"{pretrained}-random")
        if pre is None or rand is None:
            continue
        text = (
            f"**Table {table}, {task}, end to end** (input, positions, layer norms and output trained; test at "
            f"the best validation step): pretrained {pretrained} {_solved_text(pre)}; random twin "
            f"{_solved_text(rand)}."
        )
        fpt, random = (TABLES[2].rows[name].get(task) for name in ("FPT", "Random"))
        if pre.get("paper") and rand.get("paper"):
            text += (
                f" The paper's table {table}: {float(pre['paper']):,.0f} steps against {float(rand['paper']):,.0f}"
                + (
                    f", reaching {fpt:g}% and {random:g}% (table 2)"
                    if fpt is not None and random is not None
                    else ""
                )
                + "."
            )
        out.append(text)
    return out


#: the ablation tables: each group trained alone beside the output layer, pretrained (18) and random (20)
ABLATIONS = {18: "", 20: "-random"}
#: their columns: the trainable groups of the end-to-end runs, as the paper names them
SINGLE = {"out": "output layer", "input,out": "+ input", "pos,out": "+ positions", "ln,out": "+ layer norms"}


def _percent(side: Side) -> str:
    paper = f" ({side.paper:g})" if side.paper is not None else ""
    return f"{100 * side.test:.1f} ± {100 * side.spread:.1f}{paper}"


def _columns(rows: list[dict[str, str]], task: str, backbone: str) -> dict[str, Side]:
    """One ablation table's columns for a task and backbone: the output-only head at the chosen and the last
    depth (``head``, ``head at the last depth``; the paper's output-only number beside the second, since the
    paper's output layer reads the last block, or beside the first where no last-depth head was fitted), then
    the end-to-end runs by SINGLE's names."""
    mine = [r for r in rows if r["task"] == task and r["backbone"] == backbone]
    out = {}
    for rule, name in (("chosen", "head"), ("last", "head at the last depth")):
        head = [
            r
            for r in mine
            if r["mode"] == "output-only" and r["input_scale"] == "paper" and r.get("depth_rule") == rule
        ]
        if head:
            out[name] = _side(head[0])
    if "head" in out and "head at the last depth" in out:
        out["head at the last depth"].paper, out["head"].paper = out["head"].paper, None
    trained = {r["trainable"]: r for r in mine if r["mode"] == "end-to-end"}
    out.update({name: _side(trained[groups]) for groups, name in SINGLE.items() if groups in trained})
    return out


def _best_group(columns: dict[str, Side]) -> str:
    """Which group beside the output layer helps most, ours against the runner-up, and the paper's best."""
    groups = sorted(
        (name for name in SINGLE.values() if name in columns and name != SINGLE["out"]),
        key=lambda name: columns[name].test,
        reverse=True,
    )
    if len(groups) < 2:
        return ""
    best, second = groups[:2]
    verdict, _, _ = _verdict(columns[best], columns[second], (best, second))
    text = f"; best group {best}, against {second}: {verdict}"
    papers = {name: columns[name].paper for name in groups if columns[name].paper is not None}
    if papers:
        top = max(papers.values())
        text += f" (the paper's best: {' and '.join(n for n, v in papers.items() if v == top)}, {top:g}%)"
    return text


def ablations(tables: dict[int, list[dict[str, str]]], pretrained: str) -> list[str]:
    """Per task of tables 18 and 20: each backbone's columns (test ± spread, the paper's number in brackets),
    its best group, and, with both tables, pretrained minus random column by column beside the paper's."""
    out = []
    tasks = dict.fromkeys(r["task"] for rows in tables.values() for r in rows if r["mode"] != "baseline")
    for task in tasks:
        sides = {n: _columns(rows, task, pretrained + ABLATIONS[n]) for n, rows in tables.items()}
        parts = []
        for n, columns in sides.items():
            if not columns:
                continue
            who = f"pretrained {pretrained}" if n == 18 else "random twin"
            listed = ", ".join(f"{name} {_percent(side)}" for name, side in columns.items())
            parts.append(f"Table {n}, {who}: {listed}{_best_group(columns)}.")
        pre, rand = sides.get(18, {}), sides.get(20, {})
        shared = [name for name in pre if name in rand]
        if shared:
            said = []
            for name in shared:
                verdict, diff, decided = _verdict(pre[name], rand[name], ("pretrained", "random"))
                text = f"{name} {100 * diff:+.1f}, " + ("decided" if decided else "within the spread")
                if pre[name].paper is not None and rand[name].paper is not None:
                    paper_diff = pre[name].paper - rand[name].paper
                    text += f" (paper {paper_diff:+g}: {_against(paper_diff, diff, decided)})"
                said.append(text)
            parts.append(f"Pretrained minus random, in points: {'; '.join(said)}.")
        if parts:
            out.append(
                f"**Tables 18 and 20, {task}** (test % ± spread, the paper's in brackets; the head is "
                f"ours, output only, at the depth chosen on validation unless named). " + " ".join(parts)
            )
    return out


#: the critique's table
CRITIQUE = 101
#: its four comparisons, (a, b, what a - b measures): a variant is (pretrained or random, unfrozen or frozen)
CRITIQUE_PAIRS = (
    (("Pretrained", "Unfrozen"), ("Pretrained", "Frozen"), "finetuning every parameter, pretrained"),
    (("Random", "Unfrozen"), ("Random", "Frozen"), "finetuning every parameter, random"),
    (("Pretrained", "Frozen"), ("Random", "Frozen"), "pretraining, frozen"),
    (("Pretrained", "Unfrozen"), ("Random", "Unfrozen"), "pretraining, unfrozen"),
    (("Random", "Unfrozen"), ("Pretrained", "Frozen"), "from scratch against the FPT"),
)


def critique(rows: list[dict[str, str]], pretrained: str) -> list[str]:
    """Per task of the critique's table: its four variants (mean ± spread over seeds at the learning rate
    chosen on validation) and the critique's comparisons between them, beside the critique's differences.
    A run is unfrozen when it trains attention and feedforward."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows if r["mode"] == "end-to-end"):
        variants, rates = {}, {}
        for r in rows:
            if (
                r["task"] != task
                or r["mode"] != "end-to-end"
                or r["backbone"] not in (pretrained, f"{pretrained}-random")
            ):
                continue
            groups = set(r["trainable"].split(","))
            variant = (
                "Random" if r["backbone"].endswith("-random") else "Pretrained",
                "Unfrozen" if {"attn", "ff"} <= groups else "Frozen",
            )
            variants[variant] = _side(r)
            if r.get("lr"):  # the rate a sweep chose on validation
                rates[variant] = float(r["lr"])
        if len(variants) < 2:
            continue
        listed = ", ".join(
            f"{frozen.lower()} {kind.lower()} {_percent(side)}"
            + (f" at lr {rates[(kind, frozen)]:g}" if (kind, frozen) in rates else "")
            for (kind, frozen), side in sorted(variants.items(), key=lambda kv: kv[0][::-1])
        )
        said = []
        for a, b, what in CRITIQUE_PAIRS:
            if a not in variants or b not in variants:
                continue
            _, diff, decided = _verdict(variants[a], variants[b], ("a", "b"))
            text = f"{what} {100 * diff:+.1f}, " + ("decided" if decided else "within the spread")
            if variants[a].paper is not None and variants[b].paper is not None:
                paper_diff = variants[a].paper - variants[b].paper
                text += f" (critique {paper_diff:+.1f}: {_against(paper_diff, diff, decided)})"
            said.append(text)
        order = []  # the critique's point: unfrozen variants do best at lower rates than frozen ones
        for kind in ("Pretrained", "Random"):
            if (kind, "Unfrozen") in rates and (kind, "Frozen") in rates:
                u, f = rates[(kind, "Unfrozen")], rates[(kind, "Frozen")]
                order.append(
                    f"{kind.lower()}, unfrozen {u:g} and frozen {f:g} "
                    f"({'unfrozen lower' if u < f else 'unfrozen higher' if u > f else 'the same'})"
                )
        out.append(
            f"**Table {CRITIQUE} (the critique's protocol), {task}** (test % ± spread at the learning rate "
            f"chosen on validation, the critique's GPT2 in brackets): {listed}. Differences in points: "
            + "; ".join(said)
            + "."
            + (f" Learning rates chosen: {'; '.join(order)}." if order else "")
        )
    return out


def findings(folders: dict[int, Path], pretrained: str) -> list[str]:
    """One paragraph per task with both sides present in some table's CSV (``folders``: table number ->
    the folder holding its ``tableN.csv``; a table without one is skipped): the tables share their
    runs, so a task is told once, from the first table that holds the paper's numbers for both sides
    (else the first that holds the task)."""
    found: dict[str, list[tuple[int, Side, Side, Side | None]]] = {}
    trained: list[tuple[int, list[dict[str, str]]]] = []  # tables with steps to a target (end to end)
    ablation: dict[int, list[dict[str, str]]] = {}  # tables 18 and 20
    critique_rows: list[dict[str, str]] | None = None  # table 101
    for n, folder in folders.items():
        path = folder / f"table{n}.csv"
        if not path.exists():
            continue
        with path.open() as f:
            rows = list(csv.DictReader(f))
        if n in ABLATIONS:
            ablation[n] = rows
            continue
        if n == CRITIQUE:
            critique_rows = rows
            continue
        if rows and "steps_to_target" in rows[0]:
            trained.append((n, rows))
        for task, sides in pairs(rows, pretrained).items():
            found.setdefault(task, []).append((n, *sides))
    out = []
    for task, options in found.items():
        n, pre, rand, base = next(
            (o for o in options if o[1].paper is not None and o[2].paper is not None), options[0]
        )
        out.append(paragraph(n, task, pre, rand, base))
    out += [text for n, rows in trained for text in end_to_end(n, rows, pretrained)]
    out += ablations(ablation, pretrained)
    return out + ([] if critique_rows is None else critique(critique_rows, pretrained))
