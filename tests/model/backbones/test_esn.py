"""The echo state network backbone: its states equal reservoirpy's on the same weights, depth by depth."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from reservoir.errors import UsageError
from reservoir.model.backbones import load_backbone
from reservoir.model.backbones.esn import ESNConfig, parse_name, series_states


def test_states_equal_reservoirpy_on_the_same_weights():
    """A deep ESN (two reservoirs, leak 0.3, bias) against reservoirpy's ``Reservoir`` nodes fed the same
    W, Win and bias: every step's state agrees, for each reservoir reading the one below."""
    pytest.importorskip("reservoirpy")
    from reservoirpy.nodes import Reservoir

    backbone = load_backbone("esn:units=40,layers=2,sr=0.9,lr=0.3,bias_scaling=0.5,input_scaling=0.7", seed=5)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 12, 40, generator=g, dtype=torch.float64)
    backbone.double()
    u = x[0].numpy()
    for k in range(2):
        W, Win, bias = (t.numpy() for t in backbone.weights(k))
        node = Reservoir(W=W, Win=Win, bias=bias, lr=0.3)
        theirs = node.run(u)
        ours = backbone.run(k, torch.from_numpy(u)[None])[0].numpy()
        np.testing.assert_allclose(ours, theirs, atol=1e-10)
        u = theirs
    lengths = torch.tensor([12, 7, 3])
    with torch.inference_mode():
        states = backbone(x, lengths, [0, 1, 2], (lengths - 1)[:, None])
    np.testing.assert_allclose(
        states[0, 2, 0].numpy(), u[-1], atol=1e-10
    )  # row 0's depth 2 at its last token


def test_weights_follow_the_settings():
    backbone = load_backbone("esn:units=60,rc_connectivity=0.2,sr=0.8", seed=1)
    W, Win, _ = backbone.weights(0)
    assert abs(np.max(np.abs(np.linalg.eigvals(W.double().numpy()))) - 0.8) < 1e-4
    assert 0.1 < (W != 0).double().mean() < 0.3 and set(torch.unique(Win).tolist()) <= {-1.0, 0.0, 1.0}
    assert not torch.equal(W, load_backbone("esn:units=60,rc_connectivity=0.2,sr=0.8", seed=2).weights(0)[0])


@pytest.mark.parametrize("units, connectivity", [(4, 0.1), (50, 0.01)])
def test_a_sparse_reservoir_is_drawn_until_it_has_a_spectral_radius(units, connectivity):
    """A sparse W whose non-zeros form no loop has every eigenvalue 0 and cannot be scaled to sr (it came out
    NaN or blown up for about half the seeds of these settings): it is drawn again, so every seed's W has
    spectral radius sr; a setting too sparse to ever form a loop is refused in words."""
    from reservoir.model.backbones.esn import nilpotent, reservoir_weights

    for seed in range(20):
        W = reservoir_weights(
            ESNConfig(units=units, rc_connectivity=connectivity), 1, np.random.default_rng(seed)
        )["W"]
        assert np.isfinite(W).all() and abs(np.max(np.abs(np.linalg.eigvals(W))) - 0.9) < 1e-9, seed
    assert nilpotent(np.triu(np.ones((5, 5)), 1)) and not nilpotent(np.eye(5, k=1) + np.eye(5, k=-4))
    with pytest.raises(UsageError, match=r"1 units at rc_connectivity 0.001 drew 100 reservoirs .* raise"):
        reservoir_weights(ESNConfig(units=1, rc_connectivity=0.001), 1, np.random.default_rng(0))


def test_a_row_never_depends_on_its_padding_or_its_batch():
    backbone = load_backbone("esn:units=30,layers=3", seed=0)
    x = torch.randn(2, 10, 30)
    lengths = torch.tensor([10, 4])
    with torch.inference_mode():
        both = backbone(x, lengths, [1, 3], (lengths - 1)[:, None])
        alone = backbone(x[1:, :4], lengths[1:], [1, 3], (lengths[1:] - 1)[:, None])
    torch.testing.assert_close(both[1:], alone)


@pytest.mark.parametrize(
    "name, message",
    [
        ("esn:sr=-1", "'sr' setting .* must be > 0. Got -1.0"),
        (
            "esn:activation=relu",
            "'activation' setting .* must be one of \\['tanh', 'identity'\\]. Got 'relu'",
        ),
        ("esn:units=x", "units='x' is not an integer"),
        ("esn:layers=2.5", "layers='2.5' is not an integer"),
        ("esn:sr=x", "sr='x' is not a number"),
        ("esn:input_scaling=inf", "input_scaling='inf' is not a finite number"),
        ("esn:nosuch=1", "'nosuch=1' .* KEY=VALUE with a key from"),
        ("esn:units=0", "'units' setting .* must be an integer >= 1. Got 0"),
        (
            "esn:units=50,sr=0.5,units=60",
            "setting 'units' is given twice in .* \\(50 and 60\\); give it once",
        ),
    ],
)
def test_bad_settings_are_refused_in_words(name, message, home):
    """A bad setting is refused by the loader, and by the command line as a usage error (exit 2, as an unknown
    backbone or an option out of range is) before anything runs."""
    from click.testing import CliRunner

    from reservoir.cli import main

    with pytest.raises(UsageError, match=message):
        load_backbone(name)
    r = CliRunner().invoke(main, ["extract", "--task", "bit_xor", "--backbone", name, "--limit", "4"])
    assert r.exit_code == 2 and "Invalid value for --backbone" in r.output and "Traceback" not in r.output
    assert re.search(message, " ".join(r.output.split())) and not list(home.iterdir())


def test_registered_variants():
    assert load_backbone("esn").n_layers == 1 and load_backbone("esn-deep").n_layers == 4
    assert parse_name("esn:layers=2") == ESNConfig(layers=2)


def test_the_continuous_run_is_the_first_reservoir_over_the_whole_series():
    """``series_states`` draws the weights the backbone's first reservoir draws from the same seed and runs
    them once over the series; with the identity activation and no bias the states are linear in the input."""
    cfg = ESNConfig(units=16, lr=0.5, sr=0.9, bias_scaling=0.3)
    u = np.random.default_rng(0).uniform(-1, 1, (50, 16))
    backbone = load_backbone("esn:units=16,lr=0.5,sr=0.9,bias_scaling=0.3", seed=4).double()
    ours = backbone.run(0, torch.from_numpy(u)[None])[0].numpy()
    np.testing.assert_allclose(series_states(cfg, u, seed=4), ours, atol=1e-6)  # the backbone keeps float32
    linear = ESNConfig(units=16, activation="identity")
    np.testing.assert_allclose(series_states(linear, 2 * u), 2 * series_states(linear, u), atol=1e-12)
    assert not np.allclose(series_states(cfg, 2 * u), 2 * series_states(cfg, u))
    assert parse_name("esn:activation=identity,units=5") == ESNConfig(units=5, activation="identity")
