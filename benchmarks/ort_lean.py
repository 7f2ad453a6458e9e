"""The int8 extraction job a practitioner writes in about 30 lines, whole: ONNX Runtime, no reservoir.

    python benchmarks/ort_lean.py --data-dir DATA --rows 6000 --out DIR [--threads 2]

Nothing of ``reservoir`` is imported: the script reads MNIST's first ``--rows`` training images from the
official IDX file, cuts each (padded to 32 x 32) into 64 patches of 16 values in [0, 1], projects them with
a seeded linear layer to GPT-2 small's width, exports a randomly initialised Hugging Face ``GPT2Model`` with
``output_hidden_states`` to ONNX (``torch.onnx.export``), quantizes it with ONNX Runtime's
``quantize_dynamic`` (QInt8 weights), runs the rows through one ONNX Runtime session ``--batch`` rows at a
time, and writes every depth's last-token state to an HDF5 file. It prints one JSON line, ``PHASES {...}``:
the seconds of its imports, the export, the quantization, the batches (the session's runs) and the writes.
``benchmarks/lean_job.py`` times it beside ``reservoir extract``.
"""

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

began = time.perf_counter()
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: E402
from transformers import GPT2Config, GPT2Model  # noqa: E402

imported = time.perf_counter()


def mnist_tokens(folder: Path, rows: int) -> np.ndarray:
    with gzip.open(folder / "train-images-idx3-ubyte.gz", "rb") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:rows]
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2))).astype(np.float32) / 255.0
    patches = padded.reshape(-1, 8, 4, 8, 4).transpose(0, 1, 3, 2, 4).reshape(-1, 64, 16)
    return np.ascontiguousarray(patches)


class Embedded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.project = torch.nn.Linear(16, 768)
        self.gpt2 = GPT2Model(GPT2Config(n_layer=12, n_head=12, n_embd=768)).eval()

    def forward(self, tokens):
        states = self.gpt2(inputs_embeds=self.project(tokens), output_hidden_states=True).hidden_states
        return torch.stack([h[:, -1] for h in states], dim=1)  # (rows, 13, 768)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True, help="a folder holding mnist/")
    p.add_argument("--rows", type=int, default=6000)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    tokens = mnist_tokens(args.data_dir / "mnist", args.rows)
    start = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            Embedded(),
            (torch.from_numpy(tokens[:2]),),
            str(args.out / "model.onnx"),
            input_names=["tokens"],
            output_names=["states"],
            dynamic_axes={"tokens": {0: "rows"}, "states": {0: "rows"}},
            dynamo=False,
        )
    exported = time.perf_counter()
    quantize_dynamic(args.out / "model.onnx", args.out / "model-int8.onnx", weight_type=QuantType.QInt8)
    quantized = time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(
        str(args.out / "model-int8.onnx"), options, providers=["CPUExecutionProvider"]
    )
    batches = writes = 0.0
    with h5py.File(args.out / "features.h5", "w") as f:
        out = f.create_dataset("features", (len(tokens), 13, 768), dtype="float32")
        for i in range(0, len(tokens), args.batch):
            t = time.perf_counter()
            states = session.run(None, {"tokens": tokens[i : i + args.batch]})[0]
            t2 = time.perf_counter()
            out[i : i + args.batch] = states
            batches, writes = batches + t2 - t, writes + time.perf_counter() - t2
    done = time.perf_counter()
    phases = {
        "imports": imported - began,
        "data": start - imported,
        "export": exported - start,
        "quantize": quantized - exported,
        "batches": batches,
        "writes": writes,
        "session and closing": done - quantized - batches - writes,
    }
    print("PHASES " + json.dumps(phases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
