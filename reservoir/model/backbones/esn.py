"""Echo state networks: the classical reservoir, beside the transformer ones.

A leaky-integrator reservoir with reservoirpy's parameters and update (``reservoirpy.nodes.Reservoir``),
``x[t] = (1 - lr) * x[t-1] + lr * f(W x[t-1] + Win u[t] + bias)``; its states equal reservoirpy's on
the same weights (tested). A deep ESN stacks ``layers`` reservoirs, each reading the states of the one
below (Gallicchio et al. 2017); depth ``k`` is reservoir ``k``'s state at the readout token.

As a backbone the ESN reads the windows every backbone reads, from a zero state at each window's first
token; :func:`series_states` runs it the field's way, once over a whole series. Names: ``esn``,
``esn-deep``, or a setting such as ``esn:units=2000,sr=0.95,lr=0.3,layers=3``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import torch
from torch import nn

from reservoir.errors import UsageError
from reservoir.model.backbones.base import Backbone, Capabilities, weight_std
from reservoir.settings import Interval, OneOf, setting, validate

#: the reservoir's nonlinearity: ``identity`` makes it a linear reservoir (memory capacity's reference case)
ACTIVATIONS = {"tanh": torch.tanh, "identity": lambda x: x}


@dataclass(frozen=True)
class ESNConfig:
    """An echo state network's settings, each checked where it is made."""

    #: reservoir size, also the input layer's width (every depth is ``units`` wide)
    units: int = setting(768, Interval(1, None, integer=True))
    #: reservoirs stacked, one depth each
    layers: int = setting(1, Interval(1, None, integer=True))
    #: spectral radius of ``W``
    sr: float = setting(0.9, Interval(0, None, closed="neither"))
    #: leak rate
    lr: float = setting(0.3, Interval(0, 1, closed="right"))
    #: scale of ``Win``, a sparse matrix of +-1
    input_scaling: float = setting(1.0, Interval(0, None, closed="neither"))
    #: scale of a uniform bias in [-1, 1]
    bias_scaling: float = setting(0.0, Interval(0, None))
    #: density of ``Win``
    input_connectivity: float = setting(0.1, Interval(0, 1, closed="right"))
    #: density of ``W``, a sparse normal matrix rescaled to ``sr``
    rc_connectivity: float = setting(0.1, Interval(0, 1, closed="right"))
    #: ``f``: ``tanh``, or ``identity`` for a linear reservoir
    activation: str = setting("tanh", OneOf(tuple(ACTIVATIONS)))

    def __post_init__(self) -> None:
        validate(self, "the echo state network", noun="setting")


VARIANTS = {"esn": ESNConfig(), "esn-deep": ESNConfig(layers=4)}


def parse_name(name: str) -> ESNConfig | None:
    """``esn:units=2000,sr=0.95`` -> its config (``None`` for a name that is not an ESN setting); UsageError
    for an unknown key, a key given twice or a value out of range."""
    if not name.startswith("esn:"):
        return None
    types = {f.name: f.type for f in fields(ESNConfig)}
    settings = {}
    for pair in filter(None, name[4:].split(",")):
        key, _, value = pair.partition("=")
        if key not in types or not value:
            raise UsageError(
                f"echo state network setting {pair!r} in {name!r} is not KEY=VALUE with a key from "
                f"{sorted(types)}"
            )
        if key in settings:
            raise UsageError(
                f"echo state network setting {key!r} is given twice in {name!r} ({settings[key]} and {value}); "
                "give it once"
            )
        try:
            kind = types[key]
            settings[key] = (
                value if kind in (str, "str") else int(value) if kind in (int, "int") else float(value)
            )
        except ValueError:
            what = "an integer" if kind in (int, "int") else "a number"
            raise UsageError(f"echo state network setting {key}={value!r} is not {what}") from None
        if isinstance(settings[key], float) and not np.isfinite(settings[key]):
            raise UsageError(f"echo state network setting {key}={value!r} is not a finite number")
    return replace(ESNConfig(), **settings)


#: draws of ``W`` before a reservoir too sparse to have a spectral radius is refused
MAX_DRAWS = 100


def nilpotent(W: np.ndarray) -> bool:
    """Whether ``W``'s pattern of non-zeros has no cycle, so every eigenvalue is 0 whatever its values (its
    ``2**m``-th power, ``2**m >= units``, is zero): such a reservoir cannot be scaled to a spectral radius."""
    if np.diag(W).any():  # a unit reading itself is a loop
        return False
    pattern = (W != 0).astype(np.float32)
    for _ in range(max(1, int(np.ceil(np.log2(len(W)))))):
        pattern = ((pattern @ pattern) > 0).astype(np.float32)
    return not pattern.any()


def reservoir_weights(cfg: ESNConfig, n_in: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``W (units, units)`` at spectral radius ``sr``, ``Win (units, n_in)`` and ``bias (units,)``, float64.
    A ``W`` whose spectral radius is 0 (:func:`nilpotent`: likely for a few units at a low ``rc_connectivity``)
    is drawn again; UsageError after :data:`MAX_DRAWS` such draws."""
    n = cfg.units
    for _ in range(MAX_DRAWS):
        W = rng.normal(size=(n, n)) * (rng.random((n, n)) < cfg.rc_connectivity)
        if not nilpotent(W):
            break
    else:
        raise UsageError(
            f"an echo state network of {n} units at rc_connectivity {cfg.rc_connectivity:g} drew {MAX_DRAWS} "
            "reservoirs whose spectral radius is 0 (too few connections to form a loop), which cannot be scaled "
            "to sr; raise rc_connectivity or units"
        )
    W *= cfg.sr / np.max(np.abs(np.linalg.eigvals(W)))
    Win = rng.choice([-1.0, 1.0], size=(n, n_in)) * (rng.random((n, n_in)) < cfg.input_connectivity)
    bias = rng.uniform(-1, 1, size=n) * cfg.bias_scaling
    return {"W": W, "Win": Win * cfg.input_scaling, "bias": bias}


def leaky_run(
    cfg: ESNConfig, W: torch.Tensor, Win: torch.Tensor, bias: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """States ``(B, T, units)`` of one reservoir of weights ``W``, ``Win``, ``bias`` driven by
    ``u (B, T, n_in)`` from a zero state (the module docstring's update)."""
    f = ACTIVATIONS[cfg.activation]
    drive = u @ Win.T.to(u.dtype) + bias.to(u.dtype)
    W = W.T.to(u.dtype)
    x = torch.zeros(u.shape[0], W.shape[0], dtype=u.dtype, device=u.device)
    out = []
    for t in range(u.shape[1]):
        x = (1 - cfg.lr) * x + cfg.lr * f(x @ W + drive[:, t])
        out.append(x)
    return torch.stack(out, dim=1)


def series_states(cfg: ESNConfig, u: np.ndarray, seed: int = 0) -> np.ndarray:
    """The field's protocol: one reservoir (``cfg.layers`` ignored) whose ``Win`` reads ``u (T, n_in)``
    directly, run once over the whole series from a zero state; ``(T, units)`` float64 states (drop a
    washout before reading them), weights drawn from ``seed`` as :class:`ESNBackbone` draws its first."""
    weights = reservoir_weights(cfg, u.shape[1], np.random.default_rng(seed))
    W, Win, bias = (torch.from_numpy(weights[k]) for k in ("W", "Win", "bias"))
    with torch.inference_mode():
        return leaky_run(cfg, W, Win, bias, torch.from_numpy(np.asarray(u, np.float64))[None])[0].numpy()


class ESNBackbone(Backbone):
    """A (deep) echo state network; depth ``k`` is reservoir ``k``'s state."""

    family = "esn"
    naming = (
        "esn, esn-deep, or esn:units=U,layers=L,sr=S,lr=A,input_scaling=I,bias_scaling=B,"
        "input_connectivity=C,rc_connectivity=R,activation=tanh|identity"
    )
    example = "esn"
    #: every step is a (rows, units) x (units, units) product: hundreds of rows keep the CPU busy
    batch_tokens = 32768
    capabilities = Capabilities()

    def __init__(self, cfg: ESNConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.config = asdict(cfg)
        self.d_model, self.n_layers = cfg.units, cfg.layers
        rng = np.random.default_rng(seed)
        for k in range(cfg.layers):
            for name, value in reservoir_weights(cfg, cfg.units, rng).items():
                self.register_buffer(f"{name}_{k}", torch.from_numpy(value).float())
        # no token embedding: ``--input-scale matched`` reads the first reservoir's input weights, as for an LSTM
        self.token_std = weight_std(self.Win_0)

    def weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return getattr(self, f"W_{k}"), getattr(self, f"Win_{k}"), getattr(self, f"bias_{k}")

    def run(self, k: int, u: torch.Tensor) -> torch.Tensor:
        """States ``(B, T, units)`` of reservoir ``k`` driven by ``u (B, T, n_in)`` from a zero state."""
        return leaky_run(self.cfg, *self.weights(k), u)

    def embed(self, x, lengths, readout, last):
        """``x`` up to the last readout position: states never depend on later tokens."""
        return x[:, : int(readout.max()) + 1], None

    def call_block(self, i, h, context):
        """Reservoir ``i`` driven by the states of the one below (the embedded input for the first)."""
        return self.run(i, h)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {}  # fixed random weights: only the FPT's input and output layers train


def _register() -> None:
    """``esn`` and ``esn-deep`` by name, and any ``esn:KEY=VALUE,...`` setting."""
    from reservoir.model.backbones import SETTINGS, register_backbone

    for name, cfg in VARIANTS.items():
        register_backbone(
            name,
            help=f"echo state network: {cfg.layers} reservoir(s) of {cfg.units} units, "
            f"spectral radius {cfg.sr}, leak rate {cfg.lr}",
        )(lambda seed=0, _c=cfg: ESNBackbone(_c, seed))
    SETTINGS["esn:"] = parsed_builder


def parsed_builder(name: str):
    """The builder of an ``esn:...`` name."""
    cfg = parse_name(name)
    return lambda seed=0: ESNBackbone(cfg, seed)


_register()
