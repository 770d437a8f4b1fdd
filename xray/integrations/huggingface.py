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
from .runs import DebuggerRuns


class XrayTrainerCallback(TrainerCallback):
    """Start PrecisionDebugger at each selected step's beginning, stop it after the optimizer
    step, write the file at the end of training. Keyword arguments go to PrecisionDebugger
    (``task``, ``hook_name``, ``dump_torch_api``, ``backward``...). Each ``train()`` gets its
    own debugger (a later one's file goes into ``<dump_path>/run-<n>/``), and no debugger
    error reaches training (``xray.integrations.runs``)."""

    def __init__(self, dump_path: str | os.PathLike = "xray_module_dump", *, step: Selection = None,
                 rank: Selection = None, **debugger_kwargs: Any) -> None:
        self.runs = DebuggerRuns(type(self).__name__, dump_path, step, rank, debugger_kwargs)

    @property
    def debugger(self) -> PrecisionDebugger | None:
        return self.runs.debugger

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.runs.begin(model, (args.process_index, args.local_process_index, args.world_size))

    def on_step_begin(self, args, state, control, **kwargs):
        self.runs.step_begin(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.runs.step_end()

    def on_train_end(self, args, state, control, **kwargs):
        self.runs.end()
