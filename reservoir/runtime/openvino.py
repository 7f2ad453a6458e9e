"""OpenVINO's forward: the float32 PyTorch forward converted once, compiled by OpenVINO's CPU plugin in the
run's dtype (int8 with its calibration), checked against PyTorch on the first rows. The engine that
registers it is :class:`reservoir.runtime.engines.OpenVINOEngine`."""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from reservoir.errors import BackboneError
from reservoir.runtime.engines import (
    FORWARDS,
    INT8_DTYPES,
    STATIC_MIN_ROWS,
    STATIC_SHAPES,
    STREAMS,
    TOLERANCE,
    ConvertedForward,
    calibration_dtype,
    centred,
    cpu_config,
    import_openvino,
    one_line,
    position_means,
    quiet,
)


class OpenVINOForward(ConvertedForward):
    """The converted forward (:class:`~reservoir.runtime.engines.ConvertedForward`) of OpenVINO: the module
    converted at the first call; ``dtype`` ``float32``, ``bfloat16``, ``int8`` or ``int8-static``, ``threads``
    OpenVINO's inference threads (PyTorch's thread count), ``fixed_width``: every row spans ``width`` positions
    (a task of fixed length), and ``int8`` then fixes the graph's width."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: ``int8`` on rows of one width: the graph's rows fixed at ``width`` positions, a narrower batch widened
        self.fixed = self.dtype == "int8" and self.fixed_width
        #: rows of one width: each batch shape gets a graph compiled for it (:meth:`_request`); int8 keeps one
        #: graph, since its kernels differ by graph
        self.static_shapes = self.fixed_width and self.dtype not in INT8_DTYPES
        self.model = None
        self.static: dict[tuple[int, ...], Any] = {}
        self.shifts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.batches: list[tuple[np.ndarray, ...]] | None = None
        #: OpenVINO streams a batch is split among: :data:`STREAMS` where each gets a thread
        self.streams = STREAMS if self.threads >= STREAMS else 1

    def _convert(self, example: tuple[torch.Tensor, ...]):
        ov = import_openvino()

        try:
            with quiet(), torch.no_grad(), self._centred():
                start = time.perf_counter()
                model = ov.convert_model(self.eager, example_input=example)
                if self.fixed:  # OpenVINO folds the tables' slices to constants and fuses them
                    tokens = model.inputs[0]
                    model.reshape({tokens: ov.PartialShape([-1, self.width, *example[0].shape[2:]])})
        except Exception as e:  # noqa: BLE001 - named with the way out
            raise BackboneError(
                f"OpenVINO could not convert this backbone ({one_line(e)}); pass --engine torch"
            ) from None
        self.seconds["convert"] = self.seconds.get("convert", 0.0) + time.perf_counter() - start
        return model

    def _calibration(self) -> list[tuple[np.ndarray, ...]]:
        if self.batches is None:
            self.batches = self.calibration()
        return self.batches

    def _centred(self) -> contextlib.AbstractContextManager:
        """int8: ``self.eager`` with every projection centred per position (:func:`centred`); the float
        dtypes convert it as it is."""
        if self.dtype not in INT8_DTYPES:
            return contextlib.nullcontext()
        if self.shifts is None:
            start = time.perf_counter()
            # NNCF takes seconds to import: done beside the pass (PyTorch's kernels release the GIL)
            threading.Thread(target=importlib.import_module, args=("nncf",), daemon=True).start()
            self.shifts = position_means(
                self.eager, self._calibration(), self.width, self.centre_dtype or calibration_dtype()
            )
            self.seconds["centre"] = time.perf_counter() - start
        # int8-static calibrates its ranges on whole last blocks (on the readout rows alone they were worse)
        return centred(self.eager, self.shifts, whole=self.dtype == "int8-static")

    def _quantize(self, model):
        import nncf

        start = time.perf_counter()
        nncf.set_log_level(logging.ERROR)
        # lookups stay float: int8 tables moved every position
        lookups = nncf.IgnoredScope(types=["Gather"], validate=False)
        with quiet():
            if self.dtype == "int8":
                model = nncf.compress_weights(
                    model, mode=nncf.CompressWeightsMode.INT8_SYM, ignored_scope=lookups
                )
            else:
                batches = self._calibration()
                model = nncf.quantize(
                    model,
                    nncf.Dataset(batches, lambda b: {0: b[0], 1: b[1], 2: b[2]}),
                    model_type=nncf.ModelType.TRANSFORMER,
                    subset_size=len(batches),
                    ignored_scope=lookups,
                )
        self.seconds["quantize"] = self.seconds.get("quantize", 0.0) + time.perf_counter() - start
        return model

    def _compile(self, model) -> list:
        """``model`` compiled for the CPU: one infer request per stream."""
        ov = import_openvino()

        start = time.perf_counter()
        with quiet():
            compiled = ov.Core().compile_model(
                model, "CPU", cpu_config(self.dtype, self.threads, self.streams)
            )
        self.seconds["compile"] = self.seconds.get("compile", 0.0) + time.perf_counter() - start
        return [compiled.create_infer_request() for _ in range(self.streams)]

    def _request(self, args: Sequence[np.ndarray]) -> list:
        """The requests for a batch of ``args``' shapes: on rows of one width, a graph compiled for exactly
        these shapes (at most :data:`STATIC_SHAPES` of them), whose first call runs at the steady rate;
        else the dynamic one."""
        shapes = tuple(tuple(a.shape) for a in args)
        if shapes in self.static:
            return self.static[shapes]
        if not self.static_shapes or len(self.static) >= STATIC_SHAPES or len(args[0]) < STATIC_MIN_ROWS:
            return self.request
        ov = import_openvino()

        model = self.model.clone()
        model.reshape({port: ov.PartialShape(list(shape)) for port, shape in zip(model.inputs, shapes)})
        self.static[shapes] = self._compile(model)
        return self.static[shapes]

    def prepare(self, batch: tuple[torch.Tensor, ...]) -> None:
        """Convert (from :meth:`example`), quantize (int8), compile for the CPU and check against PyTorch on
        ``batch``'s first rows at their full width; a graph from a cut example that fails the check, or fails to
        run them, is converted again from the full width."""
        first = self.example(batch)
        examples = [first] + ([tuple(t[:2] for t in batch)] if first[0].shape[1] < batch[0].shape[1] else [])
        rows = self.check_rows(batch)
        for k, example in enumerate(examples):
            try:
                model = self._convert(example)
                if self.dtype in INT8_DTYPES:
                    model = self._quantize(model)
                self.model, self.static = model, {}
                self.request = self._compile(model)
                ours = self._infer(rows).numpy()
            except BackboneError:
                if k + 1 == len(examples):
                    raise
                continue  # a graph the cut example fixes to its width (a vision model's grid): the full width
            if self.compare(ours, rows) <= TOLERANCE[self.dtype]:
                break
        self.accept("openvino", len(ours))

    def _widen(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``(tokens, lengths, readout)`` with the tokens widened to ``width`` positions by repeating each
        row's last token (past every row's length: no feature reads them), where the graph's width is fixed."""
        tokens, *rest = args
        if self.fixed and tokens.shape[1] < self.width:
            tail = tokens[:, -1:].expand(-1, self.width - tokens.shape[1], *tokens.shape[2:])
            tokens = torch.cat([tokens, tail], 1)
        return (tokens, *rest)

    def _infer(self, args: Sequence[torch.Tensor]) -> torch.Tensor:
        """The features of a batch, its rows split among the streams' requests (a row's features never
        depend on the other rows of its batch)."""
        arrays = [np.ascontiguousarray(t.numpy()) for t in self._widen(args)]
        rows = len(arrays[0])
        parts = min(self.streams, rows // STATIC_MIN_ROWS) or 1
        cuts = np.linspace(0, rows, parts + 1).astype(int)
        pieces = [[a[i:j] for a in arrays] for i, j in zip(cuts[:-1], cuts[1:])]
        running, out = [], []
        try:
            for i, piece in enumerate(pieces):
                request = self._request(piece)[i]
                request.start_async(dict(enumerate(piece)))
                running.append(request)
            for request in running:
                request.wait()
                out.append(request.get_output_tensor(0).data.copy())
        except RuntimeError as e:  # a graph whose converted shapes this batch's do not fit
            raise BackboneError(
                f"OpenVINO could not run a batch of shapes {[list(a.shape) for a in arrays]} through the graph it "
                f"converted ({one_line(e)}); pass --engine torch"
            ) from None
        return torch.from_numpy(np.concatenate(out) if len(out) > 1 else out[0])


FORWARDS["openvino"] = OpenVINOForward
