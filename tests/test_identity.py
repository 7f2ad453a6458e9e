"""Every artifact keyed by what produced it: a changed setting never returns stale features,
an unchanged rerun reuses its file without recomputing, results never overwrite each other."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.identity import digest
from reservoir.model.backbones import fingerprint as backbone_fingerprint
from reservoir.runtime.runner import FeatureRunner
from tests.conftest import save_tiny_gpt2

#: a fast run: 24 digits per split through the 2-block, 32-wide GPT-2, float32
BASE = ("--limit", "24", "--dtype", "float32", "--batch-size", "8")


@pytest.fixture
def extract(cli, tiny_gpt2):
    """``extract(*args)`` -> (exit code, output, path printed on stdout or None)."""

    def run(*args: str, backbone: str | None = None, task: str = "digits"):
        r = cli("-q", "extract", "--task", task, "--backbone", backbone or str(tiny_gpt2), *BASE, *args)
        path = Path(r.stdout.strip().splitlines()[-1]) if r.exit_code == 0 else None
        return r.exit_code, r.output, path

    return run


def features(path: Path, split: str = "train") -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[split]["features"][:]


def identity_of(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["identity"])


@pytest.fixture
def no_compute(monkeypatch):
    """Any forward pass fails: proves a rerun reused its file."""

    def refuse(self, batch):
        raise AssertionError("features were recomputed")

    monkeypatch.setattr(FeatureRunner, "run_async", refuse)


def test_unchanged_rerun_reuses_the_file_without_recomputing(extract, home, monkeypatch):
    code, _, path = extract("--seed", "1")
    assert code == 0
    before = (path.stat().st_mtime_ns, path.read_bytes())

    def refuse(self, batch):
        raise AssertionError("features were recomputed")

    monkeypatch.setattr(FeatureRunner, "run_async", refuse)
    code, out, again = extract("--seed", "1", "--dtype", "float32")
    assert code == 0 and again == path, out
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    code, out, explicit = extract(
        "--seed", "1", "--out", str(path)
    )  # the same file named explicitly: reused too
    assert code == 0 and explicit == path


# each case: the option that changes, the identity field that must record it
CHANGES = [
    (("--seed", "1"), "seed"),
    (("--limit", "16"), "limit"),
    (("--depths", "0,2"), "depths"),
    (("--dtype", "bfloat16"), "dtype"),
    (("--readout", "mean"), "readout"),
    (("--split", "test"), "splits"),
]


@pytest.mark.parametrize("change,field", CHANGES, ids=[c[1] for c in CHANGES])
def test_any_changed_setting_writes_elsewhere_or_is_refused(extract, home, change, field):
    code, _, first = extract()
    assert code == 0
    old = features(first, "test")
    code, out, second = extract(*change)  # default path: another file, never the old features
    assert code == 0, out
    assert second != first and second.exists() and first.exists()
    assert identity_of(second)[field] != identity_of(first)[field]
    assert np.array_equal(features(first, "test"), old)  # the first file is untouched
    code, out, _ = extract(*change, "--out", str(first))  # the old file named explicitly: refused, exit 1
    assert code == 1 and f"{first} holds features of another run" in out and f"{field}: stored" in out
    assert "pass another --out, or delete it" in out and "Traceback" not in out


def test_the_padded_readout_of_a_task_of_fixed_length_is_refused_as_last(extract, home):
    """Rows of one length have no padding: ``padded`` reads what ``last`` reads; a second file of the same
    features is refused before any is written, and a task of variable length takes it."""
    code, out, _ = extract("--readout", "padded")
    assert code == 1 and "task 'digits' has rows of one length (16 tokens)" in out and "--readout last" in out
    assert not (home / "features").exists()
    small = ("max_len=32", "n_val=8", "n_test=8", "min_length=4", "max_length=30")
    code, out, path = extract(
        "--readout", "padded", *(a for o in small for a in ("--task-opt", o)), task="listops"
    )
    assert code == 0 and identity_of(path)["readout"] == "padded", out


def test_task_option_and_seed_reach_generated_data(extract, home):
    code, _, a = extract(task="bit_xor")
    code_b, _, b = extract("--task-opt", "n_bits=4", task="bit_xor")
    code_c, _, c = extract("--seed", "5", task="bit_xor")
    code_d, _, d = extract("--seed", "5", "--task-opt", "seed=0", task="bit_xor")
    assert (code, code_b, code_c, code_d) == (0, 0, 0, 0)
    assert len({a, b, c, d}) == 4
    ia, ib, ic, id_ = (identity_of(p) for p in (a, b, c, d))
    assert ib["task_options"]["n_bits"] == 4 and ib["data"] != ia["data"]
    # --seed seeds the generated bits (as its help says); a task's own seed option overrides it for the data
    assert ic["task_options"]["seed"] == 5 and ic["data"] != ia["data"]
    assert id_["task_options"]["seed"] == 0 and id_["data"] == ia["data"] and id_["seed"] == 5
    with h5py.File(a) as fa, h5py.File(c) as fc:
        assert not np.array_equal(fa["train/labels"][:], fc["train/labels"][:])


def test_another_user_file_with_the_same_name_never_gets_the_old_features(extract, home, tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "other").mkdir()
    np.savez(tmp_path / "mine.npz", x=rng.random((40, 6, 3), dtype=np.float32), y=np.arange(40) % 4)
    np.savez(tmp_path / "other" / "mine.npz", x=rng.random((30, 6, 3), dtype=np.float32), y=np.arange(30) % 3)
    code, _, first = extract(task=f"file:{tmp_path / 'mine.npz'}")
    code2, out, second = extract(task=f"file:{tmp_path / 'other' / 'mine.npz'}")
    assert (code, code2) == (0, 0), out
    assert second != first and identity_of(first)["data"] != identity_of(second)["data"]
    with h5py.File(second) as f:
        assert f["train/features"].shape[0] + f["test/features"].shape[0] == 30
    code, out, _ = extract("--out", str(first), task=f"file:{tmp_path / 'other' / 'mine.npz'}")
    assert code == 1 and "data.test: stored" in out and "data.train: stored" in out
    # the same file copied elsewhere is the same data: its features are reused
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "mine.npz").write_bytes((tmp_path / "mine.npz").read_bytes())
    code, _, third = extract(task=f"file:{tmp_path / 'copy' / 'mine.npz'}")
    assert code == 0 and third == first


def test_two_backbone_folders_with_the_same_name_never_share_a_file(extract, home, tmp_path):
    a = save_tiny_gpt2(tmp_path / "a" / "checkpoint-500", seed=1)
    b = save_tiny_gpt2(tmp_path / "b" / "checkpoint-500", seed=2)
    code, _, fa = extract(backbone=str(a))
    code2, out, fb = extract(backbone=str(b))
    assert (code, code2) == (0, 0), out
    assert fa.parent == fb.parent and fa != fb  # features/digits/checkpoint-500/, two files
    assert not np.array_equal(features(fa), features(fb))
    code, out, _ = extract("--out", str(fa), backbone=str(b))
    assert code == 1 and "backbone_fingerprint: stored" in out


def test_fit_never_takes_the_features_of_another_folder_of_the_same_name(extract, cli, home, tmp_path):
    """A folder backbone is recorded by its base name: fit by task and backbone, or given the file, compares
    the folder's weights too, and refuses the other folder's features."""
    a = save_tiny_gpt2(tmp_path / "a" / "checkpoint-500", seed=1)
    b = save_tiny_gpt2(tmp_path / "b" / "checkpoint-500", seed=2)
    code, out, fa = extract(backbone=str(a))
    assert code == 0, out
    fit = (
        "-q",
        "fit",
        "--task",
        "digits",
        "--limit",
        "24",
        "--no-baselines",
        "--depths",
        "1",
        "--val-fraction",
        "0.5",
    )
    r = cli(*fit, "--backbone", str(b))
    assert r.exit_code == 1 and "another folder named 'checkpoint-500' (other weights)" in r.output
    r = cli(*fit, "--backbone", str(b), "--features", str(fa))
    assert r.exit_code == 1 and f"{b} holds other weights" in r.output
    r = cli(*fit, "--backbone", str(a))
    assert r.exit_code == 0, r.output


def test_the_random_twin_of_another_seed_is_another_backbone():
    from reservoir.model.backbones import load_backbone

    assert backbone_fingerprint(load_backbone("lstm", 0)) == backbone_fingerprint(load_backbone("lstm", 0))
    assert backbone_fingerprint(load_backbone("lstm", 0)) != backbone_fingerprint(load_backbone("lstm", 1))
    # same weights, another architecture (residual connections have no parameters)
    assert backbone_fingerprint(load_backbone("lstm-12", 0)) != backbone_fingerprint(
        load_backbone("lstm-12-residual", 0)
    )


def test_an_adapter_whose_reading_changed_is_another_backbone(monkeypatch, tiny_gpt2):
    """Features of the same weights read another way (a fixed adapter raises its ``reading``) are never
    served from a file or checkpoint of the earlier reading; the first reading's fingerprint stays as it was."""
    from reservoir.model.backbones import load_backbone
    from reservoir.model.backbones.base import Backbone
    from reservoir.model.backbones.hf import HFBackbone

    lstm, gpt2 = load_backbone("lstm", 0), load_backbone(str(tiny_gpt2))
    before = backbone_fingerprint(lstm), backbone_fingerprint(gpt2)
    assert isinstance(gpt2, HFBackbone)
    monkeypatch.setattr(type(gpt2), "reading", 3)
    assert backbone_fingerprint(lstm) == before[0] and backbone_fingerprint(gpt2) != before[1]
    monkeypatch.setattr(Backbone, "reading", 2)
    assert backbone_fingerprint(lstm) != before[0]


def test_a_partial_file_of_another_run_is_not_resumed(extract, home, monkeypatch, tmp_path, tiny_gpt2):
    from reservoir.config import ExtractConfig
    from reservoir.extract.run import extract as run_extract

    out = tmp_path / "f.h5"

    def killed(self, batch):
        raise KeyboardInterrupt

    monkeypatch.setattr(FeatureRunner, "run_async", killed)
    with pytest.raises(KeyboardInterrupt):
        run_extract(
            ExtractConfig(
                task="digits",
                backbone=str(tiny_gpt2),
                limit=24,
                dtype="float32",
                batch_size=8,
                seed=3,
                out=out,
            ),
            progress=False,
        )
    monkeypatch.undo()
    assert not out.exists() and out.with_name("f.h5.partial").exists()
    code, output, _ = extract("--seed", "4", "--out", str(out))
    assert code == 1 and "unfinished run with other settings (" in output
    # the seed draws the sample of --limit too
    assert "; seed: stored 3, asked 4; subset.seed: stored 3, asked 4)" in output
    code, output, path = extract("--seed", "3", "--out", str(out))
    assert code == 0 and path == out


def test_files_that_are_not_feature_files_are_named(extract, cli, home, tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    code, out, _ = extract("--out", str(junk))
    assert (
        code == 1 and f"{junk} is not an HDF5 feature file" in out and junk.read_bytes() == b"not hdf5 at all"
    )
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    code, out, _ = extract("--out", str(other))
    assert code == 1 and "not a reservoir feature file" in out and "pass another --out" in out
    for command in (("fit", "--features"), ("export", "--out", str(tmp_path / "x.parquet"))):
        for path in (other, junk):  # read, not written: the fix names the file to give, not --out
            r = cli(*command, str(path))
            assert r.exit_code == 1 and "feature file" in r.output and "--out" not in r.output.split(";")[-1]
            assert "pass a feature file `reservoir extract` wrote" in r.output


def test_fit_refuses_features_of_another_task_or_file(extract, cli, home, tmp_path):
    code, _, digits = extract("--limit", "200")
    assert code == 0
    r = cli("fit", "--task", "mnist", "--features", str(digits))
    assert r.exit_code == 1 and "holds features of task 'digits', not 'mnist'" in r.output
    assert not (home / "results").exists()
    rng = np.random.default_rng(0)
    (tmp_path / "other").mkdir()
    np.savez(tmp_path / "mine.npz", x=rng.random((60, 5, 2), dtype=np.float32), y=np.arange(60) % 3)
    np.savez(tmp_path / "other" / "mine.npz", x=rng.random((60, 5, 2), dtype=np.float32), y=np.arange(60) % 2)
    code, _, mine = extract(task=f"file:{tmp_path / 'mine.npz'}")
    r = cli("fit", "--task", f"file:{tmp_path / 'other' / 'mine.npz'}", "--features", str(mine))
    assert r.exit_code == 1 and "was extracted from another file named 'mine.npz'" in r.output
    r = cli(
        "-q", "fit", "--features", str(digits), "--head", "ridge", "--depths", "-1", "--no-baselines"
    )  # task from the file
    assert r.exit_code == 0, r.output
    (result,) = (home / "results").rglob("*.json")
    assert result.parent == home / "results" / "digits" / "tiny-gpt20"


def test_fits_that_differ_only_in_seed_keep_both_results(extract, cli, home):
    code, _, path = extract("--limit", "200")
    for seed in ("0", "1"):
        r = cli(
            "-q",
            "fit",
            "--features",
            str(path),
            "--head",
            "torch",
            "--depths",
            "2",
            "--seed",
            seed,
            "--no-baselines",
        )
        assert r.exit_code == 0, r.output
    files = sorted((home / "results").rglob("*.json"))
    assert len(files) == 2 and "seed0" in files[0].name and "seed1" in files[1].name
    results = [json.loads(f.read_text()) for f in files]
    assert (
        results[0]["identity_hash"] == results[1]["identity_hash"] and results[0]["key"] != results[1]["key"]
    )
    # refitting the same seed replaces its own file only; report lists each result once
    assert (
        cli(
            "-q", "fit", "--features", str(path), "--head", "torch", "--depths", "2", "--no-baselines"
        ).exit_code
        == 0
    )
    assert len(list((home / "results").rglob("*.json"))) == 2
    table = cli("report", str(home / "results"), str(home / "results" / "digits")).stdout
    (row,) = [line for line in table.splitlines() if "| torch |" in line and "baseline" not in line]
    assert "(n=2)" in row  # two seeds, one row: mean and spread


def test_fit_finds_the_one_file_or_lists_the_candidates(extract, cli, home, tiny_gpt2):
    code, _, a = extract("--limit", "200")
    r = cli("-q", "fit", "--task", "digits", "--backbone", str(tiny_gpt2), "--head", "ridge", "--depths", "0")
    assert r.exit_code == 0, r.output
    extract("--limit", "200", "--seed", "1")
    r = cli("fit", "--task", "digits", "--backbone", str(tiny_gpt2))
    assert (
        r.exit_code == 1
        and "2 feature files match task 'digits'" in r.output
        and "pass --features" in r.output
    )
    assert "seed 0" in r.output and "seed 1" in r.output and "or --extract-seed to choose" in r.output


def test_a_too_small_split_is_refused_naming_limit(extract, cli, home):
    code, _, path = extract("--limit", "30")
    r = cli("fit", "--features", str(path))
    assert (
        r.exit_code == 1
        and "leaves 3 for validation and 27 to train on, fewer than one per class for validation" in r.output
    )
    assert "extract the features again with --limit 91 or more (now 30)" in r.output


def test_flipped_bytes_in_a_feature_chunk_fail_loudly(extract, cli, home):
    code, _, path = extract("--limit", "200")
    with h5py.File(path, "r") as f:
        info = f["train/features"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[info.byte_offset + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    r = cli("fit", "--features", str(path), "--head", "ridge")
    assert r.exit_code == 1 and "cannot be read" in r.output and "the file is corrupt" in r.output


def test_a_task_longer_than_the_backbone_is_refused_up_front(cli, home, tiny_gpt2):
    r = cli(
        "extract",
        "--task",
        "listops",
        "--backbone",
        str(tiny_gpt2),
        "--task-opt",
        "max_len=2000",
        "--task-opt",
        "n_train=4",
        "--task-opt",
        "n_val=1",
        "--task-opt",
        "n_test=1",
    )
    assert r.exit_code == 1 and "up to 2000 tokens" in r.output and "at most 1024 positions" in r.output
    assert "max_len=1024" in r.output and not list(home.rglob("*.h5*"))


def test_untrained_end_to_end_model_equals_the_stored_features(extract, home, tiny_gpt2):
    """The FPT of ``train`` and ``extract`` share one forward path: same seed, same numbers."""
    from reservoir.model.backbones import load_backbone
    from reservoir.tasks import get_task
    from reservoir.train import FPT

    code, _, path = extract("--seed", "7", "--depths", "1,2", "--limit", "40")
    task = get_task("digits")
    d = task.load("train", Path("."), 40, 7)  # the sample the extraction's seed drew
    stored = features(path)
    for col, blocks in enumerate((1, 2)):
        model = FPT(task.spec, load_backbone(str(tiny_gpt2), 7), blocks=blocks, seed=7, dropout=0.1).eval()
        with torch.no_grad():
            h = model.features(torch.from_numpy(task.encode(d.inputs)), torch.from_numpy(d.lengths))
        np.testing.assert_allclose(h.numpy(), stored[:, col], atol=1e-5, rtol=1e-5)


def test_identity_digest_is_stable_and_order_free():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2}) and len(digest({"a": 1})) == 10


def test_a_second_writer_is_refused_and_a_dead_holder_releases_the_lock(extract, home, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from reservoir.extract.store import WriterLock

    out = tmp_path / "f.h5"
    holder = WriterLock(out)
    code, output, _ = extract("--out", str(out))
    assert code == 1 and f"{out} is being written by pid {os.getpid()}" in output
    assert not out.exists() and not out.with_name("f.h5.partial").exists()
    holder.release()
    # a holder killed with SIGKILL leaves the lock file behind, but not the lock
    script = f"from reservoir.extract.store import WriterLock; import time; WriterLock({str(out)!r}); print('locked', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    code, output, _ = extract("--out", str(out))
    assert code == 1 and f"being written by pid {proc.pid}" in output
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    code, output, path = extract("--out", str(out))
    assert code == 0 and path == out and not out.with_name("f.h5.lock").exists()


@pytest.mark.parametrize("task", ["mnist", "cifar10", "cifar10_lra", "remote_homology"])
def test_how_data_is_fetched_is_not_what_it_is(task):
    """``download=false`` reads the same data as the default: one identity, so that one feature file serves
    both, and fit's ``--task-opt download=false`` picks the file extracted without it."""
    from reservoir.probe.fit import extraction_mismatch
    from reservoir.tasks import get_task

    default, offline = get_task(task), get_task(task, download="false")
    assert offline.download is False and offline.identity_options() == default.identity_options()
    recorded = {"task_options": default.identity_options()}
    assert extraction_mismatch(recorded, {"task_options": {"download": False}}) is None
    assert extraction_mismatch(recorded, {"task_options": {"nope": 1}}) == "task option nope=None"


def test_the_matched_input_scale_records_the_std_it_read(extract, home, tmp_path):
    """Two folders alike but for their token embedding (dropped before the fingerprint): ``--input-scale
    matched`` reads another std from each, so each file records its std, and a folder saved again with another
    embedding never reuses the file of the first; the paper's scale reads no embedding and records none."""
    from transformers import GPT2Model

    a = save_tiny_gpt2(tmp_path / "a")
    model = GPT2Model.from_pretrained(a)
    with torch.no_grad():
        model.wte.weight.mul_(10)
    model.save_pretrained(tmp_path / "b")
    files = {}
    for name in ("a", "b"):
        code, out, files[name] = extract("--input-scale", "matched", backbone=str(tmp_path / name))
        assert code == 0, out
    stds = [identity_of(files[n])["matched_std"] for n in ("a", "b")]
    assert files["a"] != files["b"] and stds[1] == pytest.approx(10 * stds[0], rel=1e-4)
    assert "matched_std" not in identity_of(extract(backbone=str(tmp_path / "a"))[2])
    model.wte.weight.data.div_(10)  # folder a's embedding saved over folder b: b's matched file is not reused
    model.save_pretrained(tmp_path / "b")
    code, out, again = extract("--input-scale", "matched", backbone=str(tmp_path / "b"))
    assert code == 0 and again != files["b"] and identity_of(again)["matched_std"] == pytest.approx(stds[0])
