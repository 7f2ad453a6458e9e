"""The memory capacity task: each window's labels are the inputs before its last step, delays beyond the
washout are refused in words."""

import numpy as np
import pytest

from reservoir.errors import UsageError
from reservoir.tasks import make_task


def test_labels_are_the_inputs_before_the_last_step():
    task = make_task("memory_capacity", {"n_train": 30, "n_val": 5, "n_test": 5, "window": 6, "delays": 9}, 3)
    data = task.read("train", None)
    u = task.series(task.stretches()[1])[0]
    steps = task.last_steps("train")
    assert data.labels.shape == (30, 1, 9) and data.labels.dtype == np.float32
    np.testing.assert_array_equal(data.inputs[:, -1], u[steps].astype(np.float32))
    for k in range(1, 10):
        np.testing.assert_array_equal(data.labels[:, 0, k - 1], u[steps - k].astype(np.float32))
    np.testing.assert_array_equal(data.labels[1:, 0, 0], data.inputs[:-1, -1])  # windows one step apart
    assert -1 <= u.min() < -0.9 and 0.9 < u.max() <= 1


def test_a_washout_shorter_than_the_delays_is_refused_naming_both():
    """Refused with the options, before any data is drawn."""
    with pytest.raises(
        UsageError,
        match=r"'washout' option of memory_capacity must be >= 50 \(delays 50: .*\. Got 20 instead",
    ):
        make_task("memory_capacity", {"delays": 50, "washout": 20}, 0)


def test_a_horizon_which_memory_capacity_does_not_read_is_refused():
    """A forecast's horizon would shift only where validation and test start, not the labels: refused."""
    with pytest.raises(
        UsageError, match=r"'horizon' option of task memory_capacity \(5\) sets how far ahead"
    ):
        make_task("memory_capacity", {"horizon": 5}, 0)
    assert make_task("memory_capacity", {"horizon": 1}, 0).horizon == 1
