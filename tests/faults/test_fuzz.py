"""The front door, fuzzed (Hypothesis): user files (``--task file:PATH``, ``.npz``/``.h5``) of random
shapes, dtypes, NaNs, labels, lengths and split arrays, and random option values, through
``extract``, ``fit`` and ``train`` with a tiny GPT-2. Every command either succeeds or exits 1 or
2 with a one-line message naming the file or the option: never a traceback, and a failed run
never leaves a file that looks complete (a feature file, a result).

The default run tries :data:`DEFAULT_EXAMPLES` examples per property; the ``slow``-marked twins
(``pytest -m slow tests/faults/test_fuzz.py``) try :data:`SLOW_EXAMPLES`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reservoir.cli import main

DEFAULT_EXAMPLES = 25
SLOW_EXAMPLES = 1000
FAST = settings(
    max_examples=DEFAULT_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
SLOW = settings(FAST, max_examples=SLOW_EXAMPLES, derandomize=False)

pytestmark = pytest.mark.usefixtures("one_thread")


# -- user files ------------------------------------------------------------------------------------

SPLIT_NAMES = ("train", "train", "test", "test", "val", "other", "", "a/b", "input_layer", "x")


def sometimes(draw, one_in: int = 8) -> bool:
    """True about once in ``one_in`` draws: each way of breaking a file is rare, so most files get far
    (Hypothesis favours the first of a list, so ``False`` leads)."""
    return draw(st.sampled_from([False] * (one_in - 1) + [True]))


@st.composite
def user_files(draw) -> dict[str, np.ndarray]:
    """The arrays of a user file: mostly the valid layout, each part broken now and then."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(20, 80)) if not sometimes(draw, 5) else draw(st.integers(0, 20))
    T = draw(st.integers(1, 5)) if not sometimes(draw, 10) else 0
    kind = draw(st.sampled_from(["dense"] * 3 + ["ids"] * 2 + ["odd"]))
    if kind == "dense":
        d = draw(st.integers(1, 3)) if not sometimes(draw, 10) else 0
        x = rng.standard_normal((n, T, d)).astype(draw(st.sampled_from(["float16", "float32", "float64"])))
        if sometimes(draw) and x.size:
            x.flat[rng.integers(x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e30, 6e4]))
    elif kind == "ids":
        low = -1 if sometimes(draw) else 0
        x = rng.integers(low, draw(st.integers(1, 40)), size=(n, T)).astype(
            draw(st.sampled_from(["uint8", "int8", "int32", "int64"]))
        )
    else:
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)))
        dtype = draw(st.sampled_from(["bool", "complex64", "int16", "float32", "U3"]))
        x = rng.integers(0, 3, size=shape).astype(dtype)
    classes = draw(st.integers(2, 4)) if not sometimes(draw, 10) else 1
    y = rng.integers(0, classes, size=n)
    if sometimes(draw, 3):
        match draw(
            st.sampled_from(["negative", "fraction", "length", "2-D", "strings", "bool", "float", "large"])
        ):
            case "negative" if n:
                y[rng.integers(n)] = -1
            case "fraction":
                y = y + 0.5
            case "length":
                y = y[: max(0, n - 1)]
            case "2-D":
                y = y[:, None]
            case "strings":
                y = y.astype(str)
            case "bool":
                y = y.astype(bool)
            case "float":
                y = y.astype(float)
            case "large" if n:
                y[rng.integers(n)] = 2**40
    arrays = {"x": x, "y": y}
    if sometimes(draw, 4):
        low = -1 if sometimes(draw) else 1
        high = T + (2 if sometimes(draw) else 1)
        arrays["lengths"] = rng.integers(low, max(low + 1, high), size=n).astype(
            draw(st.sampled_from(["int64", "int64", "int32", "float64"]))
        )
    if sometimes(draw, 3):
        names = ["train", "test", *draw(st.lists(st.sampled_from(SPLIT_NAMES), max_size=3))]
        size = n + (draw(st.sampled_from([-1, 1])) if sometimes(draw) else 0)
        arrays["split"] = np.array([names[i % len(names)] for i in rng.permutation(max(size, 0))], dtype=str)
    elif sometimes(draw, 5):  # Keras-style arrays per split
        cut = draw(st.integers(0, n))
        keras = {"x_train": x[:cut], "y_train": y[:cut], "x_test": x[cut:], "y_test": y[cut:]}
        if sometimes(draw, 4):
            keras.pop(draw(st.sampled_from(sorted(keras))))
        arrays = keras
    return arrays


def write_user_file(folder: Path, arrays: dict[str, np.ndarray], suffix: str) -> Path:
    path = folder / f"data{suffix}"
    if suffix == ".npz":
        np.savez(path, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for key, value in arrays.items():
                f[key] = value.astype("S") if value.dtype.kind == "U" else value
    return path


def invoke(home: Path, *args: str):
    """Run the CLI with ``home`` as RESERVOIR_HOME; returns (exit code, output). Any exception but
    SystemExit is a bug (CliRunner keeps it in ``result.exception``)."""
    r = CliRunner().invoke(main, list(args), env={"RESERVOIR_HOME": str(home), "RESERVOIR_OFFLINE": "1"})
    event(f"{args[1]} exit {r.exit_code}")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(
            f"{args} raised {type(r.exception).__name__}: {r.exception}\n{r.output}"
        ) from r.exception
    return r.exit_code, r.output


def check_failure(code: int, output: str, *names: str) -> None:
    """A failed command: exit 1 or 2, no traceback, one message naming one of ``names`` or an option."""
    assert code in (1, 2), (code, output)
    assert "Traceback" not in output, output
    error = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, output  # one message
    message = error[0]
    assert (
        any(name in message for name in names)
        or "--" in message
        or "parameter of" in message
        or "option of task" in message
    ), output


def complete_files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*") if p.suffix in (".h5", ".json") and p.is_file())


def run_user_file(
    tiny: Path,
    arrays: dict[str, np.ndarray],
    suffix: str,
    limit: int | None,
    train: bool,
    truncate: bool = False,
) -> None:
    from reservoir.extract.h5 import h5_file
    from reservoir.extract.store import verify

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        path = write_user_file(home, arrays, suffix)
        if truncate:  # a file cut short (a copy that died)
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        task = f"file:{path}"
        extra = ("--limit", str(limit)) if limit else ()
        command = (
            "-q",
            "extract",
            "--task",
            task,
            "--backbone",
            str(tiny),
            "--dtype",
            "float32",
            "--batch-size",
            "8",
            "--no-compile",
            "--engine",
            "torch",
            *extra,
        )
        code, output = invoke(home, *command)
        if code != 0:
            check_failure(code, output, str(path), path.name)
            assert not complete_files(home / "features")  # no feature file (a .partial at most)
        else:
            features = Path(next(line for line in reversed(output.splitlines()) if line.endswith(".h5")))
            with h5_file(features) as f:
                assert f.attrs["complete"]
                verify(f)
            again = invoke(home, *command)  # the same run again: the file verified and reused
            assert again == (0, output), again
            code, output = invoke(
                home,
                "-q",
                "fit",
                "--features",
                str(features),
                "--head",
                "ridge",
                "--no-baselines",
                "--depths",
                "0,2",
                "--val-fraction",
                "0.3",
            )
            if code != 0:
                check_failure(code, output, str(features), features.name)
                assert not (home / "results").exists()
        if train:
            before = set(complete_files(home))
            code, output = invoke(
                home,
                "-q",
                "train",
                "--task",
                task,
                "--backbone",
                str(tiny),
                "--steps",
                "2",
                "--eval-every",
                "1",
                "--batch-size",
                "4",
                "--checkpoint-every",
                "0",
                "--val-fraction",
                "0.3",
                "--checkpoint-dir",
                str(home / "ckpt"),
                *extra,
            )
            if code != 0:
                check_failure(code, output, str(path), path.name)
                assert not [p for p in set(complete_files(home)) - before if p.suffix == ".json"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from tests.conftest import save_tiny_gpt2

    return save_tiny_gpt2(tmp_path_factory.mktemp("fuzz-gpt2"), n_layer=2, n_embd=16)


user_file_runs = dict(
    arrays=user_files(),
    suffix=st.sampled_from([".npz", ".h5"]),
    limit=st.sampled_from([None, None, None, 1, 2, 5, 12, 40]),
    truncate=st.sampled_from([False] * 9 + [True]),
)


@FAST
@given(**user_file_runs)
def test_user_files_through_extract_and_fit(tiny, arrays, suffix, limit, truncate):
    run_user_file(tiny, arrays, suffix, limit, train=False, truncate=truncate)


@FAST
@given(**user_file_runs)
def test_user_files_through_train(tiny, arrays, suffix, limit, truncate):
    run_user_file(tiny, arrays, suffix, limit, train=True, truncate=truncate)


@pytest.mark.slow
@SLOW
@given(**user_file_runs)
def test_user_files_through_every_command_many(tiny, arrays, suffix, limit, truncate):
    run_user_file(tiny, arrays, suffix, limit, train=True, truncate=truncate)


# -- option values -----------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-3, 40),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0", "-0", "1e309", "nan", "inf", "-inf", "0x10", "1_000", " 3 "]),
)
TEXTS = st.one_of(
    NUMBERS.map(str), st.text(max_size=8), st.sampled_from(["", ",", "1,,2", "all", "-1", "0,-1", "a=b"])
)
#: options whose valid values set how much work a run does (steps, examples, tokens): valid ones stay small, so a
#: run ends in seconds; values past their bounds (refused while parsing) and garbage still come
SIZES = {
    "--steps",
    "--seeds",
    "--eval-every",
    "--patience",
    "--blocks",
    "--limit",
    "n_train",
    "n_test",
    "n_val",
    "n_bits",
    "n_patterns",
    "token_bits",
    "max_len",
    "min_length",
    "max_length",
    "max_depth",
    "max_args",
}
SIZE_TEXTS = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from(["2147483648", "1048577", str(2**70), "1e3", "0x8"]),
    st.text(max_size=4),
)


def value(draw, name: str) -> str:
    return draw(SIZE_TEXTS if name in SIZES else TEXTS)


#: (command, option) -> the values to try; the command's other options keep it small and fast
OPTIONS = {
    "extract": [
        "--limit",
        "--batch-size",
        "--seed",
        "--depths",
        "--input-scale",
        "--shard-rows",
        "--split",
        "--readout",
        "--dtype",
        "--device",
    ],
    "fit": ["--depths", "--val-fraction", "--seed", "--memory-mb", "--head"],
    "train": [
        "--lr",
        "--steps",
        "--seed",
        "--seeds",
        "--target",
        "--dropout",
        "--grad-clip",
        "--trainable",
        "--blocks",
        "--val-fraction",
        "--eval-every",
        "--patience",
        "--limit",
    ],
}
TASK_OPTIONS = {
    "bit_xor": ["n_bits", "n_train", "n_test", "seed"],
    "bit_memory": ["n_bits", "token_bits", "mask_prob"],
    "digits": ["test_size", "seed"],
    "listops": ["max_len", "min_length", "max_length", "max_depth", "max_args", "source", "tokenization"],
}
SMALL = {
    "bit_xor": ("--task-opt", "n_train=24", "--task-opt", "n_test=8"),
    "bit_memory": ("--task-opt", "n_train=24", "--task-opt", "n_test=8", "--task-opt", "n_patterns=2"),
    "digits": ("--limit", "100"),
    "listops": (
        "--task-opt",
        "n_train=30",
        "--task-opt",
        "n_val=10",
        "--task-opt",
        "n_test=10",
        "--task-opt",
        "min_length=3",
        "--task-opt",
        "max_length=40",
        "--task-opt",
        "max_len=64",
    ),
}


@st.composite
def option_runs(draw) -> tuple[str, str, list[str]]:
    """A command, a small task, and one or two fuzzed options (task options too, for extract and train)."""
    command = draw(st.sampled_from(sorted(OPTIONS)))
    task = draw(st.sampled_from(sorted(SMALL)))
    fuzzed = []
    for _ in range(draw(st.integers(1, 2))):
        if command == "fit" or draw(st.booleans()):
            option = draw(st.sampled_from(OPTIONS[command]))
            fuzzed += [option, value(draw, option)]
        else:
            key = draw(st.sampled_from(TASK_OPTIONS[task]))
            fuzzed += ["--task-opt", f"{key}={value(draw, key)}"]
    return command, task, fuzzed


def run_options(tiny: Path, command: str, task: str, fuzzed: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        extract = [
            "--backbone",
            str(tiny),
            "--dtype",
            "float32",
            "--no-compile",
            "--engine",
            "torch",
            "--depths",
            "0,1",
        ]
        if command == "fit":  # fit reads features: extract the small task first, then fuzz fit's own options
            code, output = invoke(home, "-q", "extract", "--task", task, *SMALL[task], *extract)
            assert code == 0, output
            args = ["fit", "--task", task, "--backbone", str(tiny), "--no-baselines", "--head", "ridge"]
        elif command == "extract":
            args = ["extract", "--task", task, *SMALL[task], *extract]
        else:
            args = [
                "train",
                "--task",
                task,
                *SMALL[task],
                "--backbone",
                str(tiny),
                "--steps",
                "2",
                "--eval-every",
                "1",
                "--checkpoint-every",
                "0",
                "--checkpoint-dir",
                str(home / "ckpt"),
            ]
        before = set(complete_files(home))
        code, output = invoke(home, "-q", *args, *fuzzed)  # given later, the fuzzed options win
        if code != 0:  # the message names an option given (or the file, for what is found in it)
            names = [a.lstrip("-").replace("-", "_") for a in fuzzed[::2]]
            names += [a.partition("=")[0] for a in fuzzed[1::2] if "=" in a] + [str(home)]
            check_failure(code, output, *names, *[n.replace("_", "-") for n in names])
            assert set(complete_files(home)) == before, output  # no feature file, no result


@FAST
@given(option_runs())
def test_option_values_through_every_command(tiny, run):
    run_options(tiny, *run)


@pytest.mark.slow
@SLOW
@given(option_runs())
def test_option_values_through_every_command_many(tiny, run):
    run_options(tiny, *run)
