"""Rows of a report: results grouped into settings (one row a setting, its seeds folded), and the data each
row's results were computed on (:func:`data_key`), so every row is shown beside the baselines of its own data."""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reservoir.config import select_depths
from reservoir.identity import digest
from reservoir.probe.baselines import display_name
from reservoir.probe.metrics import METRICS, Metric
from reservoir.results import merge_seeds, timed_out_at, with_scores

#: baselines in the order tables list them
BASELINE_ORDER = ("majority", "first-operator", "raw", "tanh")
BASELINE_LABELS = {
    "majority": "majority class",
    "first-operator": "first-operator rule",
    "raw": "raw-input linear head",
    "tanh": "random tanh features",
}


def baseline_label(name: str) -> str:
    kind, _, width = name.partition("-") if name.startswith("tanh-") else (name, "", "")
    return BASELINE_LABELS.get(kind, name) + (f" ({width} wide)" if width else "")


def baseline_rank(name: str) -> tuple[int, str]:
    kind = "tanh" if name.startswith("tanh-") else name
    return (BASELINE_ORDER.index(kind) if kind in BASELINE_ORDER else len(BASELINE_ORDER), name)


def input_scale(r: dict[str, Any]) -> str:
    return str(r.get("identity", {}).get("input_scale", "paper"))


def data_key(r: dict[str, Any]) -> str:
    """What a result (or a baseline) was computed on: its task, options and the digest of every split's rows."""
    identity = r.get("identity", {})
    return digest(
        {"task": r.get("task"), "options": identity.get("task_options"), "data": identity.get("data")}
    )


def data_label(r: dict[str, Any], seeds: Sequence[Any] = (), lost: Sequence[int] | None = None) -> str:
    """The data of a result in words: rows per split and how a ``--limit`` took them, e.g. ``train 200, test
    100 rows: a stratified sample (--limit 200, seed 0)``; ``seeds``: those of the samples of a row of several
    (``seeds 0, 1, 2``), and ``lost`` the classes any of them left out (default: this result's)."""
    identity = r.get("identity", {})
    data = identity.get("data")
    sizes = (
        ", ".join(
            f"{split} {v['rows']:,d}" for split, v in data.items() if isinstance(v, dict) and "rows" in v
        )
        if isinstance(data, dict)
        else ""
    )
    text = f"{sizes} rows" if sizes else f"n train/test {r.get('n_train')}/{r.get('n_test')}"
    limit, subset = identity.get("limit"), identity.get("subset")
    if limit is None:
        return text + ": every row"
    if subset is None:
        return text + f": the first rows (--limit {limit})"
    rule = subset.get("rule")
    if rule == "draws":
        return text + f": the first draws (--limit {limit})"
    seed = f", seed {subset['seed']}" if "seed" in subset else ""
    seed = f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 and seed else seed
    lost = subset.get("left_out") if lost is None else lost
    without = f", without class{'es' if len(lost) > 1 else ''} {', '.join(map(str, lost))}" if lost else ""
    return text + f": a {rule} sample (--limit {limit}{seed}){without}"


@dataclass
class Row:
    """One setting's results by depth (output-only: the readout depth; end-to-end: blocks run)."""

    task: str
    backbone: str
    mode: str
    head: str
    trainable: str
    scale: str
    run: str
    #: what tells this row from others of its setting, where results of it ran one seed on other data or
    #: other weights of one backbone name (so they are not seeds of one experiment), e.g. ``data 1a2b3c``;
    #: else "" (:func:`source_of`)
    data: str = ""
    by_depth: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def results(self) -> list[dict[str, Any]]:
        return [r for rs in self.by_depth.values() for r in rs]

    @property
    def metric(self) -> Metric:
        """The metric the row's results score (:mod:`reservoir.probe.metrics`): accuracy for classes."""
        return METRICS[self.results[0].get("metric", "accuracy")]

    def text(self, x: float | None, std: float | None = None, n: int = 1) -> str:
        """A value of the row's metric as its cells show it (:func:`score_text`)."""
        return score_text(x, std, n, self.metric)

    def tests(self, depth: int) -> list[float]:
        """Test scores at ``depth``, one per seed (an end-to-end result holds its seeds' mean)."""
        return [r["test_score"] for r in self.by_depth[depth]]

    def val(self, depth: int) -> float:
        return float(np.mean([r["val_score"] for r in self.by_depth[depth]]))

    def _better_first(self, value: float) -> float:
        return value if self.metric.greater_is_better else -value

    @property
    def test_splits(self) -> list[str]:
        """The test splits the row's results scored, the one its cells show (``test_split``) first."""
        r = self.results[0]
        return list(r.get("test_scores") or {}) or [r.get("test_split") or "test"]

    def other_tests(self, depth: int) -> dict[str, float]:
        """The mean score at ``depth`` on each test split beyond the one the cells show, by split."""
        rs = self.by_depth[depth]
        return {
            s: float(np.mean([r["test_scores"][s] for r in rs if s in (r.get("test_scores") or {})]))
            for s in self.test_splits[1:]
            if any(s in (r.get("test_scores") or {}) for r in rs)
        }

    @property
    def most_seeds(self) -> int:
        """The most seeds any depth of the row holds."""
        return max(self.spread(d)[2] for d in self.by_depth)

    @property
    def full(self) -> list[int]:
        """The depths every seed of the row reached (a fit stopped early, or asked for fewer depths at some
        seeds, leaves the others with fewer): the depths compared on one footing."""
        most = self.most_seeds
        return [d for d in sorted(self.by_depth) if self.spread(d)[2] == most]

    def short_of(self, depth: int) -> str:
        """`` (1 of 3 seeds)`` where ``depth`` holds fewer seeds than the row's other depths; else ``""``."""
        n, most = self.spread(depth)[2], self.most_seeds
        return f" ({n} of {most} seeds)" if n < most else ""

    @property
    def chosen(self) -> int:
        """The depth with the best mean validation score (the shallower on ties), among those every seed
        reached (:attr:`full`)."""
        return max(self.full, key=lambda d: (self._better_first(self.val(d)), -d))

    def depth_for(self, rule: str | int) -> int | None:
        """The depth a :data:`reservoir.report.tables.DEPTH_RULES` rule (or a depth number) picks, or ``None``."""
        if rule == "chosen":
            return self.chosen
        if rule == "last":  # the deepest the features hold, where the fit reached it
            stored = self.results[0].get("identity", {}).get("depths") or list(self.by_depth)
            rule = max(stored)
        return int(rule) if int(rule) in self.by_depth else None

    @property
    def best_by_test(self) -> int:
        return max(self.full, key=lambda d: (self._better_first(float(np.mean(self.tests(d)))), -d))

    def spread(self, depth: int) -> tuple[float, float | None, int]:
        """Mean test, its std over seeds (``None`` for one seed) and the number of seeds."""
        rs = self.by_depth[depth]
        if len(rs) == 1 and rs[0].get("test_std") is not None:  # an end-to-end result folds its seeds
            return rs[0]["test_score"], rs[0]["test_std"], len(rs[0].get("seeds", [0]))
        values = self.tests(depth)
        return (
            float(np.mean(values)),
            (float(np.std(values, ddof=1)) if len(values) > 1 else None),
            len(values),
        )

    @property
    def missing_depths(self) -> list[int]:
        """Depths a fit of this row's results was asked for and wrote no result of (it stopped, or failed)."""
        asked: set[int] = set()
        for r in self.results:
            depths = (r.get("config") or {}).get("fit", {}).get("depths")
            stored = r.get("identity", {}).get("depths")
            if r["mode"] == "output-only" and depths is not None and stored:
                with contextlib.suppress(ValueError):
                    asked |= set(select_depths(depths, stored, "in the features"))
        return sorted(asked - set(self.by_depth))

    @property
    def size(self) -> str:
        r = self.results[0]
        return f"{r['n_train']}/{r['n_test']}"


#: the identity fields an extraction's seed draws (generated data, a ``--limit`` sample, random weights and
#: the token-embedding std that ``--input-scale matched`` reads from them)
SEED_DRAWN = ("seed", "data", "backbone_fingerprint", "matched_std")
#: the same for an end-to-end result, with the number of blocks, so a sweep over blocks shares a row
E2E_SEED_DRAWN = ("seeds", "data", "backbone_fingerprints", "matched_stds", "blocks")


def follows_run_seed(task: str) -> bool:
    """Whether a task's ``seed`` option is drawn from the run's seed (a generated task's, unless set)."""
    from reservoir.tasks import task_class

    try:
        return task_class(task).generated
    except (ValueError, LookupError):  # a task no longer registered: its option taken as drawn
        return True


def fit_settings(r: dict[str, Any]) -> dict[str, Any]:
    """The settings of a probe's fit, beside its features' and its seed, that change its scores (the share of
    train held out, and training rows streamed to another solver); none for other results."""
    if r["mode"] != "output-only":
        return {}
    streamed = {"streamed": True} if r.get("streamed") else {}
    return {"val_fraction": ((r.get("config") or {}).get("fit") or {}).get("val_fraction"), **streamed}


def run_seed(r: dict[str, Any]) -> Any:
    """The seed a result's run drew its data with where the task follows it: its features' seed, or an
    end-to-end result's first seed."""
    identity = r.get("identity", {})
    return (identity.get("seeds") or [None])[0] if r["mode"] == "end-to-end" else identity.get("seed")


def drawn_data(r: dict[str, Any]) -> bool:
    """Whether a result's task drew its data from the run's seed (its ``seed`` option is the run's)."""
    options = r.get("identity", {}).get("task_options")
    return isinstance(options, dict) and options.get("seed") == run_seed(r) and follows_run_seed(r["task"])


def draws_data(r: dict[str, Any]) -> bool:
    """Whether a result's data may be drawn by its run's seed: generated from it (:func:`drawn_data`), or a
    ``--limit`` sample it took (a limit recorded without its sample's rule is taken as one)."""
    identity = r.get("identity", {})
    subset = identity.get("subset")
    sampled = subset.get("seed") == run_seed(r) if isinstance(subset, dict) else bool(identity.get("limit"))
    return drawn_data(r) or sampled


#: the key of what every seed of a row shares (:func:`split_by_source`)
ANY_SEED = "any seed"


def run_of(r: dict[str, Any]) -> str:
    """The producing run, short: every setting but what the seeds draw (:data:`SEED_DRAWN`,
    :data:`E2E_SEED_DRAWN`), so the seeds of one setting share a row, with a probe's fit settings
    (:func:`fit_settings`)."""
    identity = dict(r.get("identity", {}))
    end_to_end, first_seed = r["mode"] == "end-to-end", run_seed(r)
    if drawn_data(r):
        identity["task_options"] = {k: v for k, v in identity["task_options"].items() if k != "seed"}
    # a --limit sample is drawn by the run's seed too, and so are the classes it lost
    subset = identity.get("subset")
    if isinstance(subset, dict) and subset.get("seed") == first_seed:
        identity["subset"] = {k: v for k, v in subset.items() if k not in ("seed", "left_out")}
    drawn = E2E_SEED_DRAWN if end_to_end else SEED_DRAWN
    kept = {k: v for k, v in identity.items() if k not in drawn}
    return digest({**kept, "fit": fit_settings(r)} if fit_settings(r) else kept)[:6]


def row_key(r: dict[str, Any]) -> tuple:
    return (
        r["task"],
        r["backbone"],
        r["mode"],
        r["head"],
        ",".join(r["trainable"]),
        input_scale(r),
        run_of(r),
    )


def seeds_of(r: dict[str, Any]) -> set[Any]:
    """The seeds a result ran, those a row folds: an end-to-end result's every seed; a probe's, its features'
    seed with the fit's (of its validation split and torch head)."""
    identity = r.get("identity", {})
    if r["mode"] == "output-only":
        return {(identity.get("seed"), fitted_as(r)[0])}
    return set(identity.get("seeds") or [r.get("seed")])


def source_of(r: dict[str, Any], seed: Any) -> tuple[str, str]:
    """What a result's run of ``seed`` was computed from besides its settings: its data (:func:`data_key`) and
    its backbone's weights at that seed (folders of one name may hold others), with the token-embedding std
    ``--input-scale matched`` read (the fingerprint leaves the embedding out)."""
    identity = r.get("identity", {})
    weights = []
    for one, by_seed in (("backbone_fingerprint", "backbone_fingerprints"), ("matched_std", "matched_stds")):
        of_seeds = identity.get(by_seed) or {}
        weights.append(identity.get(one) or of_seeds.get(str(seed)) or of_seeds.get(seed))
    return data_key(r), str(weights[0]) if weights[1] is None else f"{weights[0]}:{weights[1]}"


def split_by_source(keyed: list[tuple[tuple, dict[str, Any]]]) -> dict[tuple, list[str]]:
    """Of ``(row key, result)``, the row keys whose results, at one depth, share a seed but not their source
    (:func:`source_of`: the data was edited between runs, files of one name hold other rows, folders of one
    name other weights), or whose data no seed draws (:func:`draws_data`) differs between seeds, each with
    what differs (``data``, ``weights``). Their results are not seeds of one experiment."""
    seen: dict[tuple, dict[Any, tuple[str, str]]] = defaultdict(dict)
    split: dict[tuple, set[int]] = defaultdict(set)
    for key, r in keyed:
        by_seed = seen[key, int(r["depth"])]
        for seed in seeds_of(r):
            source = source_of(r, seed[0] if isinstance(seed, tuple) else seed)
            first = by_seed.setdefault(seed, source)
            split[key] |= {i for i in (0, 1) if first[i] != source[i]}
            if not draws_data(r) and by_seed.setdefault(ANY_SEED, source)[0] != source[0]:
                split[key].add(0)  # data no seed draws is the same at every seed: another is an edited file
    return {key: [("data", "weights")[i] for i in sorted(differ)] for key, differ in split.items() if differ}


def told_apart(r: dict[str, Any], differ: list[str]) -> str:
    """What tells a result's row from others of its setting (:func:`split_by_source`), e.g. ``weights 1a2b3c``."""
    if not differ:
        return ""
    seed = next(iter(sorted(seeds_of(r), key=str)))
    source = dict(zip(("data", "weights"), source_of(r, seed[0] if isinstance(seed, tuple) else seed)))
    identity = r.get("identity", {})
    if r["mode"] != "output-only" and "weights" in differ:  # several seeds' weights: one digest of them all
        matched = {"matched": identity["matched_stds"]} if "matched_stds" in identity else {}
        source["weights"] = digest({"weights": identity.get("backbone_fingerprints"), **matched})
    elif ":" in source["weights"]:  # a fingerprint with the matched std: one digest of both
        source["weights"] = digest({"weights": source["weights"]})
    return ", ".join(f"{what} {source[what][:6]}" for what in differ)


def cut_at(r: dict[str, Any]) -> float | None:
    """The ``--max-time`` that cut an end-to-end result's runs short: its identity's, or where a result written before
    the identity recorded it says so only in its runs' stop reasons (:func:`reservoir.results.timed_out_at`), theirs."""
    if (recorded := r.get("identity", {}).get("max_time")) is not None:
        return recorded
    said = (timed_out_at(str(run.get("stop_reason", ""))) for run in r.get("runs") or [])
    return next((t for t in said if t is not None), None)


def collect(results: list[dict[str, Any]]) -> tuple[list[Row], list[dict[str, Any]]]:
    """Rows of the reservoir results (sorted) and the baseline results. Results of one setting fold into a row
    as its seeds; where two of them ran one seed on different data, each data set is a row of its own."""
    rows: dict[tuple, Row] = {}
    scored = [with_scores(r) for r in results]
    baselines = [r for r in scored if r["mode"] == "baseline"]
    keyed = [(row_key(r), r) for r in scored if r["mode"] != "baseline"]
    split = split_by_source(keyed)
    for key, r in keyed:
        cut = cut_at(r)  # seeds --max-time cut short: a row of their own, said so
        told = ", ".join(
            filter(None, [told_apart(r, split.get(key, [])), cut and f"cut at --max-time {cut:g} s"])
        )
        key = (*key, told)
        row = rows.setdefault(key, Row(*key))
        row.by_depth[int(r["depth"])].append(r)
    for row in rows.values():  # an end-to-end result folds its seeds; seeds run apart fold into one
        if row.mode == "output-only":  # fits of one seed (a seed that changed nothing): one of them
            for depth, rs in row.by_depth.items():
                kept: dict[frozenset, dict[str, Any]] = {}
                for r in rs:
                    kept.setdefault(frozenset(seeds_of(r)), r)
                row.by_depth[depth] = list(kept.values())
        if row.mode == "end-to-end":
            for depth, rs in row.by_depth.items():
                if len(rs) > 1 and all(r.get("runs") for r in rs):  # its data: every merged result's
                    row.by_depth[depth] = [
                        {**merge_seeds(rs), "data_keys": list(dict.fromkeys(map(data_key, rs)))}
                    ]
    order = sorted(rows, key=lambda k: (*k[:5], k[5] != "paper", *k[5:]))  # input scale "paper" first
    return [rows[k] for k in order], baselines


def class_names_of(row: Row) -> list[str] | None:
    """The names of a row's classes by id, where its data named them (its feature file's identity)."""
    names = row.results[0].get("identity", {}).get("class_names")
    return [str(n) for n in names] if names else None


def classes_line(rows: list[Row], most: int = 20) -> str:
    """``Classes: 0 cat, 1 dog, ...`` for rows whose data named their classes alike (the first ``most``)."""
    named = {tuple(n) for r in rows if r.mode == "output-only" and (n := class_names_of(r))}
    if len(named) != 1:
        return ""
    names = next(iter(named))
    shown = ", ".join(f"{k} {name}" for k, name in enumerate(names[:most]))
    return f"Classes: {shown}{f', ... ({len(names)} in all)' if len(names) > most else ''}"


def data_keys(row: Row) -> tuple[str, ...]:
    """The data of a row's results (:func:`data_key`), one key per data set (per seed, where it draws them)."""
    return tuple(dict.fromkeys(k for r in row.results for k in r.get("data_keys") or [data_key(r)]))


@dataclass
class DataGroup:
    """The output-only rows of one task computed on the same data (:func:`data_keys`), and that data in words."""

    task: str
    keys: tuple[str, ...]
    label: str
    rows: list[Row] = field(default_factory=list)

    @property
    def heads(self) -> set[str]:
        return {row.head for row in self.rows}


def data_groups(rows: list[Row], task: str, every_mode: bool = False) -> list[DataGroup]:
    """The output-only rows of ``task`` (``every_mode``: end-to-end ones too) grouped by :func:`data_keys`."""
    groups: dict[tuple[str, ...], DataGroup] = {}
    for row in rows:
        if row.task != task or not (every_mode or row.mode == "output-only"):
            continue
        keys = data_keys(row)
        subsets = [r.get("identity", {}).get("subset") or {} for r in row.results]
        seeds = sorted({s["seed"] for s in subsets if "seed" in s}, key=str)
        lost = sorted({c for s in subsets for c in s.get("left_out", ())})
        label = data_label(row.results[0], seeds, lost) + (
            f" ({len(keys)} data sets, one per seed)" if len(keys) > 1 else ""
        )
        groups.setdefault(keys, DataGroup(task, keys, label)).rows.append(row)
    labels = Counter(g.label for g in groups.values())
    for g in groups.values():  # data sets alike in words (an edited file, files of one name) told apart
        if labels[g.label] > 1:
            g.label += f" (data {', '.join(k[:6] for k in g.keys)})"
    return list(groups.values())


def fitted_as(r: dict[str, Any]) -> tuple[Any, Any]:
    """How a probe or baseline was fitted beside its data: its seed (of the validation split and the torch
    head; ``None`` where the result says it changed nothing) and the share of train held out."""
    seed = r.get("seed") if r.get("seeded", True) else None
    return seed, ((r.get("config") or {}).get("fit") or {}).get("val_fraction")


def baselines_of(group: DataGroup, baselines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The baselines of a group's data and heads, one per name and head, fitted as the group's probes were (on
    their data sets, at their seeds and share held out: :func:`fitted_as`) where there are such, else as they were.
    Several fits of a baseline are averaged (``test_score``), with ``test_std`` and ``n_data`` over them and
    ``of_data`` how many fits the group's probes had; ``other_fit`` says none was fitted as the probes were."""
    wanted = {(data_key(r), *fitted_as(r)) for row in group.rows for r in row.results}
    found: dict[tuple[str, str], dict[tuple, dict[str, Any]]] = defaultdict(dict)
    for b in baselines:
        if b["task"] != group.task or (b["head"] != "rule" and b["head"] not in group.heads):
            continue
        if data_key(b) in group.keys:
            found[(b["baseline"], b["head"])].setdefault((data_key(b), *fitted_as(b)), b)
    out = []
    for by_fit in found.values():
        bs = [b for fit, b in by_fit.items() if fit in wanted]
        other = not bs  # none fitted as the probes were: one per data set, said so
        bs = bs or list({key: b for (key, *_), b in reversed(by_fit.items())}.values())
        b = dict(bs[0], other_fit=other)
        if len(bs) > 1 or len(wanted) > 1:
            tests = [x["test_score"] for x in bs]
            b.update(
                test_score=float(np.mean(tests)),
                val_score=float(np.mean([x["val_score"] for x in bs])),
                test_std=float(np.std(tests, ddof=1)) if len(bs) > 1 else None,
                n_data=len(bs),
                of_data=len(wanted),
            )
        out.append(b)
    return sorted(out, key=lambda b: (baseline_rank(b["baseline"]), b["head"]))


def baseline_name(b: dict[str, Any]) -> str:
    """A baseline result's name in tables: the majority rule of real-valued targets is the train mean."""
    return baseline_label(display_name(b["baseline"], b.get("metric", "accuracy")))


def pct(x: float | None, std: float | None = None, n: int = 1) -> str:
    if x is None:
        return ""
    text = f"{100 * x:.1f}"
    if std is not None and n > 1:
        text += f" ± {100 * std:.1f} (n={n})"
    return text


def score_text(x: float | None, std: float | None = None, n: int = 1, metric: Metric | None = None) -> str:
    """A score as tables show it (a percentage for accuracies), with the spread over ``n`` seeds."""
    if metric is None or metric.percent:
        return pct(x, std, n)
    if x is None:
        return ""
    text = f"{x:.4g}"
    if std is not None and n > 1:
        text += f" ± {std:.2g} (n={n})"
    return text
