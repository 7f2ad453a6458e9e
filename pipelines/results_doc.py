"""Write docs/results.md from the tables the pipelines rendered (``make -C pipelines docs``).

    python results_doc.py --root out/5000 --tables 2 10 12 --out ../docs/results.md

Each table rendered under ``--root`` is first kept as a record beside the document,
``results/tableN/``: its markdown, its CSV, its plots and ``tableN.json`` (the command that made it
and its wall time on the machines it ran on). The document is then assembled from the records
alone, so a table rendered in an earlier session, on another machine, stays in the document until
it is rendered again; a record is replaced whole, never merged with an older one. Records carried
over from the document that predates them have no CSV: they keep their findings as computed then
(``tableN.findings.md``).

It opens with the findings computed from the records' CSVs (``findings.py``: the pretrained
stand-in against its random twin, with spreads, the paper's pair and the strongest baseline).
For each table: its caption, the command that made it, the notes on what the numbers say
(``notes/tableN.md``, written by hand against these numbers, if present), the rendered
markdown, its wall time and its plots. The differences from the paper are stated once, at the
top (``notes/differences.md``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import cell_queue

HERE = Path(__file__).parent


#: tables made with their own training settings (end_to_end.mk's *_6 and CRITIQUE_*): the command that makes each
OWN_SETTINGS = {6: "make -C pipelines table6", 101: "make -C pipelines critique DATA_DIR=DATA"}


def by_table(items: list[str]) -> dict[int, str]:
    """``N=TEXT`` options as {N: TEXT}."""
    return {int(n): text for n, text in (item.split("=", 1) for item in items)}


def _trained(marker: Path) -> tuple[float, list[str]] | None:
    """A training marker's run time and machines, from the result its last line names (None: not one)."""
    try:
        result = json.loads(Path(marker.read_text().splitlines()[-1]).read_text())
    except (OSError, IndexError, ValueError):
        return None
    if result.get("mode") != "end-to-end" or result.get("seconds") is None:
        return None
    return float(result["seconds"]), list(result.get("machines") or [])


def walltime(runs: Path) -> str:
    """The table's wall time on this machine, from ``tableN.runs`` (the Makefile's: marker, seconds, machine;
    a training marker has no seconds there: its result holds the run's time and machines)."""
    if not runs.exists():
        return ""
    lines = [ln.split("\t") for ln in runs.read_text().splitlines() if ln.strip()]
    timed, trained, untimed = [], [], 0
    for ln in lines:
        if len(ln) > 2 and ln[1]:
            timed.append((float(ln[1]), [ln[2].strip()]))
        elif (run := _trained(Path(ln[0]))) is not None:
            trained.append(run)
        else:
            untimed += 1
    if not timed and not trained:
        return f"Wall time: not measured (its {len(lines)} extractions and fits predate timing)."
    total = sum(s for s, _ in timed + trained)
    machines = "; ".join(dict.fromkeys(m for _, ms in timed + trained for m in ms)) or "an unrecorded machine"
    what = " and ".join(
        part
        for part in (
            f"{len(timed)} extractions and fits" if timed else "",
            f"{len(trained)} training runs (every seed)" if trained else "",
        )
        if part
    )
    return f"Wall time: {total / 60:.0f} min for {what}, one after another, on {machines}" + (
        f" ({untimed} more predate timing)." if untimed else "."
    )


def publish(n: int, root: Path, record: Path, command: str) -> None:
    """Keep table ``n`` as rendered under ``root`` in ``record``: its markdown, CSV and plots, and
    ``tableN.json`` with the command that made it and its wall time. The record is written beside the
    old one and then put in its place, so it is never a mix of two renderings."""
    fresh = record.with_name(record.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    for suffix in (".md", ".csv"):
        if (root / f"table{n}{suffix}").exists():
            shutil.copy2(root / f"table{n}{suffix}", fresh / f"table{n}{suffix}")
    for png in sorted((root / "plots" / f"table{n}").glob("*.png")):
        shutil.copy2(png, fresh / png.name)
    earlier = (
        json.loads((record / f"table{n}.json").read_text()) if (record / f"table{n}.json").exists() else {}
    )
    # a table rendered from its ledger alone (`make render`) measured no time here: it keeps the record's
    about = {
        "command": command,
        "wall_time": walltime(root / f"table{n}.runs") or earlier.get("wall_time", ""),
    }
    (fresh / f"table{n}.json").write_text(json.dumps(about, indent=1) + "\n")
    old = record.with_name(record.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if record.exists():
        record.rename(old)
    fresh.rename(record)
    shutil.rmtree(old, ignore_errors=True)


def kept_findings(records: dict[int, Path]) -> list[str]:
    """The findings of records that carry no CSV: those carried over from the document that predates records
    keep the paragraphs computed when they were rendered (``tableN.findings.md``), until they are made again."""
    kept = []
    for n, record in records.items():
        if not (record / f"table{n}.csv").exists() and (record / f"table{n}.findings.md").exists():
            kept += [
                p.strip() for p in (record / f"table{n}.findings.md").read_text().split("\n\n") if p.strip()
            ]
    return kept


def section(n: int, record: Path, caption: str, folder: str) -> list[str]:
    """Table ``n``'s part of the document, from its record (``folder``: the record's path from the document)."""
    about = json.loads((record / f"table{n}.json").read_text())
    parts = [f"## Table {n}: {caption}", "", "```", about["command"], "```", ""]
    notes = HERE / "notes" / f"table{n}.md"
    if notes.exists():
        parts += [notes.read_text().strip(), ""]
    parts += [(record / f"table{n}.md").read_text().strip(), ""]
    if about.get("wall_time"):
        parts += [about["wall_time"], ""]
    for png in sorted(record.glob("*.png")):
        parts += [f"![{png.stem}]({folder}/{png.name})", ""]
    return parts + queued(n, record.parent / "runs")


#: how the queue's end-to-end cells (``cell_queue.cells``) stand beside the paper's rows, by table (the stand-ins of
#: its FPT and Random; the trained groups of the ablations; the critique's DistilGPT2, whose blocks the cells run)
STAND_INS = ("--as", "smollm2-135m=FPT", "--as", "smollm2-135m-random=Random", "--as", "gpt2-random=Random")
ABLATION_ROWS = {",".join(groups): row for groups, row in cell_queue.ABLATION.items()}
CRITIQUE_ROWS = {
    f"{backbone}:{','.join(groups)}": f"{frozen} {weights}, DistilGPT2"
    for backbone, weights in (("smollm2-135m", "Pretrained"), ("smollm2-135m-random", "Random"))
    for groups, frozen in ((cell_queue.FPT, "Frozen"), (cell_queue.EVERY, "Unfrozen"))
}


def stand_ins(rows: dict[str, str]) -> tuple[str, ...]:
    return tuple(word for ours, row in rows.items() for word in ("--as", f"{ours}={row}"))


QUEUED_AS = {
    2: STAND_INS,
    6: STAND_INS,
    18: stand_ins({f"smollm2-135m:{g}": row for g, row in ABLATION_ROWS.items()}),
    20: stand_ins({f"smollm2-135m-random:{g}": row for g, row in ABLATION_ROWS.items()}),
    101: stand_ins(CRITIQUE_ROWS),
}
ABLATION_HOW = "the output layer trained alone or with one other group, Adam at 1e-3, three seeds, stopped at 99% validation"
#: what the queue's cells of a table train, in words (``cell_queue.cells``)
QUEUED_HOW = {
    2: "input layer, positions, layer norms and output trained, Adam at 1e-3 (remote homology 1e-4), three seeds, "
    "stopped at 99% validation on the bit tasks",
    6: "input layer, positions, layer norms and output trained, Adam at 1e-3, three seeds, stopped at 99% validation",
    18: ABLATION_HOW,
    20: ABLATION_HOW,
    101: f"the first {cell_queue.CRITIQUE_BLOCKS} blocks, frozen (input layer, positions, layer norms and output "
    f"trained) or every group trained, Adam at each of {', '.join(f'{lr:g}' for lr in cell_queue.SWEEP)} (chosen on "
    "validation), three seeds",
}


def queued(n: int, runs: Path) -> list[str]:
    """The end-to-end cells the queue (``cell_queue.py``) kept for table ``n`` where the table is not rendered from
    its ledger (``runs/tableN.json`` absent: its record above is of an earlier run), as ``reservoir report`` shows
    them beside the paper's numbers."""
    if (runs / f"table{n}.json").exists() or not any((runs / f"table{n}").rglob("*.json")):
        return []
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "reservoir",
            "report",
            str(runs / f"table{n}"),
            "--paper",
            str(n),
            *QUEUED_AS[n],
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    table = "\n".join(line for line in made.stdout.splitlines() if line.startswith("|"))
    machines = sorted(
        {
            m
            for f in (runs / f"table{n}").rglob("*.json")
            for m in json.loads(f.read_text()).get("machines", [])
        }
    )
    return [
        f"End-to-end cells of table {n} trained since, by the paper's protocol (`make -C pipelines next`: "
        f"{QUEUED_HOW[n]}), kept in `results/runs/table{n}/`:",
        "",
        table,
        "",
        f"Ran on: {'; '.join(machines)}.",
        "",
    ]


def series_section(record: Path) -> list[str]:
    """The home tasks' part of the document (``series.py``'s and ``memory.py``'s record), with the notes written
    against it (``notes/series.md``) and the memory capacity figure."""
    about = json.loads((record / "series.json").read_text())
    parts = [
        "## Reservoir computing's home tasks: Mackey-Glass, NARMA-10 and memory capacity",
        "",
        "```",
        about["command"],
        "```",
        "",
    ]
    notes = HERE / "notes" / "series.md"
    if notes.exists():
        parts += [notes.read_text().strip(), ""]
    parts += [(record / "series.md").read_text().strip(), "", about["wall_time"], ""]
    if (record / "memory.md").exists():
        parts += ["### Memory capacity", "", (record / "memory.md").read_text().strip(), ""]
    for png in sorted(record.glob("*.png")):
        parts += [f"![{png.stem}](results/{record.name}/{png.name})", ""]
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True, help="out/LIMIT: where the tables were rendered")
    parser.add_argument("--tables", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--pretrained",
        default=None,
        help="the pretrained stand-in: findings set it against its -random twin (findings.py)",
    )
    parser.add_argument(
        "--command",
        default="make -C pipelines table{n} LIMIT={limit} DATA_DIR=DATA",
        help="how each table was made ({n}, {limit})",
    )
    parser.add_argument(
        "--elsewhere",
        action="append",
        default=[],
        metavar="N=DIR",
        help="table N was rendered in DIR (a table made at its own size: the critique's out/500)",
    )
    parser.add_argument(
        "--command-of",
        action="append",
        default=[],
        metavar="N=COMMAND",
        help="the command that made table N, where it is not --command's",
    )
    args = parser.parse_args()
    tables = [int(n) for n in args.tables]
    roots = {n: Path(d) for n, d in by_table(args.elsewhere).items()}
    commands = {**OWN_SETTINGS, **by_table(args.command_of)}

    from reservoir.report.paper import TABLES

    records = {n: args.out.parent / "results" / f"table{n}" for n in tables}
    for n in tables:
        root = roots.get(n, args.root)
        command = commands.get(n, args.command).format(n=n, limit=root.name)
        if (root / f"table{n}.md").exists():
            publish(n, root, records[n], command)
        elif not (records[n] / f"table{n}.json").exists():
            raise SystemExit(
                f"{root / f'table{n}.md'} is missing and table {n} has no record in "
                f"{records[n]}: run `{command}` first"
            )
    parts = [
        "# Measured accuracies",
        "",
        "Generated by `make -C pipelines docs` from the tables the pipelines rendered; every number below "
        "comes from a result file those commands wrote, and each table names the command that made it. Each "
        "table is kept, with its CSV and plots, under `results/tableN/`, so a table made in an earlier run "
        "stays until it is made again; the result files of every run behind a table, on whichever machine it "
        "ran, are kept under `results/runs/tableN/`, and the table is rendered from all of them. DATA is a folder in the layout `reservoir data where` prints. Earlier "
        "measurements made with single commands (full-size MNIST, remote homology, end-to-end runs) are in "
        "[results-by-hand.md](results-by-hand.md).",
        "",
    ]
    if args.pretrained:
        from findings import DECIDES, findings

        found = kept_findings(records) + findings(records, args.pretrained)
        if found:
            parts += [
                "## Findings",
                "",
                f"Computed from the tables below: a difference is decided where it exceeds {DECIDES:g} times the "
                "combined spread of its two sides (a side's spread: the standard deviation over its seeds, at "
                "least the binomial standard error of its test accuracy, Agresti-Coull). The paper's numbers in "
                "table 2 come from its FPT, which trains input, positions, layer norms and output: a direction "
                "is compared, not a level; tables 10, 12, 18 and 20 hold its output-only numbers.",
                "",
                *[p + "\n" for p in found],
            ]
    differences = HERE / "notes" / "differences.md"
    if differences.exists():
        parts += [differences.read_text().strip(), ""]
    for n in tables:
        caption = TABLES[n].caption if n in TABLES else ""
        parts += section(n, records[n], caption, f"results/table{n}")
    series = args.out.parent / "results" / "series"
    if (series / "series.md").exists():
        parts += series_section(series)
    args.out.write_text("\n".join(parts).rstrip() + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
