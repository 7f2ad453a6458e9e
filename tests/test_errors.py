"""Ctrl-C held through the main thread's waits on its worker threads (reservoir.errors.interrupt_after).

Each check sends SIGINT to a fresh interpreter of its own: the test runner's process (a pytest-xdist worker)
is not one to interrupt."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = """
import signal, threading
from reservoir.errors import interrupt_after

def ctrl_c():
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # to this thread, not any thread
    for _ in range(1000):  # Python's handler runs between bytecodes: by now
        pass

def held_then_raised(levels=1):
    # a Ctrl-C inside `levels` nested blocks: the code after it ran, then KeyboardInterrupt came once
    went_on = raised = False
    try:
        with interrupt_after():
            if levels > 1:
                with interrupt_after():
                    ctrl_c()
            else:
                ctrl_c()
            went_on = True
    except KeyboardInterrupt:
        raised = True
    assert went_on and raised
"""


def check(body: str) -> None:
    """Run ``body`` after :data:`PRELUDE` in a fresh interpreter; it prints OK when every check held."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint('OK')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout + done.stderr


def test_a_ctrl_c_inside_the_block_is_raised_when_the_block_ends():
    check("""
        held_then_raised()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    """)


def test_without_a_ctrl_c_the_block_ends_normally_and_python_handler_is_back():
    check("""
        with interrupt_after():
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    """)


def test_an_error_in_the_block_is_raised_as_it_is_even_after_a_ctrl_c():
    check("""
        try:
            with interrupt_after():
                ctrl_c()
                1 / 0
        except ZeroDivisionError:
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    """)


def test_another_handler_is_left_alone_and_nested_blocks_raise_once():
    check("""
        seen = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
        with interrupt_after():
            ctrl_c()
        assert seen == [signal.SIGINT]
        signal.signal(signal.SIGINT, previous)
        held_then_raised(levels=2)
    """)
