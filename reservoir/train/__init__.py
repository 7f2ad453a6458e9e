"""End-to-end FPT training: the model (:mod:`.model`), its checkpoints (:mod:`.checkpoint`),
named random streams (:mod:`.seeds`), the data of a run (:mod:`.data`), a step (:mod:`.step`),
one run and its stopping rule (:mod:`.run`), runs trained together (:mod:`.group`, :mod:`.batched`)
and the sweep (:mod:`.loop`)."""

from reservoir.train.checkpoint import RunState, load_checkpoint, save_checkpoint  # noqa: F401
from reservoir.train.data import Splits, batch_tensors, epoch_order, load_data  # noqa: F401
from reservoir.train.loop import summary, train  # noqa: F401
from reservoir.train.model import FPT, format_counts, param_counts, select_trainable  # noqa: F401
from reservoir.train.run import Evaluation, TrainingRun, train_run  # noqa: F401
from reservoir.train.step import Diverged, evaluate, train_step  # noqa: F401
