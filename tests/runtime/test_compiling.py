"""The compile decision follows measured costs, says why, and remembers what a compiled run cost."""

import json

from reservoir.runtime import compiling
from reservoir.runtime.compiling import decide


def test_decide_compiles_only_when_it_pays():
    record = {"compile_seconds": 10.0, "speedup": 2.0}
    # 100 s eager against 10 s compile + 50 s compiled: compile
    assert decide(100_000, 1000.0, blocks=12, shapes=1, record=record).compile
    # 15 s eager against 10 s + 7.5 s: eager
    small = decide(15_000, 1000.0, blocks=12, shapes=1, record=record)
    assert (
        not small.compile
        and "eager: eager 1,000 tokens/s" in small.reason
        and "measured last time" in small.reason
    )
    # every distinct width compiles once
    assert not decide(100_000, 1000.0, blocks=12, shapes=6, record=record).compile
    first = decide(10**6, 1000.0, blocks=12, shapes=1, record=None)
    assert first.compile and "first-time estimate" in first.reason


def test_records_round_trip_and_blend(tmp_path, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    assert compiling.read_record("k") is None
    compiling.write_record("k", 30.0, 2.0)
    compiling.write_record("k", 5.0, 1.0)
    assert compiling.read_record("k") == {"compile_seconds": 5.0, "speedup": 1.5}
    compiling.write_record("k", 4.0, None)  # a forced compile: no eager rate, the speedup stays
    assert compiling.read_record("k") == {"compile_seconds": 4.0, "speedup": 1.5}
    compiling.write_record("new", 9.0, None)
    assert compiling.read_record("new") == {"compile_seconds": 9.0, "speedup": None}
    # a record without a speedup falls back to the dtype's default (bf16 1.7)
    assert (
        "at 1.70x"
        in decide(
            10**5,
            1000.0,
            blocks=12,
            shapes=1,
            record={"compile_seconds": 9.0, "speedup": None},
            dtype="bfloat16",
        ).reason
    )
    assert json.loads((tmp_path / "compile-costs.json").read_text()).keys() == {"k", "new"}


def test_extract_says_which_path_runs_and_why(cli, home, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(home / "cache"))
    r = cli(
        "extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "300", "--dtype", "float32"
    )
    assert r.exit_code == 0, r.output
    assert "float32 (--dtype float32)" in r.output
    assert (
        "eager: eager" in r.output and "tokens/s (measured now)" in r.output
    )  # too small to repay a compile
    r = cli(
        "extract",
        "--task",
        "digits",
        "--backbone",
        str(tiny_gpt2),
        "--limit",
        "300",
        "--no-compile",
        "--seed",
        "1",
    )
    assert r.exit_code == 0 and "eager (--no-compile)" in r.output
    assert "this CPU" in r.output  # dtype auto says what the CPU does


def test_a_cheap_remembered_compile_is_taken(cli, home, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("RESERVOIR_CACHE", str(home / "cache"))
    monkeypatch.setattr(compiling, "read_record", lambda key: {"compile_seconds": 0.0, "speedup": 5.0})
    calls = []
    monkeypatch.setattr(
        "reservoir.runtime.runner.FeatureRunner.enable_compile", lambda self: calls.append(self)
    )
    r = cli(
        "extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "300", "--dtype", "float32"
    )
    assert r.exit_code == 0 and "compiled: eager" in r.output and len(calls) == 1


def test_a_compile_slower_than_eager_in_its_own_run_is_dropped(cli, home, tiny_gpt2, monkeypatch):
    """A compile taken on a remembered estimate is checked by the run's own batches: compiled batches
    slower than the eager probe send the rest of the run back to eager, said, with the same features."""
    import time

    import h5py
    import numpy as np

    from reservoir.runtime.runner import CompiledOrEager, FeatureRunner

    monkeypatch.setenv("RESERVOIR_CACHE", str(home / "cache"))
    monkeypatch.setattr(compiling, "read_record", lambda key: {"compile_seconds": 0.0, "speedup": 5.0})
    slow_calls = []

    def slow_compile(self):
        eager = self.forward.eager

        def slow(*a):
            slow_calls.append(1)
            time.sleep(0.05)
            return eager(*a)

        self.forward = CompiledOrEager(eager, False)
        self.forward.fn, self.forward.compiled = slow, True

    monkeypatch.setattr(FeatureRunner, "enable_compile", slow_compile)
    common = ("--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "300", "--dtype", "float32")
    r = cli("extract", *common, "--batch-size", "16", "--out", str(home / "a.h5"))
    assert r.exit_code == 0, r.output
    assert "compiled: eager" in r.output and "below eager's" in r.output and "eager from here on" in r.output
    assert len(slow_calls) == 4  # the compiling call and three more, then eager
    r = cli("extract", *common, "--no-compile", "--out", str(home / "b.h5"))
    assert r.exit_code == 0, r.output
    with h5py.File(home / "a.h5") as a, h5py.File(home / "b.h5") as b:
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


def test_a_record_of_anything_but_measurements_is_measured_again_and_no_lock_is_needed(tmp_path, monkeypatch):
    """A measurement record damaged or edited by hand (a rate as text, a flag) reads as none, so the
    measurement runs again rather than failing inside a comparison; on a filesystem without file locks a
    record is still written."""
    import errno
    import fcntl

    from reservoir.runtime import records

    monkeypatch.setenv("RESERVOIR_CACHE", str(tmp_path))
    (tmp_path / "dtype-rates.json").write_text(
        json.dumps({"a": {"float32": "fast"}, "b": {"float32": 1.0, "bf16": True}, "c": {"float32": 2.0}})
    )
    assert [records.get("dtype-rates.json", k) for k in "abc"] == [None, None, {"float32": 2.0}]

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    records.put("dtype-rates.json", "d", {"float32": 3.0})
    assert records.get("dtype-rates.json", "d") == {"float32": 3.0}
