"""Image tasks: MNIST (official IDX files) and scikit-learn's bundled 8x8 digits.

Images are kept as uint8 and cut into patches per batch. MNIST is padded from 28x28 to
32x32 (2 pixels each side) and cut into 4x4 patches: 64 tokens of 16 values in [0, 1].
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reservoir.errors import unreadable
from reservoir.settings import Divides, Interval, setting
from reservoir.tasks import MAX_SEED, DataError, SplitData, Task, TaskSpec, patches, register_task
from reservoir.tasks.download import DataFile, ensure_files

MNIST_URLS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
MNIST_FILES = {  # md5 of the uncompressed IDX files (official)
    "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}
MNIST_DATA = tuple(
    DataFile(n, md5, tuple(u + n for u in MNIST_URLS), gunzip_md5=True) for n, md5 in MNIST_FILES.items()
)


#: what to do with an MNIST file that cannot be read
MNIST_FIX = "delete it and fetch it again (reservoir data fetch mnist, with the same --data-dir)"


def read_idx(path: Path, header: int, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of ``shape`` of a gzipped MNIST IDX file of uint8 (``header`` bytes: the magic number and
    the sizes); DataError naming the file when it is not one, or unreadable."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except gzip.BadGzipFile:
        raise DataError(f"{path} is not an MNIST IDX file (it is not gzip-compressed); {MNIST_FIX}") from None
    except (OSError, EOFError) as e:
        raise unreadable(path, e, MNIST_FIX) from None
    magic = b"\0\0\x08" + bytes([1 + len(shape)])
    sizes = [int.from_bytes(raw[i : i + 4], "big") for i in range(8, header, 4)]
    if len(raw) < header or raw[:4] != magic or tuple(sizes) != shape:
        what = "x".join(map(str, shape)) + " uint8 images" if shape else "uint8 labels"
        raise DataError(
            f"{path} is not an MNIST IDX file (it does not start with the IDX header of {what}); {MNIST_FIX}"
        )
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    n = len(data) // int(np.prod(shape))
    if n * int(np.prod(shape)) != len(data):
        raise DataError(f"{path} has {len(data)} bytes of data, not a multiple of {shape}; {MNIST_FIX}")
    return data.reshape(n, *shape)


@register_task("mnist")
@dataclass
class Mnist(Task):
    """MNIST digits, 28x28 padded to 32x32, 4x4 patches: 64 tokens of 16."""

    patch: int = setting(4, Divides(32))
    download: bool = True

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name, "dense", seq_len=(32 // self.patch) ** 2, token_dim=self.patch**2, n_classes=10
        )

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        paths = dict(
            zip(MNIST_FILES, ensure_files(Path(data_dir) / "mnist", MNIST_DATA, self.name, self.download))
        )
        prefix = "train" if split == "train" else "t10k"
        images = read_idx(paths[f"{prefix}-images-idx3-ubyte.gz"], 16, (28, 28))
        labels = read_idx(paths[f"{prefix}-labels-idx1-ubyte.gz"], 8, ()).astype(np.int64)
        if len(images) != len(labels):
            raise DataError(
                f"{prefix} images ({len(images)}) and labels ({len(labels)}) in {data_dir}/mnist disagree"
            )
        n = min(n or len(labels), len(labels))
        return SplitData(images[:n], labels[:n], np.full(n, self.spec.seq_len))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        padded = np.pad(inputs, ((0, 0), (2, 2), (2, 2)))[..., None]
        return patches(padded, self.patch).astype(np.float32) / 255.0


@register_task("digits")
@dataclass
class Digits(Task):
    """scikit-learn's bundled 8x8 handwritten digits (1,797), 2x2 patches: 16 tokens of 4."""

    test_size: float = setting(0.2, Interval(0.01, 0.99))
    seed: int = setting(0, Interval(0, MAX_SEED))

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(self.name, "dense", seq_len=16, token_dim=4, n_classes=10)

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        self.check_split(split)
        x, y = self.splits[split]
        n = min(n or len(y), len(y))
        return SplitData(x[:n], y[:n].astype(np.int64), np.full(n, 16))

    @functools.cached_property
    def splits(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The stratified train/test split of scikit-learn's digits, kept in the reservoir cache once made
        (:func:`reservoir.paths.cache_dir`) so that a later run need not import scikit-learn."""
        from reservoir.paths import cache_dir

        kept = cache_dir() / "digits" / f"split-{self.test_size!r}-{self.seed}.npz"
        if kept.exists():
            import zipfile

            try:
                with np.load(kept) as f:
                    return {s: (f[f"x_{s}"], f[f"y_{s}"]) for s in ("train", "test")}
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # damaged: made again below
                pass
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        images = d.images.astype(np.uint8)  # values 0..16
        x_train, x_test, y_train, y_test = train_test_split(
            images, d.target, test_size=self.test_size, random_state=self.seed, stratify=d.target
        )
        part = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "wb") as f:
                np.savez(f, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
            os.replace(part, kept)
        except OSError:  # a read-only or full cache: made again next time
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)
        return {"train": (x_train, y_train), "test": (x_test, y_test)}

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        return patches(inputs[..., None], 2).astype(np.float32) / 16.0
