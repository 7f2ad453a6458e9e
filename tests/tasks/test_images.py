"""The image tasks' own reading: digits' split kept in the data folder."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from reservoir.tasks import make_task


def test_digits_split_is_kept_and_read_back_equal_without_scikit_learn(tmp_path, home):
    task = make_task("digits", {}, 0)
    made = {s: task.read(s, tmp_path) for s in ("train", "test")}
    (kept,) = (home / "cache" / "digits").glob("*.npz")
    assert not list((home / "cache" / "digits").glob("*.partial")) and not (tmp_path / "digits").exists()
    code = (
        "import sys; from pathlib import Path; from reservoir.tasks import make_task; "
        "t = make_task('digits', {}, 0); d = t.read(sys.argv[2], Path(sys.argv[1])); "
        "import numpy as np; np.save(sys.argv[3], d.inputs); "
        "assert 'sklearn' not in sys.modules, 'scikit-learn imported'"
    )
    for split, data in made.items():
        out = tmp_path / f"{split}.npy"
        subprocess.run([sys.executable, "-c", code, str(tmp_path), split, str(out)], check=True)
        np.testing.assert_array_equal(np.load(out), data.inputs)
    other = make_task("digits", {"seed": "1"}, 0).read("train", tmp_path)  # another split seed: its own file
    assert len(list((home / "cache" / "digits").glob("*.npz"))) == 2
    assert not np.array_equal(other.inputs, made["train"].inputs)
    assert len(made["train"].labels) + len(made["test"].labels) == 1797 and kept.stat().st_size > 0


def test_digits_where_the_split_cannot_be_kept_still_reads_and_leaves_no_part(tmp_path, home):
    (home / "cache").mkdir()
    (home / "cache" / "digits").write_text("a file where the folder would go")
    data = make_task("digits", {}, 0).read("train", tmp_path)
    assert len(data.labels) == 1437 and sorted(p.name for p in (home / "cache").iterdir()) == ["digits"]
