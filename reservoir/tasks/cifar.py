"""CIFAR-10 from the official python batches: RGB patches (FPT) and grayscale pixels (LRA).

Where the data is looked for, in order:

1. ``DATA_DIR/cifar10/cifar-10-batches-py/`` (where ``reservoir data fetch cifar10`` unpacks it),
2. ``DATA_DIR/cifar-10-batches-py/`` (where torchvision and ``make_cifar_batches.py DATA_DIR`` put it),
3. the official archive ``DATA_DIR/cifar10/cifar-10-python.tar.gz`` (size and md5 checked, then unpacked),
4. a download of that archive when the network allows (``--task-opt download=false`` to never try).

A folder in the official layout (``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``:
pickled dicts with ``b'data'`` uint8 ``(N, 3072)`` channel-major rows and ``b'labels'``) is accepted
without the archive checksum (``reservoir data verify cifar10`` compares each file with the official
one). The pickles are read by :mod:`reservoir.tasks.pickles`, which refuses any that could run code.

``cifar10``: each 32x32x3 image is cut into 4x4 patches, a patch flattened row-major with the
channel innermost (the FPT code's ``b c (h p1) (w p2) -> b (h w) (p1 p2 c)``): 64 tokens of 48.
Values are normalized per channel with the FPT code's mean (0.4914, 0.4822, 0.4465) and std
(0.2023, 0.1994, 0.2010); ``normalize=false`` gives ``x / 255`` instead.

Both tasks augment the images end-to-end training steps on (``reservoir train --augment``, the default) as the FPT
code does (its ``data_aug=True``): a 32x32 crop of the image padded by 4 black pixels a side, a horizontal flip
with probability 1/2, then a rotation by an angle drawn uniformly in [-20, 20] degrees about the image's centre,
nearest pixel, black outside (torchvision's ``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()`` and
``RandomRotation(20)``). Features for a linear head, validation and test images are never augmented.

``cifar10_lra``: grayscale as the Long Range Arena computes it (``tf.image.rgb_to_grayscale`` on uint8
images: luma ``0.2989 R + 0.5870 G + 0.1140 B`` of ``[0, 1]`` floats, back to uint8 times 255.5,
truncated). One pixel a token: 1024 tokens of 1, valued ``(g / 255 - 0.5) / 0.5`` as the FPT code
normalizes its grayscale CIFAR (``normalize=false``: ``g / 255``). ``lra_split=true`` makes val the last
10% of the training batches, as LRA's ``train[90%:]`` (a rebuilt copy of the batches may be shuffled).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reservoir.errors import unreadable
from reservoir.settings import Divides, setting
from reservoir.tasks import DataError, SplitData, Task, TaskSpec, patches, pickles, register_task
from reservoir.tasks.download import DataArchive, ensure_archive

FOLDER = "cifar10"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
OFFICIAL_MD5 = {  # of the files inside the official archive
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
ARCHIVE = DataArchive(
    name="cifar-10-python.tar.gz",
    md5="c58f30108f718f92721af3b95e74349a",
    urls=("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    contents="cifar-10-batches-py",
    members=(*TRAIN_FILES, *TEST_FILES, "batches.meta"),
    size=170498071,
)
FPT_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
FPT_STD = np.array([0.2023, 0.1994, 0.2010], dtype=np.float32)
LUMA = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
LRA_VAL_FRACTION = 0.1
#: CIFAR-10's class names by id (``label_names`` of its ``batches.meta``)
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def look_in(data_dir: Path) -> list[Path]:
    """Folders searched for the unpacked batches, in order."""
    return [Path(data_dir) / FOLDER / ARCHIVE.contents, Path(data_dir) / ARCHIVE.contents]


def batches_folder(data_dir: Path, task: str, download: bool = True) -> Path:
    return ensure_archive(Path(data_dir) / FOLDER, ARCHIVE, task, download, look_in(data_dir)[1:])


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One python batch -> images ``(N, 32, 32, 3)`` uint8 and labels ``(N,)`` int64."""
    fix = "delete the folder and run `reservoir data fetch cifar10`, or rebuild it"
    try:
        batch = pickles.loads(Path(path).read_bytes(), path, "a CIFAR-10 batch", fix, encoding="bytes")
    except FileNotFoundError:
        raise DataError(f"{path} is missing; {fix}") from None
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError) as e:
        raise unreadable(path, e, fix) from None
    if not isinstance(batch, dict):
        raise DataError(f"{path} holds a {type(batch).__name__}, not a CIFAR-10 batch dict; {fix}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DataError(f"{path} has keys {sorted(batch)}, not b'data' and b'labels'; {fix}")
    data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072); {fix}")
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {labels.size} labels for {len(data)} images; {fix}")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        bad = int(np.flatnonzero((labels < 0) | (labels > 9))[0])
        raise DataError(f"{path}: label {labels[bad]} of image {bad} is outside 0..9; {fix}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.astype(np.int64)


def read_rows(folder: Path, files: tuple[str, ...], start: int = 0, stop: int | None = None):
    """Rows ``start:stop`` of the concatenation of ``files``, reading no file past ``stop``."""
    images, labels, seen = [], [], 0
    for name in files:
        if stop is not None and seen >= stop:
            break
        x, y = read_batch(folder / name)
        lo, hi = max(start - seen, 0), len(y) if stop is None else min(stop - seen, len(y))
        if hi > lo:
            images.append(x[lo:hi])
            labels.append(y[lo:hi])
        seen += len(y)
    if not images:
        return np.zeros((0, 32, 32, 3), np.uint8), np.zeros(0, np.int64)
    return np.concatenate(images), np.concatenate(labels)


def grayscale(images: np.ndarray) -> np.ndarray:
    """``(..., 3)`` uint8 RGB -> ``(...)`` uint8 luma, exactly as ``tf.image.rgb_to_grayscale``."""
    x = images.astype(np.float32) * np.float32(1.0 / 255)
    gray = x @ LUMA
    return (gray * np.float32(255.5)).astype(np.uint8)


def augment_images(
    images: np.ndarray, rng: np.random.Generator, pad: int = 4, degrees: float = 20.0
) -> np.ndarray:
    """Images ``(N, H, W)`` or ``(N, H, W, C)``, each cropped from a copy padded by ``pad`` zero pixels a side, flipped
    left to right with probability 1/2 and rotated by an angle uniform in ``[-degrees, degrees]`` (:func:`transform`):
    the FPT code's CIFAR augmentation (module docstring), one draw per image."""
    n = len(images)
    shift = rng.integers(-pad, pad + 1, size=(n, 2))
    flip = rng.random(n) < 0.5
    return transform(images, shift, flip, rng.uniform(-degrees, degrees, size=n))


def transform(images: np.ndarray, shift: np.ndarray, flip: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """Each image ``(H, W[, C])`` moved by ``shift`` ``(dy, dx)`` pixels (a crop of a zero-padded copy: pixel ``(i,
    j)`` shows ``(i + dy, j + dx)``), flipped left to right where ``flip``, then rotated by ``degrees`` about its
    centre (counter-clockwise as displayed, as torchvision's), nearest pixel, zero where nothing shows."""
    n, h, w = images.shape[:3]
    angle = np.deg2rad(np.asarray(degrees, np.float64))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    cy, cx = (h - 1) / 2, (w - 1) / 2
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    # each output pixel of the rotated image, back to the flipped and cropped one it shows, then to the image
    sx = cos * (x - cx) - sin * (y - cy) + cx
    sy = sin * (x - cx) + cos * (y - cy) + cy
    sx = np.where(np.asarray(flip)[:, None, None], w - 1 - sx, sx)
    sy = np.rint(sy).astype(np.int64) + shift[:, :1, None]
    sx = np.rint(sx).astype(np.int64) + shift[:, 1:, None]
    inside = (sy >= 0) & (sy < h) & (sx >= 0) & (sx < w)
    out = images[np.arange(n)[:, None, None], np.clip(sy, 0, h - 1), np.clip(sx, 0, w - 1)]
    inside = inside.reshape(inside.shape + (1,) * (images.ndim - 3))
    return np.where(inside, out, 0).astype(images.dtype)


@dataclass
class _Cifar(Task):
    normalize: bool = True
    download: bool = True

    augmentation = (
        "a crop of the image padded by 4 pixels, a horizontal flip and a rotation of up to 20 degrees"
    )

    def augment(self, inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return augment_images(inputs, rng)

    @property
    def class_names(self) -> list[str]:
        return list(CLASS_NAMES)

    def _images(self, split: str, data_dir: Path, n: int | None) -> tuple[np.ndarray, np.ndarray]:
        self.check_split(split)
        folder = batches_folder(data_dir, self.name, self.download)
        if split == "test":
            return read_rows(folder, TEST_FILES, 0, n)
        if "val" not in self.spec.splits:
            return read_rows(folder, TRAIN_FILES, 0, n)
        x, y = read_rows(folder, TRAIN_FILES)  # LRA split: needs the train total
        cut = len(y) - int(round(LRA_VAL_FRACTION * len(y)))
        x, y = (x[:cut], y[:cut]) if split == "train" else (x[cut:], y[cut:])
        return x[:n], y[:n]


@register_task("cifar10")
@dataclass
class Cifar10(_Cifar):
    """CIFAR-10 (official python batches), 4x4 RGB patches: 64 tokens of 48, 10 classes."""

    patch: int = setting(4, Divides(32))

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            self.name, "dense", seq_len=(32 // self.patch) ** 2, token_dim=3 * self.patch**2, n_classes=10
        )

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        x, y = self._images(split, data_dir, n)
        return SplitData(x, y, np.full(len(y), self.spec.seq_len))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        x = inputs.astype(np.float32) * np.float32(1.0 / 255)
        if self.normalize:
            x = (x - FPT_MEAN) / FPT_STD
        return patches(x, self.patch).astype(np.float32)


@register_task("cifar10_lra")
@dataclass
class Cifar10LRA(_Cifar):
    """CIFAR-10 in LRA grayscale, one pixel a token: 1024 tokens of 1, 10 classes."""

    lra_split: bool = False

    @property
    def spec(self) -> TaskSpec:
        splits = ("train", "val", "test") if self.lra_split else ("train", "test")
        return TaskSpec(self.name, "dense", seq_len=1024, token_dim=1, n_classes=10, splits=splits)

    def read(self, split: str, data_dir: Path, n: int | None = None) -> SplitData:
        x, y = self._images(split, data_dir, n)
        return SplitData(grayscale(x), y, np.full(len(y), 1024))

    def encode(self, inputs: np.ndarray) -> np.ndarray:
        x = inputs.reshape(len(inputs), 1024, 1).astype(np.float32) * np.float32(1.0 / 255)
        return (x - 0.5) / 0.5 if self.normalize else x
