"""PNG plots of results: accuracy by depth, training curves, attention maps. Data in, PNG out.

matplotlib is an optional extra (``pip install 'reservoir[plot]'``), imported when a function runs;
without it they raise :class:`~reservoir.errors.UsageError` saying how to install it. Figures are drawn
on matplotlib's Agg canvas directly, without ``pyplot``, so the caller's backend is left alone and no
figure stays registered. Each file is written atomically (:func:`reservoir.results.atomic_write`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import UsageError
from reservoir.results import atomic_write

#: pixels per inch of every PNG
DPI = 100
#: (width, height) in inches
DEPTH_SIZE = (8.0, 4.5)
TRAINING_SIZE = (11.0, 4.0)
#: one attention heatmap (inches), and the widest grid
PANEL_SIZE = 2.6
MAX_COLUMNS = 4
#: sequences up to this long get one tick label per token
MAX_LABELLED_TOKENS = 40
#: dash patterns of baseline lines (all dashed, told apart by pattern and grey level)
BASELINE_DASHES = [(6, 3), (2, 2), (8, 2, 2, 2), (4, 4), (10, 3), (3, 1, 1, 1)]


def _figure(figsize: tuple[float, float]):
    """A new Agg-backed figure with constrained layout (so an ``outside`` legend gets its own room)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            "plots need matplotlib, but matplotlib is not installed; pip install 'reservoir[plot]'"
        ) from None
    fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path | str) -> Path:
    return atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=DPI))


def _colours(names: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def depth_plot(
    curves: dict[str, dict[int, float]],
    path: Path | str,
    *,
    title: str,
    baselines: dict[str, float] | None = None,
    chosen: dict[str, int] | None = None,
    paper: dict[str, dict[int, float]] | None = None,
    ylabel: str = "test accuracy (%)",
) -> Path:
    """Accuracy against depth (number of blocks), one line per backbone, with baselines.

    Parameters
    ----------
    curves
        ``{backbone: {depth: accuracy}}``, accuracies **in percent** (results store fractions).
    path, title
        the PNG to write (its folder is created) and the figure's title.
    baselines
        ``{name: accuracy}`` in percent: a labelled horizontal dashed line each.
    chosen
        ``{backbone: depth}``, the depth chosen on validation; ringed on its curve.
    paper
        ``{backbone: {depth: accuracy}}`` in percent, the paper's numbers (hollow markers).

    Returns
    -------
    The path written.

    Examples
    --------
    >>> depth_plot({"gpt2": {0: 60.0, 6: 95.5, 12: 100.0}}, "plots/bit_xor.png", title="bit_xor",
    ...            baselines={"majority": 50.0}, chosen={"gpt2": 12})             # doctest: +SKIP
    """
    if not curves and not paper:
        raise UsageError("depth_plot needs at least one curve ({backbone: {depth: accuracy}}); got none")
    unknown = sorted(set(chosen or {}) - set(curves))
    if unknown:
        raise UsageError(f"chosen depths name backbones without a curve: {unknown}; curves: {sorted(curves)}")
    fig = _figure(DEPTH_SIZE)  # first: it says how to install matplotlib when it is missing
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_subplot()
    colour = _colours(list(dict.fromkeys([*curves, *(paper or {})])))
    depths: list[int] = []
    for name, curve in curves.items():
        xs = sorted(curve)
        depths += xs
        ax.plot(
            xs,
            [curve[x] for x in xs],
            marker="o",
            markersize=4,
            linewidth=1.6,
            color=colour[name],
            label=name,
        )
    for i, (name, curve) in enumerate((paper or {}).items()):  # shrinking sizes: equal numbers stay visible
        xs = sorted(curve)
        depths += xs
        size = 7 + 3 * (len(paper) - 1 - i)
        ax.plot(
            xs,
            [curve[x] for x in xs],
            linestyle="none",
            marker="D",
            markersize=size,
            markerfacecolor="none",
            markeredgewidth=1.4,
            color=colour[name],
            label=name if "paper" in name else f"{name} (paper)",
        )
    for name, depth in (chosen or {}).items():
        if depth not in curves[name]:
            raise UsageError(
                f"chosen depth {depth} of {name!r} has no accuracy in its curve (depths "
                f"{sorted(curves[name])}); pass a depth the curve holds"
            )
        ax.plot(
            [depth],
            [curves[name][depth]],
            linestyle="none",
            marker="o",
            markersize=13,
            markerfacecolor="none",
            markeredgewidth=1.8,
            color=colour[name],
        )
    for i, (name, value) in enumerate((baselines or {}).items()):
        ax.axhline(
            value,
            linestyle=(0, BASELINE_DASHES[i % len(BASELINE_DASHES)]),
            linewidth=1.3,
            color=str(0.15 + 0.5 * (i % 4) / 3),
            label=f"{name} ({value:.1f})",
        )
    handles, _ = ax.get_legend_handles_labels()
    if chosen:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                markersize=11,
                markerfacecolor="none",
                markeredgewidth=1.8,
                color="black",
                label="chosen on validation",
            )
        )
    fig.legend(handles=handles, loc="outside center right", fontsize="small", frameon=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if depths:
        ax.set_xlim(min(depths) - 0.5, max(depths) + 0.5)
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel(ylabel)
    fig.suptitle(textwrap.fill(title, 100), fontsize="medium")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def training_curves(runs: dict[str, list[dict]], path: Path | str, *, title: str) -> Path:
    """Validation accuracy and training loss against step, one colour per run.

    Parameters
    ----------
    runs
        ``{name: history}``; a history is the list ``reservoir train`` records, each entry
        ``{"step", "loss", "val_accuracy"}`` (accuracy a fraction).
    path, title
        the PNG to write (its folder is created) and the figure's title.

    Returns
    -------
    The path written.

    Examples
    --------
    >>> training_curves({"lr=1e-3": [{"step": 100, "loss": 0.69, "val_accuracy": 0.52}]},
    ...                 "plots/train.png", title="bit_xor, gpt2")                   # doctest: +SKIP
    """
    if not runs:
        raise UsageError("training_curves needs at least one run ({name: history}); got none")
    fig = _figure(TRAINING_SIZE)
    acc_ax, loss_ax = fig.subplots(1, 2)
    colour = _colours(list(runs))
    for name, history in runs.items():
        for ax, key, scale in ((acc_ax, "val_accuracy", 100.0), (loss_ax, "loss", 1.0)):
            points = [(e["step"], e[key] * scale) for e in history if e.get(key) is not None]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(
                    xs,
                    ys,
                    marker="o" if len(xs) <= 30 else None,
                    markersize=3,
                    linewidth=1.4,
                    color=colour[name],
                    label=name if ax is acc_ax else None,
                )
    acc_ax.set(xlabel="step", ylabel="validation accuracy (%)", title="validation accuracy")
    loss_ax.set(xlabel="step", ylabel="training loss", title="training loss")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
    fig.legend(loc="outside center right", fontsize="small", frameon=False)
    fig.suptitle(textwrap.fill(title, 100))
    return _save(fig, path)


def attention_layout(n_heads: int) -> tuple[int, int, tuple[float, float]]:
    """``(rows, columns, figsize)`` of the grid :func:`attention_maps` draws for ``n_heads`` maps."""
    cols = min(n_heads, MAX_COLUMNS, max(1, math.ceil(math.sqrt(n_heads))))
    rows = math.ceil(n_heads / cols)
    return rows, cols, (cols * PANEL_SIZE + 0.9, rows * PANEL_SIZE + 0.6)


def attention_maps(
    weights: np.ndarray,
    path: Path | str,
    *,
    title: str,
    tokens: list[str] | None = None,
    heads: list[int] | None = None,
) -> Path:
    """A grid of attention heatmaps, one per head, of one layer for one example (FPT paper, figs. 3 to 5).

    Parameters
    ----------
    weights
        ``(n_heads, T, T)`` probabilities (:func:`reservoir.report.attention.first_layer_attention`).
    path, title
        the PNG to write (its folder is created) and the figure's title.
    tokens
        ``T`` labels; shown on both axes when ``T <= MAX_LABELLED_TOKENS``.
    heads
        heads to show (default: all), in this order.

    Returns
    -------
    The path written. All maps share one colour scale, from 0 to the largest weight shown.

    Examples
    --------
    >>> w, labels = first_layer_attention("bit_xor", "gpt2-random")                 # doctest: +SKIP
    >>> attention_maps(w, "att.png", title="bit_xor, gpt2-random, layer 0", tokens=labels)  # doctest: +SKIP
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
        raise UsageError(f"attention weights must have shape (n_heads, T, T); got {weights.shape}")
    n, t = weights.shape[0], weights.shape[1]
    heads = list(range(n)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < n]
    if bad or not heads:
        raise UsageError(
            f"heads {bad or heads} are not in [0, {n - 1}]; choose heads of the {n} the layer has"
        )
    if tokens is not None and len(tokens) != t:
        raise UsageError(f"{len(tokens)} token labels for {t} tokens; give one label per token")
    rows, cols, figsize = attention_layout(len(heads))
    fig = _figure(figsize)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    vmax = float(weights[heads].max()) or 1.0
    image = None
    labelled = tokens is not None and t <= MAX_LABELLED_TOKENS
    for i, ax in enumerate(axes):
        if i >= len(heads):
            ax.set_axis_off()
            continue
        image = ax.imshow(weights[heads[i]], cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"head {heads[i]}", fontsize="small")
        if labelled:
            ax.set_xticks(range(t), tokens, fontsize=7, rotation=90 if max(map(len, tokens)) > 2 else 0)
            ax.set_yticks(range(t), tokens, fontsize=7)
        else:
            ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("query token", fontsize="small")
        if i // cols == rows - 1 or i + cols >= len(heads):
            ax.set_xlabel("key token", fontsize="small")
    fig.colorbar(image, ax=list(axes[: len(heads)]), shrink=0.8, label="attention")
    fig.suptitle(textwrap.fill(title, 100))
    return _save(fig, path)
