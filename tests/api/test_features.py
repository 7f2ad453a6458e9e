"""Outputs out: feature files read back (all depths, xarray, a torch Dataset), saved probes applied by
``reservoir predict``, results as a DataFrame, and ``api.train``."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from reservoir import api
from reservoir.errors import DataError, IdentityError, StoreError, UsageError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits(tiny_gpt2, tmp_path_factory):
    """Digits (120 a split) through the 2-block tiny GPT-2, depths 0..2, float32."""
    folder = tmp_path_factory.mktemp("digits")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESERVOIR_HOME", str(folder))
        return api.extract("digits", str(tiny_gpt2), limit=120, dtype="float32", out=folder / "digits.h5")


# -- reading features back ----------------------------------------------------------------------------


def test_all_depth_reader_equals_the_per_depth_reads(digits):
    X, y, depths = api.read_features(digits, "test")
    assert depths == [0, 1, 2] and X.dtype == np.float32 and X.shape == (120, 3, 1, 32)
    for k, depth in enumerate(depths):
        one, labels = api.read_features(digits, "test", depth)  # the single-depth form, as before
        np.testing.assert_array_equal(X[:, k].reshape(len(X), -1), one)
        np.testing.assert_array_equal(y, labels)
    some, _, chosen = api.read_features(digits, "test", depths="0,-1")
    assert chosen == [0, 2]
    np.testing.assert_array_equal(some, X[:, [0, 2]])
    last, _ = api.read_features(digits, "test", -1)  # the single-depth form counts from the last as --depths
    np.testing.assert_array_equal(last, X[:, 2].reshape(len(X), -1))
    assert np.array_equal(
        api.FeatureDataset(digits, "test", -1)[0][0], api.FeatureDataset(digits, "test", 2)[0][0]
    )
    with pytest.raises(UsageError, match=r"depth -4 is not in .*; it holds depths \[0, 1, 2\]"):
        api.read_features(digits, "test", -4)
    with pytest.raises(UsageError, match="depth 5 is not available"):
        api.read_features(digits, "test", depths=[5])
    with pytest.raises(UsageError, match="not both"):
        api.read_features(digits, "test", 1, depths="all")
    with pytest.raises(UsageError, match=r"split 'val' is not in .*; it holds \[.*'train'"):
        api.read_features(digits, "val")


def test_all_depth_reader_refuses_damaged_features(digits, tmp_path):
    import shutil

    import h5py

    copy = tmp_path / "damaged.h5"
    shutil.copy(digits, copy)
    with h5py.File(copy, "r+") as f:
        ds = f["test"]["features"]
        ds[0, 1] = ds[0, 1] + 1.0  # rewritten with a valid checksum: only the recorded digest can tell
    with pytest.raises(StoreError, match="depth 1: the features differ from the digest"):
        api.read_features(copy, "test")
    for depth in (
        1,
        -2,
    ):  # both readers verify the depth a negative one names, and say it
        with pytest.raises(StoreError, match="depth 1: the features differ from the digest"):
            api.read_features(copy, "test", depth)
        with pytest.raises(StoreError, match="depth 1: the features differ from the digest"):
            api.FeatureDataset(copy, "test", depth)


def test_read_features_as_an_xarray_dataset(digits):
    xr = pytest.importorskip("xarray")
    ds = api.read_features(digits, "train", as_xarray=True)
    assert isinstance(ds, xr.Dataset)
    assert ds.features.dims == ("row", "depth", "readout", "feature") and ds.labels.dims == ("row",)
    assert (
        list(ds.depth.values) == [0, 1, 2] and ds.attrs["task"] == "digits" and ds.attrs["split"] == "train"
    )
    X, y = api.read_features(digits, "train", depth=2)
    np.testing.assert_array_equal(ds.features.sel(depth=2).values.reshape(len(X), -1), X)
    np.testing.assert_array_equal(ds.labels.values, y)
    assert list(api.read_features(digits, "train", 1, as_xarray=True).depth.values) == [1]


def test_the_file_names_its_dimensions_for_any_hdf5_reader(digits):
    """Each split's ``features`` carries HDF5 dimension labels (row, depth, readout, feature) and a ``depth``
    dimension scale holding the depths, as h5py (and netCDF-4 readers) see them without reservoir."""
    import h5py

    with h5py.File(digits) as f:
        for split in ("train", "test"):
            features = f[split]["features"]
            assert [d.label for d in features.dims] == ["row", "depth", "readout", "feature"]
            assert list(features.dims[1][0][:]) == [0, 1, 2] == list(f.attrs["depths"])
            assert features.dims[1][0].name == f"/{split}/depth"


def test_optional_packages_are_named_when_absent(digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)  # `import xarray` raises ImportError
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(
        ImportError, match=r"as_xarray=True\) needs the optional package 'xarray'.*pip install xarray"
    ):
        api.read_features(digits, "train", as_xarray=True)
    with pytest.raises(
        ImportError, match=r"api.results needs the optional package 'pandas'.*pip install pandas"
    ):
        api.results()


WORKERS = """
import importlib.util
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader
from reservoir import api

data = api.FeatureDataset(sys.argv[1], "train", depth=1)
assert data._file is None  # nothing held open in the parent: each worker opens its own
X, y = api.read_features(sys.argv[1], "train", depth=1)
for workers in (0, 2):  # DataLoader's default start method on Linux: fork
    batches = list(DataLoader(data, batch_size=16, num_workers=workers))
    got = torch.cat([b[0] for b in batches]).numpy()
    labels = torch.cat([b[1] for b in batches]).numpy()
    assert got.dtype == np.float32 and got.shape == (120, 32), got.shape
    np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(labels, y)
print("ok")
"""


@pytest.mark.parametrize("depth", [True, 1.9, "2", None])
def test_a_depth_that_is_not_an_integer_is_refused_by_every_reader(digits, depth):
    """A bool, a float or text as a depth is refused by the readers, as fit refuses it: never read as the
    depth it rounds or compares equal to (True is 1)."""
    from reservoir.errors import UsageError

    with pytest.raises(UsageError, match=r"is not a depth: give an integer"):
        api.FeatureDataset(digits, "train", depth=depth)
    if depth is not None:  # read_features without a depth reads them all
        with pytest.raises(UsageError, match=r"is not a depth: give an integer"):
            api.read_features(digits, "train", depth=depth)


def test_a_negative_depth_names_the_depth_it_reads(digits):
    data = api.FeatureDataset(digits, "train", depth=-1)
    assert data.depth == 2
    np.testing.assert_array_equal(data[0][0], api.FeatureDataset(digits, "train", depth=2)[0][0])


def test_feature_dataset_through_dataloader_workers(digits):
    """In a fresh process, as a training script runs it: DataLoader workers (forked) each open the file."""
    import os
    import subprocess
    import sys

    assert len(api.FeatureDataset(digits, "train", depth=1)) == 120
    r = subprocess.run(
        [sys.executable, "-c", WORKERS, str(digits)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def reference_predictions(path, head, depth):
    """The fit's head refitted in-process as ``fit`` fits it, and its predictions on the test split."""
    from reservoir.extract.store import iter_depth, open_features
    from reservoir.probe.fit import FileRows
    from reservoir.probe.heads import fit_probe
    from reservoir.probe.rows import rows

    with open_features(path) as f:
        scores, predictor = fit_probe(
            head,
            FileRows(f, "train", depth),
            {"test": FileRows(f, "test", depth)},
            seed=0,
            device="cpu",
            memory_bytes=1024 * 2**20,
        )
        return scores, np.concatenate([predictor(rows(X, y)[0]) for X, y in iter_depth(f, "test", depth)])[
            :, 0
        ]


def read_csv(text):
    lines = list(csv.DictReader(io.StringIO(text)))
    return np.array([int(r["prediction"]) for r in lines]), np.array([int(r["label"]) for r in lines])


@pytest.mark.parametrize("head", ["logreg", "ridge", "torch"])
def test_saved_probe_applied_by_predict_reproduces_the_fit(digits, home, cli, head, tmp_path):
    results = api.fit(features=digits, head=head, depths="1,2", baselines=False, device="cpu")
    for result in results:
        probe = result["probe"]
        assert probe.endswith(".probe.npz") and probe[: -len(".probe.npz")] == result["path"][: -len(".json")]
        assert json.loads(Path(result["path"]).read_text())["probe"] == probe  # the result names its probe
        with np.load(probe, allow_pickle=False) as z:  # plain arrays and JSON: nothing to unpickle
            meta = json.loads(str(z["meta"]))
        assert meta["head"] == head and meta["depth"] == result["depth"]
        assert meta["hyperparameters"] == result["hyperparameters"] and meta["classes"] == list(range(10))
        assert meta["identity_hash"] == result["identity_hash"]

        out = tmp_path / f"{head}-{result['depth']}.csv"
        ran = cli(
            "predict", "--probe", probe, "--features", str(digits), "--split", "test", "--out", str(out)
        )
        assert ran.exit_code == 0, ran.output
        predictions, labels = read_csv(out.read_text())
        _, expected = reference_predictions(digits, head, result["depth"])
        np.testing.assert_array_equal(predictions, expected)  # the fit's own test predictions, exactly
        assert float(np.mean(predictions == labels)) == result["test_accuracy"]
        assert f"accuracy {100 * result['test_accuracy']:.2f}%" in ran.output
        np.testing.assert_array_equal(api.predict(probe, digits), predictions)  # the API gives the same

        X, y = api.read_features(digits, "test", depth=result["depth"])
        np.testing.assert_array_equal(api.load_probe(probe).predict(X), predictions)  # and in memory
        X[2, ..., 0] = np.nan
        with pytest.raises(ValueError, match=r"NaN or infinite values \(row 2\)"):  # not predicted as a class
            api.load_probe(probe).predict(X)


@pytest.mark.parametrize("head", ["logreg", "ridge", "torch"])
@pytest.mark.parametrize("memory_bytes", [None, 1])
@pytest.mark.parametrize("outputs", [None, 3])
def test_predictor_state_round_trip_predicts_the_same(head, memory_bytes, outputs):
    """Every predictor a head search returns (in memory, streamed; classes or bits) survives its state."""
    from reservoir.probe.heads import fit_probe
    from reservoir.probe.predictors import Predictor, predictor_from_state
    from reservoir.probe.rows import ArrayRows

    rng = np.random.default_rng(0)
    n, classes = 400, 2 if outputs else 4
    y = rng.integers(0, classes, n if outputs is None else (n, 1, outputs))
    first = y if outputs is None else y[:, 0, 0]
    X = (rng.normal(size=(classes, 12))[first] + rng.normal(size=(n, 12)) + 3.0)[:, None].astype(np.float32)
    scores, predictor = fit_probe(
        head, ArrayRows(X[:300], y[:300]), {"test": ArrayRows(X[300:], y[300:])}, memory_bytes=memory_bytes
    )
    assert isinstance(predictor, Predictor)
    meta, arrays = predictor.state()
    json.dumps(meta)  # the metadata is JSON
    again = predictor_from_state(json.loads(json.dumps(meta)), {k: np.array(v) for k, v in arrays.items()})
    np.testing.assert_array_equal(again(X[300:, 0]), predictor(X[300:, 0]))
    assert again(X[300:, 0]).shape == (100, outputs or 1)
    assert scores["test_accuracy"] == float(
        np.mean(
            predictor(X[300:, 0])[:, 0] == y[300:] if outputs is None else predictor(X[300:, 0]) == y[300:, 0]
        )
    )


def test_predict_refuses_features_of_other_settings(tiny_gpt2, digits, home, cli, tmp_path):
    probe = api.fit(features=digits, head="ridge", depths="2", baselines=False)[0]["probe"]
    other = api.extract(
        "digits", str(tiny_gpt2), limit=120, dtype="float32", seed=1, depths="0,1", out=tmp_path / "seed1.h5"
    )
    ran = cli("predict", "--probe", probe, "--features", str(other))
    assert ran.exit_code == 1 and "Traceback" not in ran.output
    assert (
        "seed: probe 0, file 1" in ran.output
        and "the probe reads depth 2, the file holds depths [0, 1]" in ran.output
    )
    assert (
        "reservoir extract --task digits" in ran.output and "--seed 0" in ran.output
    )  # what to extract instead

    rng = np.random.default_rng(
        0
    )  # another task's shape: 2 classes of 3-wide tokens, the same backbone and seed
    np.savez(
        tmp_path / "mine.npz",
        x=rng.normal(size=(40, 6, 3)).astype(np.float32),
        y=np.arange(40) % 2,
        split=np.where(np.arange(40) < 30, "train", "test"),
    )
    mine = api.extract(
        f"file:{tmp_path / 'mine.npz'}", str(tiny_gpt2), dtype="float32", out=tmp_path / "mine.h5"
    )
    with pytest.raises(
        IdentityError,
        match="rows: the probe's data had rows of 16 tokens each, the file's 'test' rows have 6",
    ):
        api.predict(probe, mine)

    more = api.extract("digits", str(tiny_gpt2), limit=150, dtype="float32", out=tmp_path / "more.h5")
    assert api.predict(probe, more).shape == (150,)  # new data, the same settings: predicted
    with pytest.raises(UsageError, match="split 'val' is not in"):
        api.predict(probe, more, "val")


class Payload:
    """Unpickling this creates ``marker``: the side effect a crafted probe would have."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_predict_refuses_files_that_are_not_probes(digits, tmp_path, cli):
    marker = tmp_path / "payload-ran"
    pickled = tmp_path / "head.probe.npz"
    pickled.write_bytes(pickle.dumps({"coef": Payload(marker)}))
    objects = tmp_path / "objects.probe.npz"  # a real .npz whose array is pickled objects
    np.savez(
        objects,
        meta=np.array(json.dumps({"kind": "reservoir-probe", "format": 1})),
        coef=np.array([Payload(marker)], dtype=object),
    )
    lone = tmp_path / "lone.npz"
    np.save(lone.with_suffix(".npy"), np.zeros(3))
    lone.with_suffix(".npy").rename(lone)
    plain = tmp_path / "plain.npz"
    np.savez(plain, coef=np.zeros(3))
    for path, why in (
        (pickled, "it is a Python pickle .never unpickled here., not an .npz archive"),
        (objects, "Object arrays cannot be loaded"),
        (lone, "it is a single .npy array, not an .npz archive"),
        (plain, "no metadata"),
        (tmp_path / "absent.npz", "does not exist"),
    ):
        with pytest.raises(DataError, match=why):
            api.load_probe(path)
        ran = cli("predict", "--probe", str(path), "--features", str(digits))
        assert ran.exit_code == 1 and "Traceback" not in ran.output and "reservoir fit" in ran.output
        assert str(path) in ran.output
    assert not marker.exists(), "a crafted probe's payload ran"


# -- results and training ------------------------------------------------------------------------------


def test_results_dataframe_is_the_report_table(digits, home, cli, tmp_path):
    pd = pytest.importorskip("pandas")
    api.fit(features=digits, head="ridge", depths="0,2", baselines=False)
    table = api.results()
    ran = cli("report", str(home / "results"), "--csv", str(tmp_path / "report.csv"))
    assert ran.exit_code == 0, ran.output
    printed = pd.read_csv(tmp_path / "report.csv")
    assert list(table.columns) == list(printed.columns) and len(table) == len(printed) == 3  # d0, d2, chosen
    np.testing.assert_allclose(table["test"].to_numpy(float), printed["test"].to_numpy(float))
    assert list(table["column"]) == ["d0", "d2", "chosen"]
    by_task = api.results(home / "results", layout="task", depths=["chosen", "last"])
    assert len(by_task) == 2 and set(by_task["depth_rule"]) == {"chosen", "last"}
    with pytest.raises(UsageError, match="layout='task'"):
        api.results(depths="last")
    with pytest.raises(DataError, match="does not exist"):
        api.results(tmp_path / "nowhere")


def test_train_checks_its_settings_as_the_command_line_does(tiny_gpt2, home):
    from reservoir.api import configure
    from reservoir.config import TrainConfig

    cfg = configure(TrainConfig, "digits", str(tiny_gpt2), lr="1e-3,3e-4", trainable="input,ln", steps=2)
    assert cfg.lr == (1e-3, 3e-4) and cfg.trainable == ("input", "ln") and cfg.steps == 2
    assert configure(TrainConfig, "digits", "lstm", lr=0.01).lr == (0.01,)
    with pytest.raises(UsageError, match="unknown task 'nope'; choose from"):
        api.train("nope", "lstm")
    with pytest.raises(UsageError, match="unknown backbone 'nope'"):
        api.train("digits", "nope")
    with pytest.raises(UsageError, match="unknown option 'colour' for task 'digits'"):
        api.train("digits", "lstm", task_options={"colour": "red"})
    with pytest.raises(UsageError, match="unknown trainable group 'wings'; choose from"):
        api.train("digits", "lstm", trainable="input,wings")
    with pytest.raises(UsageError, match="'lr' parameter of train must be in"):
        api.train("digits", "lstm", lr=-1)
    with pytest.raises(UsageError, match="unknown setting 'epochs'"):
        api.train("digits", "lstm", epochs=3)


def test_train_runs_and_writes_its_result(tiny_gpt2, home):
    result = api.train(
        "digits",
        str(tiny_gpt2),
        steps=3,
        eval_every=3,
        limit=100,
        batch_size=8,
        device="cpu",
        dtype="float32",
    )
    assert result["mode"] == "end-to-end" and max(result["steps"]) <= 3 and 0 <= result["test_accuracy"] <= 1
    written = list((home / "results").rglob("end-to-end_*.json"))
    assert (
        len(written) == 1 and json.loads(written[0].read_text())["test_accuracy"] == result["test_accuracy"]
    )


def test_status_lines_go_through_the_reservoir_logger(tiny_gpt2, capsys):
    """Every status line is a record of the ``reservoir`` logger: on stderr by default, silenced by its
    level, sent elsewhere by its handlers; the API shows nothing where nobody watches (no terminal here)."""
    import logging

    logger = logging.getLogger("reservoir")
    settings = {"limit": 20, "depths": "0", "dtype": "float32", "compile": False}
    api.extract("digits", str(tiny_gpt2), **settings)
    assert "loading backbone" not in capsys.readouterr().err  # progress=None: not interactive here
    api.extract("digits", str(tiny_gpt2), progress=True, seed=1, **settings)
    assert "loading backbone" in capsys.readouterr().err
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    saved = logger.handlers[:], logger.level
    try:
        logger.handlers[:] = [handler]
        api.extract("digits", str(tiny_gpt2), progress=True, seed=2, **settings)
        assert (
            any("loading backbone" in r for r in records)
            and "loading backbone" not in capsys.readouterr().err
        )
        logger.setLevel(logging.WARNING)
        records.clear()
        api.extract("digits", str(tiny_gpt2), progress=True, seed=3, **settings)
        assert records == []
    finally:
        logger.handlers[:], level = saved
        logger.setLevel(level)


def test_a_notebook_gets_a_live_bar(monkeypatch):
    """In a Jupyter kernel the bar is tqdm.auto's widget (where ipywidgets is installed), else a bar that
    redraws in place; on a pipe, a line at a time."""
    import types

    from reservoir import progress

    assert not progress.in_notebook()
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert progress.in_notebook() and progress.interactive()
    with progress.bar(10, "x") as b:
        widget = type(b).__module__.startswith("tqdm.notebook")
        assert widget == (importlib.util.find_spec("ipywidgets") is not None)
        assert widget or b.mininterval == progress.TTY_INTERVAL  # redrawn in place, not a line every 15 s


@pytest.mark.parametrize("kwargs", [{"depth": 1.9}, {"depths": [0.9, 2]}, {"seed": 1.0}])
def test_api_fit_refuses_a_depth_or_seed_that_is_not_an_integer(digits, home, kwargs):
    with pytest.raises(
        ValueError, match=r"must be 'all', an integer or a list of integers|must be an integer"
    ):
        api.fit(features=digits, head="ridge", **kwargs)
