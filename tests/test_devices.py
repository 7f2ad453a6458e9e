"""Devices: an absent device is a clear exit 1; ``cpu`` and ``auto`` give identical files on a CPU machine."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from reservoir.errors import DeviceError
from reservoir.model.devices import resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_absent_cuda_exits_1_naming_what_was_found(cli, home, name):
    for command in (("extract", "--task", "digits", "--backbone", "lstm", "--limit", "4"),
                    ("train", "--task", "bit_xor", "--backbone", "lstm", "--steps", "1")):
        r = cli(*command, "--device", name)
        assert r.exit_code == 1 and f"--device {name}: this machine has 0 CUDA device(s)" in r.output
        assert "use --device cpu" in r.output and "Traceback" not in r.output
    assert not list(home.rglob("*.h5*"))
    with pytest.raises(DeviceError):
        resolve_device(name)


def test_malformed_device_is_a_usage_error(cli, home):
    r = cli("extract", "--task", "digits", "--device", "gpu0")
    assert r.exit_code == 2 and "device 'gpu0' is not one of auto, cpu, cuda, cuda:N, mps" in r.output


def test_cpu_and_auto_give_identical_files(cli, home, tiny_gpt2):
    paths = []
    for device in ("cpu", "auto"):
        out = home / f"{device}.h5"
        r = cli("-q", "extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "24", "--dtype",
                "float32", "--device", device, "--out", str(out))
        assert r.exit_code == 0, r.output
        paths.append(Path(r.stdout.strip()))
    assert resolve_device("auto") == torch.device("cpu")
    with h5py.File(paths[0]) as a, h5py.File(paths[1]) as b:
        assert a.attrs["identity"] == b.attrs["identity"]
        for split in ("train", "test"):
            np.testing.assert_array_equal(a[split]["features"][:], b[split]["features"][:])


def test_the_torch_head_on_an_absent_device_exits_1(cli, home, tiny_gpt2):
    r = cli("-q", "extract", "--task", "digits", "--backbone", str(tiny_gpt2), "--limit", "200")
    assert r.exit_code == 0, r.output
    r = cli("fit", "--features", r.stdout.strip(), "--head", "torch", "--depths", "1", "--device", "cuda")
    assert r.exit_code == 1 and "--device cuda: this machine has 0 CUDA device(s)" in r.output
    r = cli("-q", "fit", "--task", "digits", "--head", "torch", "--depths", "1", "--device", "cpu")
    assert r.exit_code == 0, r.output
