"""End-to-end FPT training: the model (:mod:`.model`), its checkpoints (:mod:`.checkpoint`),
named random streams (:mod:`.seeds`) and the loop (:mod:`.loop`)."""

from reservoir.train.checkpoint import RunState, load_checkpoint, save_checkpoint  # noqa: F401
from reservoir.train.loop import (  # noqa: F401
    Diverged,
    Evaluation,
    Splits,
    TrainingRun,
    batch_tensors,
    epoch_order,
    evaluate,
    load_data,
    summary,
    train,
    train_run,
    train_step,
)
from reservoir.train.model import FPT, format_counts, param_counts, select_trainable  # noqa: F401
