"""``XrayTrainerCallback``: PrecisionDebugger in a Hugging Face ``transformers.Trainer``.

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[XrayTrainerCallback("xray_dump", step=[0, 5], task="statistics")])

The dump is one ``xray-module`` file per rank (``<dump_path>/globalrank-<g>_localrank-<l>.h5``),
read by ``xray.load_dump``, xray-summary and xray-compare. Steps are the Trainer's
``state.global_step`` (optimizer steps; with gradient accumulation, a step's micro-batches are
one capture), ranks its ``args.process_index`` / ``args.local_process_index``.
"""
from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from ..debugger import PrecisionDebugger
from ..debugger.steps import Selection


class XrayTrainerCallback(TrainerCallback):
    """Start PrecisionDebugger at each selected step's beginning, stop it after the optimizer
    step, write the file at the end of training. Keyword arguments go to PrecisionDebugger
    (``task``, ``hook_name``, ``dump_torch_api``, ``backward``...)."""

    def __init__(self, dump_path: str | os.PathLike = "xray_module_dump", *, step: Selection = None,
                 rank: Selection = None, **debugger_kwargs: Any) -> None:
        self.dump_path, self.step, self.rank, self.kwargs = dump_path, step, rank, debugger_kwargs
        self.debugger: PrecisionDebugger | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.debugger is None:
            self.debugger = PrecisionDebugger(self.dump_path, model=model, step=self.step, rank=self.rank,
                                              process_rank=(args.process_index, args.local_process_index,
                                                            args.world_size), **self.kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.debugger is not None:
            self.debugger.set_step(state.global_step)
            self.debugger.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.debugger is not None:
            self.debugger.stop()

    def on_train_end(self, args, state, control, **kwargs):
        if self.debugger is not None:
            self.debugger.close()
