"""The torch head: a linear layer trained with cross-entropy per output, by Adam on mini-batches read
block by block (in memory or not), or full-batch L-BFGS in memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin

from reservoir.config import POSITIVE
from reservoir.probe.heads import register_head
from reservoir.probe.predictors import Predictor, PredictsThrough, array
from reservoir.probe.rows import ArrayRows, Rows, _outputs, check_finite, moments, shape_of
from reservoir.settings import Interval, OneOf, check, validate


@register_head("torch", param="weight_decay", grid=(0.0, 1e-4, 1e-3, 1e-2))
class TorchHead(PredictsThrough, ClassifierMixin, BaseEstimator):
    """A linear layer trained with cross-entropy per output.

    Parameters
    ----------
    weight_decay
        L2 penalty added to the loss.
    optimizer
        ``"adam"`` (mini-batches, ``epochs`` passes) or ``"lbfgs"`` (full batch).
    lr, epochs, batch_size, seed
        optimisation settings; ``seed`` fixes init and order.
    device
        where the layer trains (``auto``, ``cpu``, ``cuda[:N]``, ``mps``; as ``--device``).
    """

    parameter_constraints = {
        "weight_decay": (Interval(0, None),),
        "optimizer": (OneOf(("adam", "lbfgs")),),
        "lr": (Interval(0, None, closed="neither"),),
        "epochs": (POSITIVE,),
        "batch_size": (POSITIVE,),
    }

    def __init__(
        self,
        weight_decay: float = 0.0,
        *,
        optimizer: str = "adam",
        lr: float = 1e-2,
        epochs: int = 30,
        batch_size: int = 256,
        seed: int = 0,
        device: str = "cpu",
    ):
        self.weight_decay = weight_decay
        self.optimizer = optimizer
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed
        self.device = device

    def fit(self, X: np.ndarray, y: np.ndarray) -> TorchHead:
        from reservoir.model.devices import resolve_device

        validate(self, "TorchHead")
        self.device_ = resolve_device(self.device)
        if self.optimizer == "adam":  # the same implementation as a fit on rows read block by block
            return self.fit_blocks(ArrayRows(X, y))
        check_finite(X)
        Y = torch.from_numpy(_outputs(y).astype(np.int64)).to(self.device_)
        self.y_ndim_, self.n_outputs_ = y.ndim, Y.shape[1]
        self.n_classes_ = int(Y.max()) + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.linear_ = torch.nn.Linear(X.shape[1], self.n_outputs_ * self.n_classes_).to(self.device_)
        Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(self.device_)

        def loss_on(xb, yb):
            logits = self.linear_(xb).view(len(xb), self.n_outputs_, self.n_classes_)
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb)
            return loss + self.weight_decay * self.linear_.weight.pow(2).sum()

        opt = torch.optim.LBFGS(
            self.linear_.parameters(), lr=1.0, max_iter=200, line_search_fn="strong_wolfe"
        )

        def closure():
            opt.zero_grad()
            loss = loss_on(Xt, Y)
            loss.backward()
            return loss

        opt.step(closure)
        self.predict_ = _linear_predictor(
            self.linear_, None, None, self.n_outputs_, self.n_classes_, self.device_
        )
        return self

    def fit_blocks(self, source: Rows) -> TorchHead:
        """Adam on rows read block by block (:func:`streaming_linear`): the one implementation of
        the ``adam`` head, in memory or not."""
        validate(self, "TorchHead")
        check(
            "TorchHead",
            "optimizer",
            self.optimizer,
            OneOf(("adam",)),
            note=" to fit rows read block by block",
        )
        self.y_ndim_ = source.y_ndim
        self.predict_ = streaming_linear(
            self.weight_decay,
            source,
            seed=self.seed,
            device=self.device,
            lr=self.lr,
            epochs=self.epochs,
            batch_size=self.batch_size,
        )
        return self


def streaming_linear(
    weight_decay: float,
    source: Rows,
    *,
    seed: int = 0,
    device: str = "cpu",
    lr: float = 1e-2,
    epochs: int = 30,
    batch_size: int = 256,
) -> Callable[[np.ndarray], np.ndarray]:
    """:class:`TorchHead` out of core: the same layer, loss and Adam, on standardized features,
    with mini-batches drawn block by block (blocks in file order, rows shuffled within a block)."""
    from reservoir.model.devices import resolve_device

    dev = resolve_device(device)
    mean, scale, _ = moments(source)
    m, c = shape_of(source)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linear = torch.nn.Linear(len(mean), m * c).to(dev)
    opt = torch.optim.Adam(linear.parameters(), lr=lr)
    shift = torch.from_numpy(mean.astype(np.float32)).to(dev)
    div = torch.from_numpy(scale.astype(np.float32)).to(dev)
    for _ in range(epochs):
        for X, y in source.blocks():
            Xt = (torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(dev) - shift) / div
            Yt = torch.from_numpy(_outputs(y).astype(np.int64)).to(dev)
            for idx in torch.randperm(len(Xt), generator=g).to(dev).split(batch_size):
                opt.zero_grad()
                logits = linear(Xt[idx]).view(len(idx), m, c)
                loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), Yt[idx])
                (loss + weight_decay * linear.weight.pow(2).sum()).backward()
                opt.step()

    return _linear_predictor(linear, shift, div, m, c, dev)


def _linear_predictor(linear: torch.nn.Linear, shift, div, m: int, c: int, dev) -> LinearLayerPredictor:
    """``X -> (n, m)`` class ids of a trained linear layer (features standardized by ``shift`` and ``div``
    when given)."""
    return LinearLayerPredictor(linear.weight.detach(), linear.bias.detach(), shift, div, m, c, dev)


class LinearLayerPredictor(Predictor):
    """The torch head: a linear layer (``weight (m * c, d)``, ``bias``, float32) on features
    standardized by ``shift`` and ``div`` (float32, when given), argmax per output."""

    kind = "torch-linear"

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor,
        shift: torch.Tensor | None,
        div: torch.Tensor | None,
        m: int,
        c: int,
        dev: Any = "cpu",
    ):
        self.weight, self.bias, self.shift, self.div, self.dev = weight, bias, shift, div, dev
        self.n_outputs, self.n_classes = int(m), int(c)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(self.dev)
            if self.shift is not None:
                Xt = (Xt - self.shift) / self.div
            logits = torch.nn.functional.linear(Xt, self.weight, self.bias)
            return logits.view(len(Xt), self.n_outputs, self.n_classes).argmax(-1).cpu().numpy()

    def state(self):
        arrays = {"weight": self.weight.cpu().numpy(), "bias": self.bias.cpu().numpy()}
        if self.shift is not None:
            arrays.update(shift=self.shift.cpu().numpy(), div=self.div.cpu().numpy())
        return {"kind": self.kind, "n_outputs": self.n_outputs, "n_classes": self.n_classes}, arrays

    @classmethod
    def from_state(cls, meta, arrays, m, c):
        weight = array(arrays, "weight", 2)
        if weight.shape[0] != m * c:
            raise ValueError(f"the probe's weight has {weight.shape[0]} rows for {m} outputs of {c} classes")
        d = weight.shape[1]
        bias = array(arrays, "bias", 1, (m * c,))
        shift = div = None
        if "shift" in arrays:
            shift = torch.from_numpy(array(arrays, "shift", 1, (d,)).astype(np.float32))
            div = torch.from_numpy(array(arrays, "div", 1, (d,)).astype(np.float32))
        return cls(
            torch.from_numpy(weight.astype(np.float32)),
            torch.from_numpy(bias.astype(np.float32)),
            shift,
            div,
            m,
            c,
        )
