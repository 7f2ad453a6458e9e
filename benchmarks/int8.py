"""Int8 backbones on the CPU: tokens/s and feature error per depth against float32 and bf16.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/int8.py [--threads 1] [--batch 64] [--tokens 64]
                                                         [--layers N] [--reps 3] [--only NAME ...]

Runs a GPT-2-small-shaped random backbone (``gpt2-random``; ``--backbone`` for another) over
one batch of random embedded tokens, reading the last token after every block up to
``--layers``, the way ``reservoir extract`` does, and prints for each candidate the
median tokens/s over ``--reps`` calls (warm-up and compilation excluded; the compile time
is printed apart), the mean norm-wise relative error of the features per depth against
float32 eager, and how much a row's features move when the other rows of its batch change
(the project's promise: a feature never depends on which examples shared its batch). Candidates, each skipped with its reason when it cannot run here:

- ``float32`` / ``bfloat16``, eager and ``torch.compile`` (inductor, weight freezing): the
  references (bf16 only where the CPU multiplies it natively: emulated bf16 is ~100x slower).
- ``ao-dynamic``: ``torch.ao.quantization.quantize_dynamic`` (x86 / fbgemm engine, int8
  weights per channel, activations quantized per tensor at run time), eager. Deprecated
  in torch (its authors point to torchao) but still shipped in the torch wheel.
- ``torchao``: torchao's ``quantize_`` with ``Int8DynamicActivationInt8WeightConfig`` (per-row
  weights, per-token activations), compiled, around float32 and around bf16.
- ``pt2e``: torchao's PT2E flow, ``X86InductorQuantizer`` with dynamic quantization, exported
  with ``torch.export``, lowered by inductor to oneDNN int8 linears (VNNI where present).

GPT-2's projections are transformers' ``Conv1D``; every int8 candidate only quantizes
``nn.Linear``, so they are converted first (:func:`conv1d_to_linear`, the same numbers).
A missing library (torchao: ``pip install torchao``) is reported, never fatal. Timings
on a machine shared with other work are noisy: note the load average printed first.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from reservoir.runtime.machine import describe, load


def conv1d_to_linear(model: nn.Module) -> nn.Module:
    """Replace transformers' ``Conv1D`` (``x @ W + b``, ``W`` of shape (in, out)) by the equal
    ``nn.Linear`` (weight ``W.T``) in place, so that int8 quantizers that match ``nn.Linear`` see it."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is Conv1D:
                linear = nn.Linear(
                    child.weight.shape[0],
                    child.weight.shape[1],
                    dtype=child.weight.dtype,
                    device=child.weight.device,
                )
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                setattr(parent, name, linear)
    return model


class Features(nn.Module):
    """The backbone read at every depth in ``depths`` (last token), as float32."""

    def __init__(self, backbone: nn.Module, depths: list[int]):
        super().__init__()
        self.backbone, self.depths = backbone, depths

    def forward(self, x, lengths, readout):
        return self.backbone(x, lengths, self.depths, readout).float()


def median_seconds(fn: Callable, args: tuple, reps: int) -> tuple[float, float]:
    """(seconds of the first call: warm-up and compilation, median seconds of ``reps`` further calls)."""
    with torch.inference_mode():
        start = time.perf_counter()
        fn(*args)
        first = time.perf_counter() - start
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def compiled(model: nn.Module) -> Callable:
    return torch.compile(model, options={"freezing": True})


def candidates(base: nn.Module, args: tuple, bf16: bool) -> dict[str, Callable[[], Callable]]:
    """name -> builder of the callable to time (raises with a reason when it cannot run here)."""
    x, lengths, readout = args

    def cast(dtype):
        def run(model):
            return lambda x_, lengths_, readout_: model(x_.to(dtype), lengths_, readout_)

        return run

    def copy_as(dtype=torch.float32, linear=False):
        model = copy.deepcopy(base).to(dtype)
        return conv1d_to_linear(model) if linear else model

    def need_bf16():
        if not bf16:
            raise RuntimeError("no native bf16 on this CPU (emulated bf16 is ~100x slower than float32)")

    def bf16_eager():
        need_bf16()
        return cast(torch.bfloat16)(copy_as(torch.bfloat16))

    def bf16_compiled():
        need_bf16()
        return cast(torch.bfloat16)(compiled(copy_as(torch.bfloat16)))

    def ao_dynamic():
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        torch.backends.quantized.engine = (
            "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
        )
        return quantize_dynamic(copy_as(linear=True), {nn.Linear: per_channel_dynamic_qconfig})

    def torchao_int8(dtype):
        def build():
            if dtype == torch.bfloat16:
                need_bf16()
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

            model = copy_as(dtype, linear=True)
            quantize_(model, Int8DynamicActivationInt8WeightConfig())
            return cast(dtype)(compiled(model))

        return build

    def pt2e():
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

        torch._inductor.config.freezing = (
            True  # the int8 lowering passes read the global flag, not compile options
        )
        quantizer = xiq.X86InductorQuantizer().set_global(
            xiq.get_default_x86_inductor_quantization_config(is_dynamic=True)
        )
        with torch.no_grad():
            exported = torch.export.export(copy_as(linear=True), args).module()
            prepared = prepare_pt2e(exported, quantizer)
            prepared(*args)  # dynamic: nothing to calibrate, but the flow expects one call
            return compiled(convert_pt2e(prepared))

    return {
        "float32 eager": lambda: copy_as(),
        "float32 compiled": lambda: compiled(copy_as()),
        "bfloat16 eager": bf16_eager,
        "bfloat16 compiled": bf16_compiled,
        "ao-dynamic eager (x86 engine)": ao_dynamic,
        "torchao int8 compiled, float32": torchao_int8(torch.float32),
        "torchao int8 compiled, bf16": torchao_int8(torch.bfloat16),
        "pt2e x86-inductor int8 compiled": pt2e,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=None, help="blocks to run (default: all)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backbone", default="gpt2-random")
    p.add_argument(
        "--only", nargs="*", default=None, help="run only candidates whose name contains one of these"
    )
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(a.threads)

    from reservoir.model.backbones import load_backbone
    from reservoir.model.reservoir import readout_positions
    from reservoir.runtime.machine import bf16_native

    try:
        import torchao

        ao_version = torchao.__version__
    except Exception as e:  # noqa: BLE001 - an optional library: report, never fail
        ao_version = f"not available ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    print(f"cpu: {describe()}")
    print(
        f"torch {torch.__version__}, torchao {ao_version}, quantized engines {torch.backends.quantized.supported_engines}"
    )
    print(f"{load()}; threads {a.threads}")

    backbone = load_backbone(a.backbone).eval()
    for param in backbone.parameters():
        param.requires_grad_(False)
    layers = a.layers or backbone.n_layers
    depths = list(range(layers + 1))
    base = Features(backbone, depths)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.batch, a.tokens, backbone.d_model, generator=g)
    lengths = torch.full((a.batch,), a.tokens)
    args = (x, lengths, readout_positions(lengths, 1))
    n_tokens = a.batch * a.tokens
    print(f"{a.backbone}: {layers} of {backbone.n_layers} blocks, batch {a.batch} x {a.tokens} tokens\n")

    with torch.inference_mode():
        reference = base(*args)
    print(
        "batch dep.: largest relative change of a row's features when the other rows of its batch change\n"
        "(per-tensor activation scales make features depend on batch composition; per-token ones do not)"
    )
    print(
        f"{'candidate':34} {'first s':>8} {'tokens/s':>9} {'x f32':>6} {'batch dep.':>10}  rel. error vs float32 "
        "at depth " + " ".join(f"{d:>6}" for d in depths)
    )
    f32_rate = None
    for name, build in candidates(base, args, bf16_native()).items():
        if a.only and not any(o in name for o in a.only):
            continue
        try:
            fn = build()
            first, seconds = median_seconds(fn, args, a.reps)
            with torch.inference_mode():
                out = fn(*args)
                # same shapes (no recompile), other rows: the second half of the batch 5x larger
                other = fn(torch.cat([x[: a.batch // 2], 5 * x[a.batch // 2 :]]), *args[1:])
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is reported
            print(f"{name:34} skipped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])
            continue
        rate = n_tokens / seconds
        f32_rate = f32_rate or (rate if name == "float32 eager" else None)
        err = ((out - reference).norm(dim=-1) / reference.norm(dim=-1)).mean(dim=(0, 2))
        half = a.batch // 2
        shared = float(((other[:half] - out[:half]).norm(dim=-1) / out[:half].norm(dim=-1)).max())
        ratio = f"{rate / f32_rate:6.2f}" if f32_rate else "     ?"
        print(
            f"{name:34} {first:8.1f} {rate:9.0f} {ratio} {shared:10.1e}  "
            + " ".join(f"{float(e):6.4f}" for e in err),
            flush=True,
        )


if __name__ == "__main__":
    main()
