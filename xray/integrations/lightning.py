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


class XrayLightningCallback(Callback):
    """Start PrecisionDebugger before each selected training batch, stop it after its optimizer
    step, write the file when training ends. Keyword arguments go to PrecisionDebugger."""

    def __init__(self, dump_path: str | os.PathLike = "xray_module_dump", *, step: Selection = None,
                 rank: Selection = None, **debugger_kwargs: Any) -> None:
        self.dump_path, self.step, self.rank, self.kwargs = dump_path, step, rank, debugger_kwargs
        self.debugger: PrecisionDebugger | None = None

    def on_train_start(self, trainer, pl_module):
        if self.debugger is None:
            self.debugger = PrecisionDebugger(self.dump_path, model=pl_module, step=self.step, rank=self.rank,
                                              process_rank=(trainer.global_rank, trainer.local_rank,
                                                            trainer.world_size), **self.kwargs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.debugger is not None:
            self.debugger.stop()  # a batch Lightning skipped the end hook of (a StopIteration, a skip)
            self.debugger.set_step(trainer.global_step)
            self.debugger.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.debugger is not None:
            self.debugger.stop()

    def on_train_end(self, trainer, pl_module):
        if self.debugger is not None:
            self.debugger.close()

    def on_exception(self, trainer, pl_module, exception):
        if self.debugger is not None:
            self.debugger.close()  # the steps captured so far reach the file
