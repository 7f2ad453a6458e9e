"""Devices: an absent device is a clear exit 1; ``cpu`` and ``auto`` give identical files on a CPU machine;
the CUDA path's decisions (bf16 only where native, strict float32, the reused pinned buffers, compile
records by device) checked here with the CUDA queries stood in for, so they run on every machine
(tests/system/test_cuda.py runs the real thing on a GPU)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.errors import DeviceError
from reservoir.model.devices import resolve_device
from reservoir.runtime import dtypes
from reservoir.runtime.runner import Pending, PinnedPool, resolve


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine as one with a single CUDA card of compute capability ``capability[0]`` (a list to change)."""
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: True
    )  # emulation counts
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return capability


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_absent_cuda_exits_1_naming_what_was_found(cli, home, name):
    for command in (
        ("extract", "--task", "digits", "--backbone", "lstm", "--limit", "4"),
        ("train", "--task", "bit_xor", "--backbone", "lstm", "--steps", "1"),
    ):
        r = cli(*command, "--device", name)
        assert r.exit_code == 1 and f"--device {name}: this machine has 0 CUDA device(s)" in r.output
        assert "use --device cpu" in r.output and "Traceback" not in r.output
    assert not list(home.rglob("*.h5*"))
    with pytest.raises(DeviceError):
        resolve_device(name)


def test_malformed_device_is_a_usage_error(cli, home):
    r = cli("extract", "--task", "digits", "--device", "gpu0")
    assert r.exit_code == 2 and (
        "The 'device' parameter of extract must be auto, cpu, cuda, cuda:N or mps. Got 'gpu0' instead."
        in r.output
    )


@pytest.mark.usefixtures("no_cuda")
def test_cpu_and_auto_give_identical_files(cli, home, tiny_gpt2):
    paths = []
    for device in ("cpu", "auto"):
        out = home / f"{device}.h5"
        r = cli(
            "-q",
            "extract",
            "--task",
            "digits",
            "--backbone",
            str(tiny_gpt2),
            "--limit",
            "24",
            "--dtype",
            "float32",
            "--device",
            device,
            "--out",
            str(out),
        )
        assert r.exit_code == 0, r.output
        paths.append(Path(r.stdout.strip()))
    assert resolve_device("auto") == torch.device("cpu")
    with h5py.File(paths[0]) as a, h5py.File(paths[1]) as b:
        assert a.attrs["identity"] == b.attrs["identity"]
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


@pytest.mark.usefixtures("no_cuda")
def test_the_torch_head_on_an_absent_device_exits_1(cli, home, tiny_gpt2):
    r = cli("-q", "extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "200")
    assert r.exit_code == 0, r.output
    r = cli("fit", "--features", r.stdout.strip(), "--head", "torch", "--depths", "1", "--device", "cuda")
    assert r.exit_code == 1 and "--device cuda: this machine has 0 CUDA device(s)" in r.output
    r = cli("-q", "fit", "--task", "digits", "--head", "torch", "--depths", "1", "--device", "cpu")
    assert r.exit_code == 0, r.output


def test_a_second_gpu_on_a_one_gpu_machine_exits_1_naming_the_card(cli, home, one_gpu):
    with pytest.raises(
        DeviceError, match=r"--device cuda:1: this machine has 1 CUDA device\(s\) \(cuda:0 Test GPU"
    ):
        resolve_device("cuda:1")
    r = cli("extract", "--task", "digits", "--backbone", "lstm", "--limit", "4", "--device", "cuda:1")
    assert r.exit_code == 1 and "use --device cuda:0, cuda (the first), or cpu" in r.output
    assert "Traceback" not in r.output and not list(home.rglob("*.h5*"))
    assert resolve_device("cuda:0") == torch.device("cuda:0")


@pytest.mark.parametrize(
    "capability, auto", [((7, 5), "float32"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")]
)
def test_auto_takes_bf16_on_cuda_only_where_native(one_gpu, capability, auto):
    """torch's is_bf16_supported() says yes on a 7.5 card too (emulated, slower than float32): auto must not."""
    one_gpu[0] = capability
    dtype, why = dtypes.choose("cuda")
    assert (
        dtype == auto and "Test GPU" in why and f"compute capability {capability[0]}.{capability[1]}" in why
    )
    assert dtypes.choose("cuda", allowed=("float32",))[0] == "float32"


def test_native_bf16_asks_torch_without_emulation(one_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert not dtypes.cuda_bf16_native("cuda:0")  # a capable card whose torch says bf16 is only emulated


def test_strict_float32_turns_tf32_off():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        dtypes.strict_float32()
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class Event:
    """A stand-in CUDA event: complete or not."""

    def __init__(self, complete: bool = True):
        self.complete = complete

    def query(self) -> bool:
        return self.complete

    def synchronize(self) -> None:
        self.complete = True


def test_the_pinned_pool_lends_a_buffer_again_only_once_its_copy_is_done():
    pool = PinnedPool(pin=False, keep=2)
    a = pool.take((4, 3), torch.float32)
    pool.give(a)
    b = pool.take((3, 3), torch.float32)  # fewer rows: the same buffer, viewed
    assert b.shape == (3, 3) and b.data_ptr() == a.data_ptr() and pool.allocated == 1
    busy = Event(complete=False)
    pool.give(b, busy)
    c = pool.take((4, 3), torch.float32)  # its copy is still running: another buffer
    assert c.data_ptr() != a.data_ptr() and pool.allocated == 2
    busy.complete = True
    assert pool.take((2, 3), torch.float32).data_ptr() == a.data_ptr()
    assert pool.take((5, 3), torch.float32).shape == (5, 3) and pool.allocated == 3  # more rows: a new one
    assert pool.take((4, 2), torch.float32).shape == (4, 2)  # another row shape: its own buffers
    pool.give(c)
    pool.give(c)  # given back twice: kept once
    assert sum(len(v) for v in pool.free.values()) == 1


def test_the_pool_keeps_at_most_keep_free_buffers():
    pool = PinnedPool(pin=False, keep=2)
    lent = [pool.take((2, 2), torch.int64) for _ in range(5)]
    for t in lent:
        pool.give(t)
    assert len(pool.free[((2,), torch.int64)]) == 2 and not pool.lent


def test_resolve_copies_the_features_out_and_returns_the_buffer():
    pool = PinnedPool(pin=False)
    host = pool.copy_in(np.arange(6, dtype=np.float32).reshape(2, 3))
    done = Event(complete=False)
    out = resolve(Pending(host, done, pool))
    assert done.complete and not pool.lent
    pool.take((2, 3), torch.float32).fill_(-1)  # lent again and overwritten: the features stay
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_compile_records_are_kept_per_device(one_gpu):
    from reservoir.model.backbones import load_backbone
    from reservoir.runtime.compiling import device_label, shape_key

    assert device_label("cuda:0") == "cuda: Test GPU (sm_90)" and device_label("cpu").startswith("cpu: ")
    esn = load_backbone("esn:units=64")
    keys = {
        shape_key(esn, dtype="float32", device=device_label(d), batch_size=8, widths=[16], depths=[1])
        for d in ("cpu", "cuda:0")
    }
    assert len(keys) == 2


def test_auto_never_compiles_the_generic_adapter(tmp_path):
    """The generic adapter runs the model's own forward read by hooks: no compiling; family adapters compile."""
    from reservoir.extract.run import should_compile
    from reservoir.model.backbones import load_backbone
    from tests.zoo import save_tiny

    generic = load_backbone(str(save_tiny("gpt_neox", tmp_path / "neox")))
    family = load_backbone(str(save_tiny("gpt2", tmp_path / "gpt2")))
    assert not generic.compilable and not should_compile(None, 10**9, generic)
    assert family.compilable and should_compile(None, 10**9, family)


def test_the_cuda_checks_helpers_run_on_the_cpu(tmp_path):
    """tests/system/test_cuda.py's helpers on the CPU: a row's features do not depend on the batch size, and a
    difference beyond the tolerance is named per depth."""
    from tests.system.test_cuda import DENSE, IDS, KINDS, assert_close_per_depth, features, tiny

    for kind in KINDS:
        backbone = tiny(kind, tmp_path)
        for spec in (DENSE, IDS):
            ref = features(backbone, spec, "cpu")
            assert_close_per_depth(features(backbone, spec, "cpu", batch_size=5), ref, 1e-5, kind)
    with pytest.raises(AssertionError, match=r"scaled: relative error per depth \[0\.1"):
        assert_close_per_depth(ref * 1.1, ref, 1e-2, "scaled")
