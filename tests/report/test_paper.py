"""The paper's numbers: every table's rows, columns and cells against a second transcription of the
paper's text (arXiv v2 and the critique), typed here in the paper's own layout."""

from __future__ import annotations

import re

import pytest

from reservoir.report.paper import (
    CRITIQUE,
    CRITIQUE_SOURCE,
    DEPTHS,
    PAPER_SOURCE,
    TABLES,
    TASKS,
    PaperTable,
    paper_number,
)
from reservoir.tasks import TASKS as TASK_REGISTRY

T7 = TASKS
LRA4 = ("listops", "mnist", "cifar10", "cifar10_lra")
SUCCESSIVE = ("output only", "+ layernorm", "+ input", "+ positions")
SINGLE = ("output only", "output + input", "output + positions", "output + layernorm")

#: each table as the paper prints it: (its column headings, by our labels; whether the paper prints tasks or
#: depths down the side, i.e. the module stores it transposed; its lines "label | one value per heading",
#: "-" for a cell the paper leaves empty). Labels of task lines are our task names.
PRINTED: dict[int, tuple[tuple[str, ...], bool, str]] = {
    1: (
        T7,
        False,
        """
        FPT | 100 100 38.4 98.0 72.1 38.6 12.7
        Full | 100 100 38 99.1 70.3 42 9
        LSTM | 60.9 50.1 17.1 99.5 73.6 11.7 12""",
    ),
    2: (
        T7,
        False,
        """
        FPT | 100 100 38.4 98.0 68.2 38.6 12.7
        Random | 75.8 100 34.3 91.7 61.7 36.1 9.3
        Bit | 100 100 35.4 97.8 62.6 36.7 7.8
        ViT | 100 100 37.4 97.8 72.5 43.0 7.5""",
    ),
    3: (
        T7,
        False,
        """
        Trans. | 75.8 100 34.3 91.7 61.7 36.1 9.3
        LSTM | 50.9 50.0 16.8 70.9 34.4 10.4 6.6
        LSTM* | 75.0 50.0 16.7 92.5 43.5 10.6 8.6""",
    ),
    4: (
        LRA4,
        False,
        """
        12 | 16.2 11.7 10.8 10.4
        3 | 16.8 70.9 34.4 10.4""",
    ),
    5: (
        LRA4,
        False,
        """
        12-Layer LSTM | 16.2 11.7 10.8 10.4
        + Residual Connections | 16.8 70.9 34.4 10.4
        + Positional Embeddings | 16.7 92.5 43.5 10.6
        Random Transformer | 34.3 91.7 61.7 36.1""",
    ),
    6: (
        T7,
        False,
        """
        FPT | 1e4 5e2 2e3 5e3 4e5 3e5 1e5
        Random | 4e4 2e4 6e3 2e4 4e5 6e5 1e5
        Speedup | 4 40 3 4 1 2 1""",
    ),
    7: (
        ("layers", "test", "train"),
        False,
        """
        FPT (GPT-2) | 12 38.6 38.5
        Vanilla Transformer | 3 42 70
        Linformer | 3 39 97""",
    ),
    8: (
        ("layers", "total params", "trained params", "FPT", "Random"),
        False,
        """
        Small (Base) | 12 117e6 106e3 68.2 61.7
        Medium | 24 345e6 190e3 69.8 64.0
        Large | 36 774e6 300e3 72.1 65.7""",
    ),
    9: (
        T7,
        False,
        """
        Pretrained | 100 100 38.4 98.0 68.2 38.6 12.7
        Statistics Only | 100 100 37.4 97.2 56.5 33.1 11.0
        Default | 75.8 100 34.3 91.7 61.7 36.1 9.3""",
    ),
    10: (
        ("Speedup low", "Speedup high", "Output Only", "FPT", "Full Transformer"),
        True,
        """
        listops | 500 2000 32.8 38.4 38
        cifar10_lra | 500 2000 24.7 38.6 42""",
    ),
    11: (
        ("Pretrained", "Random"),
        True,
        """
        1 | 17 17
        2 | 36 16
        6 | 38 35""",
    ),
    12: (
        ("Pretrained", "Random"),
        True,
        """
        1 | 12 -
        3 | 18 -
        6 | 33 -
        12 | 33 17
        24 | - 17""",
    ),
    13: (
        T7,
        False,
        """
        FPT | 100 100 38.4 98.0 68.2 38.6 12.7
        + Feedforward | 100 100 36.0 98.3 76.6 38.2 13.1
        + Attention | 100 100 36.8 89.0 47.7 23.0 10.9
        + Both | 100 100 35.8 93.1 32.9 21.0 10.5""",
    ),
    14: (
        ("Base (FPT)", "+ Finetuning All FF Layers", "+ Finetuning Last Attn Layer"),
        True,
        """
        cifar10 | 68.2 76.6 80.0""",
    ),
    15: (
        SUCCESSIVE,
        True,
        """
        bit_memory | 76 94 100 100
        bit_xor | 56 98 98 100
        listops | 15 36 36 38
        mnist | 23 96 98 98
        cifar10 | 25 54 60 68
        cifar10_lra | 17 39 39 39
        remote_homology | 2 9 10 13""",
    ),
    16: (
        ("frozen layer norm", "finetuned layer norm"),
        False,
        """
        Pretrained | 61.5 68.2
        Random | 55.0 61.7""",
    ),
    17: (
        ("GPT-2 (FPT Default)", "BERT", "T5", "Longformer"),
        True,
        """
        listops | 38.4 38.3 15.4 17.0
        cifar10 | 68.2 68.8 64.7 66.8""",
    ),
    18: (
        SINGLE,
        True,
        """
        bit_memory | 76 98 93 94
        bit_xor | 56 72 84 98
        listops | 15 17 35 36
        mnist | 23 85 93 96
        cifar10 | 25 53 38 54
        cifar10_lra | 17 22 30 39
        remote_homology | 2 8 8 9""",
    ),
    19: (
        SUCCESSIVE,
        True,
        """
        bit_memory | 76 94 100 100
        bit_xor | 56 98 98 100
        listops | 15 36 36 38
        mnist | 23 96 98 98
        cifar10 | 25 54 60 68
        cifar10_lra | 17 39 39 39
        remote_homology | 2 9 10 13""",
    ),
    20: (
        SINGLE,
        True,
        """
        bit_memory | 75 75 75 75
        bit_xor | 50 51 59 100
        listops | 17 17 18 35
        mnist | 25 28 34 83
        cifar10 | 20 24 21 46
        cifar10_lra | 11 16 12 34
        remote_homology | 2 2 6 9""",
    ),
    21: (
        SUCCESSIVE,
        True,
        """
        bit_memory | 75 75 75 76
        bit_xor | 50 100 100 100
        listops | 17 35 36 37
        mnist | 25 83 92 92
        cifar10 | 20 46 56 62
        cifar10_lra | 11 34 36 36
        remote_homology | 2 9 9 9""",
    ),
    # the critique: "mean ± error" cells, DistilGPT2 and GPT2 lines per variant
    101: (
        ("mnist", "cifar10", "cifar10_lra"),
        False,
        """
        Frozen Random, DistilGPT2 | 98.0±0.1 60.1±0.1 45.0±0.1
        Frozen Random, GPT2 | 98.0±0.0 61.8±0.2 44.2±0.3
        Frozen Pretrained, DistilGPT2 | 98.5±0.1 65.2±0.5 51.1±0.4
        Frozen Pretrained, GPT2 | 98.5±0.1 66.3±0.0 54.7±1.4
        Unfrozen Random, DistilGPT2 | 98.6±0.1 77.5±0.1 59.7±0.2
        Unfrozen Random, GPT2 | 98.7±0.0 77.8±0.2 62.0±0.7
        Unfrozen Pretrained, DistilGPT2 | 98.9±0.0 76.8±0.1 65.5±0.5
        Unfrozen Pretrained, GPT2 | 99.0±0.0 77.7±0.1 67.8±0.3""",
    ),
    102: (
        LRA4,
        False,
        """
        Unfrozen Random | 1.0e5 1.1e5 7.0e4 1.8e5
        Unfrozen Pretrained | 1.9e5 4.6e4 4.3e4 5.3e4
        Frozen Pretrained | 1.9e5 2.4e5 3.8e5 2.4e5""",
    ),
}


def parse(
    number: int,
) -> tuple[list[str], list[str], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Row labels, columns, cells and ± errors of ``PRINTED[number]`` in the module's layout."""
    headings, transposed, text = PRINTED[number]
    lines = [line.strip() for line in text.strip().splitlines()]
    labels = [line.split(" | ")[0] for line in lines]
    rows_order, columns = (list(headings), labels) if transposed else (labels, list(headings))
    cells: dict[str, dict[str, float]] = {r: {} for r in rows_order}
    errors: dict[str, dict[str, float]] = {}
    for label, line in zip(labels, lines):
        values = line.split(" | ")[1].split()
        assert len(values) == len(headings), line
        for heading, value in zip(headings, values):
            row, column = (heading, label) if transposed else (label, heading)
            if value == "-":
                continue
            mean, _, error = value.partition("±")
            cells[row][column] = float(mean)
            if error:
                errors.setdefault(row, {})[column] = float(error)
    return rows_order, columns, cells, errors


def test_every_result_table_is_recorded():
    assert set(TABLES) == set(range(1, 22)) | {101, 102}
    assert set(PRINTED) == set(TABLES)
    for number, table in TABLES.items():
        assert table.number == number and table.rows, number
        assert all(cells for cells in table.rows.values()), number
    assert set(CRITIQUE) == {101, 102}
    assert {t.source for n, t in TABLES.items() if n < 100} == {PAPER_SOURCE}
    assert all(t.source == CRITIQUE_SOURCE for t in CRITIQUE.values())


@pytest.mark.parametrize("number", sorted(PRINTED))
def test_table_matches_the_papers_text(number):
    """Row labels and columns (in order) and every cell, including the ones the paper leaves empty."""
    table = TABLES[number]
    rows, columns, cells, errors = parse(number)
    assert list(table.rows) == rows
    assert list(table.columns) == columns
    assert table.rows == cells
    assert table.plus_minus == errors
    assert table.transposed == PRINTED[number][1]


@pytest.mark.parametrize("number", sorted(TABLES))
def test_structure(number):
    table = TABLES[number]
    assert isinstance(table, PaperTable) and table.caption and table.note
    assert table.unit in ("%", "steps")
    for label, cells in table.rows.items():
        assert set(cells) <= set(table.columns), (number, label)
        assert all(isinstance(v, (int, float)) for v in cells.values()), (number, label)
    labels = set(table.rows) | set(table.columns)
    assert set(table.units) <= labels, number
    assert all(row in table.rows and column in table.rows[row] for row, column in table.marks), number
    assert all(set(cells) <= set(table.rows.get(row, {})) for row, cells in table.plus_minus.items()), number


def test_columns_are_tasks_depths_or_the_papers_headings():
    known = set(TASK_REGISTRY.names())
    assert set(TASKS) <= known
    other = {
        7: {"layers", "test", "train"},
        8: {"layers", "total params", "trained params", "FPT", "Random"},
        16: {"frozen layer norm", "finetuned layer norm"},
    }
    for number, table in TABLES.items():
        if number in other:
            assert set(table.columns) == other[number] and table.task in known, number
        elif number in (11, 12):
            assert set(table.columns) <= set(DEPTHS) and table.task == "listops"
        else:
            assert set(table.columns) <= set(TASKS), number
    assert (TABLES[7].task, TABLES[8].task, TABLES[16].task) == ("cifar10_lra", "cifar10", "cifar10")


def test_units():
    assert TABLES[6].unit == "steps" and TABLES[102].unit == "steps"
    assert TABLES[6].unit_of("FPT", "bit_xor") == "steps" and "speedup" in TABLES[6].unit_of(
        "Speedup", "bit_xor"
    )
    assert TABLES[8].unit_of("Medium", "total params") == "parameters"
    assert TABLES[8].unit_of("Medium", "trained params") == "parameters"
    assert TABLES[8].unit_of("Medium", "layers") == TABLES[7].unit_of("Linformer", "layers") == "blocks"
    assert TABLES[8].unit_of("Medium", "FPT") == "%"
    assert "speedup" in TABLES[10].unit_of("Speedup high", "listops")
    assert TABLES[10].unit_of("Output Only", "listops") == "%"
    assert all(t.unit == "%" and not t.units for n, t in TABLES.items() if n not in (6, 7, 8, 10, 102))


def test_spot_cells():
    """A few cells from different rows and columns, as printed (independent of ``PRINTED``)."""
    assert paper_number(1, "LSTM", "mnist") == 99.5
    assert paper_number(2, "ViT", "cifar10_lra") == 43.0
    assert paper_number(3, "LSTM*", "bit_memory") == 75.0
    assert paper_number(5, "+ Positional Embeddings", "mnist") == 92.5
    assert paper_number(6, "Random", "cifar10_lra") == 6e5 and paper_number(6, "Speedup", "bit_xor") == 40
    assert paper_number(7, "Linformer", "train") == 97
    assert paper_number(8, "Medium", "trained params") == 190e3
    assert paper_number(9, "Statistics Only", "cifar10") == 56.5
    assert paper_number(10, "Output Only", "cifar10_lra") == 24.7
    assert (
        paper_number(10, "Speedup low", "listops") == 500
        and paper_number(10, "Speedup high", "listops") == 2000
    )
    assert paper_number(11, "Random", "2") == 16
    assert paper_number(12, "Pretrained", "1") == 12 and paper_number(12, "Random", "24") == 17
    assert paper_number(13, "+ Attention", "cifar10_lra") == 23.0
    assert paper_number(14, "+ Finetuning Last Attn Layer", "cifar10") == 80.0
    assert paper_number(16, "Random", "frozen layer norm") == 55.0
    assert paper_number(17, "T5", "listops") == 15.4
    assert paper_number(18, "output + positions", "cifar10") == 38
    assert paper_number(20, "output + positions", "bit_xor") == 59
    assert paper_number(21, "+ positions", "bit_memory") == 76
    assert paper_number(101, "Frozen Pretrained, GPT2", "cifar10") == 66.3
    assert TABLES[101].plus_minus["Frozen Pretrained, GPT2"]["cifar10_lra"] == 1.4
    assert paper_number(102, "Frozen Pretrained", "cifar10") == 3.8e5


def test_known_values():
    fpt = dict(
        bit_memory=100,
        bit_xor=100,
        listops=38.4,
        mnist=98.0,
        cifar10=72.1,
        cifar10_lra=38.6,
        remote_homology=12.7,
    )
    random = dict(
        bit_memory=75.8,
        bit_xor=100,
        listops=34.3,
        mnist=91.7,
        cifar10=61.7,
        cifar10_lra=36.1,
        remote_homology=9.3,
    )
    assert {c: paper_number(1, "FPT", c) for c in fpt} == fpt
    assert {c: paper_number(2, "Random", c) for c in random} == random


def test_the_papers_repeated_rows_agree():
    """Rows the paper prints in more than one table (its appendix names the shared runs)."""
    rows = lambda n: TABLES[n].rows  # noqa: E731
    assert rows(9)["Pretrained"] == rows(13)["FPT"] == rows(2)["FPT"]
    assert rows(9)["Default"] == rows(3)["Trans."] == rows(2)["Random"]
    assert rows(5)["12-Layer LSTM"] == rows(4)["12"] and rows(4)["3"] == {c: rows(3)["LSTM"][c] for c in LRA4}
    assert rows(5)["+ Positional Embeddings"] == {c: rows(3)["LSTM*"][c] for c in LRA4}
    assert rows(5)["Random Transformer"] == {c: rows(2)["Random"][c] for c in LRA4}
    assert rows(10)["FPT"] == {c: rows(1)["FPT"][c] for c in ("listops", "cifar10_lra")}
    assert rows(10)["Full Transformer"] == {c: rows(1)["Full"][c] for c in ("listops", "cifar10_lra")}
    assert rows(18)["output only"] == rows(15)["output only"]
    assert rows(18)["output + layernorm"] == rows(15)["+ layernorm"]
    assert rows(20)["output only"] == rows(21)["output only"]
    assert rows(20)["output + layernorm"] == rows(21)["+ layernorm"]
    assert paper_number(7, "Vanilla Transformer", "test") == paper_number(1, "Full", "cifar10_lra")
    assert (paper_number(8, "Small (Base)", "FPT"), paper_number(8, "Small (Base)", "Random")) == (68.2, 61.7)
    assert paper_number(8, "Large", "FPT") == paper_number(1, "FPT", "cifar10")
    assert rows(14)["+ Finetuning All FF Layers"]["cifar10"] == rows(13)["+ Feedforward"]["cifar10"]
    assert rows(17)["GPT-2 (FPT Default)"] == {c: rows(2)["FPT"][c] for c in ("listops", "cifar10")}
    for task in TASKS:  # the speedup is Random's steps over FPT's
        assert rows(6)["Speedup"][task] == rows(6)["Random"][task] / rows(6)["FPT"][task]
        # + positions is the FPT's setting: table 2's FPT row, rounded to whole percent
        assert rows(19)["+ positions"][task] == round(rows(2)["FPT"][task] + 1e-9)


def test_oddities_are_kept_and_named():
    rows = lambda n: TABLES[n].rows  # noqa: E731
    # table 5's 12-layer LSTM with residual connections repeats table 4's 3-layer LSTM
    assert rows(5)["+ Residual Connections"] == rows(4)["3"]
    # tables 15 and 19 are the same table printed twice
    assert rows(15) == rows(19)
    # table 21's + positions agrees with table 2's Random after rounding, except ListOps
    assert paper_number(21, "+ positions", "listops") == 37 and paper_number(2, "Random", "listops") == 34.3
    for task in set(TASKS) - {"listops"}:
        assert rows(21)["+ positions"][task] == round(rows(2)["Random"][task] + 1e-9), task
    # table 7: the FPT's train accuracy below its test accuracy
    assert paper_number(7, "FPT (GPT-2)", "train") < paper_number(7, "FPT (GPT-2)", "test")
    # table 10's output-only numbers against the output only column of tables 15/18/19
    assert (paper_number(10, "Output Only", "listops"), paper_number(15, "output only", "listops")) == (
        32.8,
        15,
    )
    # table 16's finetuned column repeats table 2's full FPT and Random
    assert rows(16)["Pretrained"]["finetuned layer norm"] == rows(2)["FPT"]["cifar10"]
    for number in (1, 3, 5, 7, 8, 10, 15, 16, 19, 21):
        assert re.search(r"Oddit(y|ies) kept", TABLES[number].note), number
    # table 13's three cells marked † (training diverged)
    assert set(TABLES[13].marks) == {
        ("+ Attention", "mnist"),
        ("+ Attention", "cifar10"),
        ("+ Both", "mnist"),
    }
    assert all("diverged" in why for why in TABLES[13].marks.values())


def test_absent_is_none():
    assert paper_number(1, "FPT", "digits") is None
    assert paper_number(1, "no such row", "listops") is None
    assert paper_number(99, "FPT", "listops") is None
    assert paper_number(9, "Random", "listops") is None  # the paper calls it "Default"
    assert [paper_number(12, "Random", d) for d in ("1", "3", "6")] == [None] * 3  # printed "-"
    assert paper_number(12, "Pretrained", "24") is None
    assert paper_number(11, "Pretrained", "12") is None  # no 12-block row in table 11
    assert paper_number(101, "Frozen Random, GPT2", "listops") is None  # the critique plots ListOps only
