"""OpenVINO on the CPU: a batch on one stream of all threads against the batch split between two streams.

    .venv/bin/python benchmarks/ov_streams.py --dtype int8 --reps 6

GPT-2 small's random twin (every depth), MNIST-shaped rows (256 x 64 tokens of 16 values), converted by
the OpenVINO engine as ``reservoir extract`` converts it (``--dtype int8``: centred on 64 calibration
rows, int8 weights, dynamic int8 activations); the converted graph is then compiled twice, for one stream
of ``--threads`` threads (a latency hint, the batch whole) and for two streams (a throughput hint, the
batch split in halves, both run at once), and the two are timed alternately. Printed: the largest
difference between their features, each repetition's tokens/s and the medians' ratio, with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout  # noqa: E402, F401  (the checkout's reservoir first on sys.path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="int8", choices=["int8", "bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=6)
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from reservoir.model.backbones import load_backbone
    from reservoir.runtime.engines import DYNAMIC_GROUP, import_openvino, precision
    from reservoir.runtime.runner import FeatureRunner
    from reservoir.tasks import TaskSpec

    ov = import_openvino()

    torch.set_num_threads(args.threads)
    spec = TaskSpec(name="mnist-like", token_kind="dense", seq_len=64, n_classes=10, token_dim=16)
    x, n = np.random.default_rng(0).random((256, 64, 16), dtype=np.float32), np.full(256, 64)
    runner = FeatureRunner.build(
        spec,
        load_backbone("gpt2-random"),
        list(range(13)),
        seed=0,
        dtype=args.dtype,
        engine="openvino",
        calibration=lambda: [(x[:64], n[:64])],
    )
    runner(x, n)  # converts
    forward = runner.forward
    arrays = [np.ascontiguousarray(t.numpy()) for t in forward._widen(runner.prepare(x, n)[:3])]
    props = ov.properties

    def compiled(streams: int, rows: int):
        model = forward.model.clone()
        model.reshape({p: ov.PartialShape([rows, *a.shape[1:]]) for p, a in zip(model.inputs, arrays)})
        config = {
            props.inference_num_threads: args.threads,
            props.hint.inference_precision: precision(args.dtype),
        }
        if args.dtype == "int8":
            config[props.hint.dynamic_quantization_group_size] = str(DYNAMIC_GROUP)
        mode = props.hint.PerformanceMode
        config[props.hint.performance_mode] = mode.THROUGHPUT if streams > 1 else mode.LATENCY
        if streams > 1:
            config[props.num_streams] = streams
        return ov.Core().compile_model(model, "CPU", config)

    one = compiled(1, 256).create_infer_request()
    two = compiled(2, 128)
    requests = [two.create_infer_request() for _ in range(2)]
    halves = [[a[:128] for a in arrays], [a[128:] for a in arrays]]

    def whole():
        one.infer(dict(enumerate(arrays)))
        return one.get_output_tensor(0).data.copy()

    def split():
        for r, h in zip(requests, halves):
            r.start_async(dict(enumerate(h)))
        for r in requests:
            r.wait()
        return np.concatenate([r.get_output_tensor(0).data.copy() for r in requests])

    load = os.getloadavg()[0]
    print(f"largest difference between the two: {float(np.abs(whole() - split()).max()):.2g}")
    rates: dict[str, list[float]] = {"one stream": [], "two streams": []}
    for _ in range(args.reps):
        for name, run in (("one stream", whole), ("two streams", split)):
            start = time.perf_counter()
            for _ in range(3):
                run()
            rates[name].append(3 * 256 * 64 / (time.perf_counter() - start))
    for name, r in rates.items():
        print(
            f"{name}: "
            + ", ".join(f"{v:,.0f}" for v in r)
            + f" tokens/s (median {statistics.median(r):,.0f})"
        )
    ratio = statistics.median(rates["two streams"]) / statistics.median(rates["one stream"])
    print(
        f"two streams / one: {ratio:.3f}; {args.dtype}, {args.threads} threads, load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
