"""``XrayLightningCallback``: PrecisionDebugger in a Lightning ``Trainer``.

    trainer = L.Trainer(max_steps=100, callbacks=[XrayLightningCallback("xray_dump", step=[0, 50])])

The module dumped is the LightningModule. Steps are ``trainer.global_step`` (optimizer steps;
with ``accumulate_grad_batches`` > 1 the last micro-batch of a step is the one kept), ranks
``trainer.global_rank`` / ``trainer.local_rank``. Works with ``lightning`` and the older
``pytorch_lightning`` package (whichever is installed, ``lightning`` first).
"""
from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback

from ..debugger import PrecisionDebugger
from ..debugger.steps import Selection
from .runs import DebuggerRuns


class XrayLightningCallback(Callback):
    """Start PrecisionDebugger before each selected training batch, stop it after its optimizer
    step, write the file when training ends. Keyword arguments go to PrecisionDebugger. Each
    ``fit()`` gets its own debugger (a later one's file goes into ``<dump_path>/run-<n>/``), and
    no debugger error reaches training (``xray.integrations.runs``)."""

    def __init__(self, dump_path: str | os.PathLike = "xray_module_dump", *, step: Selection = None,
                 rank: Selection = None, **debugger_kwargs: Any) -> None:
        self.runs = DebuggerRuns(type(self).__name__, dump_path, step, rank, debugger_kwargs)

    @property
    def debugger(self) -> PrecisionDebugger | None:
        return self.runs.debugger

    def on_train_start(self, trainer, pl_module):
        self.runs.begin(pl_module, (trainer.global_rank, trainer.local_rank, trainer.world_size))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # (stopped first: a batch Lightning skipped the end hook of, a StopIteration or a skip)
        self.runs.step_begin(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.runs.step_end()

    def on_train_end(self, trainer, pl_module):
        self.runs.end()

    def on_exception(self, trainer, pl_module, exception):
        self.runs.end()  # the steps captured so far reach the file
