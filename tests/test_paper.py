"""The paper's numbers: table structure and the values checked against the paper's text."""

from __future__ import annotations

import pytest

from reservoir.report.paper import TABLES, TASKS, paper_number
from reservoir.tasks import list_tasks


@pytest.mark.parametrize("number", sorted(TABLES))
def test_rows_use_only_their_columns(number):
    table = TABLES[number]
    assert table.number == number and table.caption and table.unit in ("%", "steps")
    for label, cells in table.rows.items():
        assert set(cells) <= set(table.columns), (number, label)
    if not table.rows:
        assert table.note, f"table {number} has no rows and no note saying why"


def test_task_columns_are_registered_tasks():
    known = set(list_tasks())
    for table in TABLES.values():
        tasks = [c for c in table.columns if not c.isdigit()]
        assert set(tasks) <= known, table.number
    assert set(TASKS) <= known


def test_known_values():
    fpt = dict(bit_memory=100, bit_xor=100, listops=38.4, mnist=98.0, cifar10=72.1, cifar10_lra=38.6,
               remote_homology=12.7)
    random = dict(bit_memory=75.8, bit_xor=100, listops=34.3, mnist=91.7, cifar10=61.7, cifar10_lra=36.1,
                  remote_homology=9.3)
    assert {c: paper_number(1, "FPT", c) for c in fpt} == fpt
    assert {c: paper_number(2, "Random", c) for c in random} == random


def test_absent_is_none():
    assert paper_number(1, "FPT", "digits") is None
    assert paper_number(1, "no such row", "listops") is None
    assert paper_number(99, "FPT", "listops") is None
