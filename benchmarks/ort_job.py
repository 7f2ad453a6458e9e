"""The int8 extraction job a practitioner writes with ONNX Runtime, whole: the peer of ``reservoir extract``'s job.

    python benchmarks/ort_job.py --rows 4000 --out DIR [--data-dir DATA | --npz FILE] [--threads 2] [--layers 12]

It reads MNIST's first ``--rows`` training images as 64 patches of 16 values (through reservoir's own
loader, as ``--task mnist`` reads them; ``--npz`` reads a ``file:`` task's rows instead), builds the
GPT-2-small-shaped model with ``gpt2-random``'s seeded weights behind the same seeded input layer
(``peers.Setup``), exports it to ONNX, quantizes it with ONNX Runtime's ``quantize_dynamic`` (QInt8
weights, ORT's defaults), runs the rows through an ONNX Runtime session ``--batch`` rows at a time,
and writes every depth's last-token features to an HDF5 file, as ``reservoir extract`` writes its
own. ``benchmarks/extract.py``'s ``e2e-ort-int8-N`` row runs it in a subprocess and times the whole
process: imports, export, quantization, the batches and the writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def rows_of_mnist(rows: int, data_dir: Path | None, seed: int) -> np.ndarray:
    from reservoir.paths import default_data_dir
    from reservoir.tasks import make_task

    task = make_task("mnist", {}, seed)
    split = task.load("train", data_dir or default_data_dir(), limit=rows)
    return np.asarray(task.encode(split.inputs), dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--out", type=Path, required=True, help="a folder for the model files and the features")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--npz", type=Path, default=None, help="read x_train of this file instead of MNIST")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import h5py
    import torch
    from peers import Setup

    from reservoir.runtime.onnx import quantize_int8, session

    args.out.mkdir(parents=True, exist_ok=True)
    if args.npz is not None:  # the rows `reservoir extract --task file:NPZ` reads
        with np.load(args.npz) as f:
            tokens = np.asarray(f["x_train"][: args.rows], dtype=np.float32)
    else:
        tokens = rows_of_mnist(args.rows, args.data_dir, args.seed)
    shape = dict(n_layer=args.layers, n_head=12, n_embd=768)
    setup = Setup(
        shape, args.seed, tokens.shape[1], 16, args.batch, torch.device("cpu"), args.threads, args.out
    )
    setup.tokens = tokens[: max(args.batch, 16)]  # the export's example rows: the job's own
    int8 = args.out / "readout-int8.onnx"
    quantize_int8(setup.onnx_path, int8, args.out, op_types=None)  # ORT's defaults, as a user would run it
    run = session(int8, args.threads)
    with h5py.File(args.out / "features.h5", "w") as f:
        out = f.create_dataset("features", (len(tokens), args.layers + 1, 768), dtype="float32")
        for i in range(0, len(tokens), args.batch):
            out[i : i + args.batch] = run.run(None, {"tokens": tokens[i : i + args.batch]})[0]
    print(f"{len(tokens)} rows -> {args.out / 'features.h5'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
