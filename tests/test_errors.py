"""Ctrl-C held through the main thread's waits on its worker threads (reservoir.errors.interrupt_after)."""

from __future__ import annotations

import os
import signal

import pytest

from reservoir.errors import interrupt_after


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own SIGINT handler in each test, whatever the runner (a pytest-xdist worker) installed."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_inside_the_block_is_raised_when_the_block_ends():
    went_on = False
    with pytest.raises(KeyboardInterrupt), interrupt_after():
        ctrl_c()
        sum(range(1000))  # the handler has run by now
        went_on = True
    assert went_on
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_the_block_ends_normally_and_python_handler_is_back():
    with interrupt_after():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_error_in_the_block_is_raised_as_it_is_even_after_a_ctrl_c():
    with pytest.raises(ZeroDivisionError), interrupt_after():
        ctrl_c()
        sum(range(1000))
        1 / 0  # noqa: B018
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_another_handler_is_left_alone_and_nested_blocks_raise_once():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with interrupt_after():
            ctrl_c()
            sum(range(1000))
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
    with pytest.raises(KeyboardInterrupt), interrupt_after():
        with interrupt_after():
            ctrl_c()
            sum(range(1000))
        went_on = True
    assert went_on
