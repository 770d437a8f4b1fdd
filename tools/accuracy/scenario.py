"""What one benchmark scenario is: a model, what differs in the target run, and how it is dumped."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import faults
from .user_bugs import UserBug


@dataclass(frozen=True)
class Fault:
    """Corrupt the ``call``-th ``op`` call in ``direction`` with ``kind`` (see CORRUPTIONS), at its
    ``output``-th floating-point output."""

    op: str
    call: int
    kind: str = "rel"
    amount: float = 1e-3
    direction: str = "forward"
    output: int = 0

    def corruption(self) -> faults.Corruption:
        return CORRUPTIONS[self.kind](self.amount)

    def __str__(self) -> str:
        where = "" if self.direction == "forward" else " (backward)"
        slot = f" output {self.output}" if self.output else ""
        return f"{self.kind}({self.amount:g}) at {self.op.removeprefix('aten.')}#{self.call}{slot}{where}"


CORRUPTIONS = {
    "rel": faults.relative,
    "few": lambda eps: faults.few_elements(3, eps),
    "spike": faults.spike,
    "zero-col": lambda col: faults.zero_column(int(col)),
    "int": lambda _: faults.int_bump(),
}

TF32_NOISES = ("tf32", "cudnn-rnn")  # targets that round matmul operands to TF32, as a CUDA run may
NOISES = ("bf16", "fp16", "tf32", "threads", "math-sdpa", "eager-vs-sdpa", "bn-kernel", "fused-rms-norm", "cudnn-rnn")


@dataclass(frozen=True)
class Scenario:
    """One bench/target pair. Exactly one cause of error is injected in fault scenarios (a
    corrupted call, a changed parameter element or a corrupting target-only op); noise-only
    scenarios have none and must compare without failures."""

    name: str
    cls: str  # the class the report groups by
    arch: str
    fault: Fault | None = None
    user_bug: UserBug | None = None  # one call made with a wrong argument in the target (user_bugs.py)
    param: str | None = None  # qualified name of a parameter with one element changed in the target
    target_only: str | None = None  # module path where the target runs one extra, corrupting op
    # (module path, attribute, value) set on the target's module: a deployment's wrong eps
    attribute: tuple[str, str, float] | None = None
    extra_op: str | None = None  # module path where the target runs one extra harmless op
    missing_op: str | None = None  # module path where only the bench runs one extra harmless op
    noise: str | None = None  # one of NOISES, applied to the target run
    wrap: str | None = None  # the target model is wrapped in a module, under this attribute name
    dump: str = "trace"  # "trace" (begin_dump), "module" (PrecisionDebugger), "module+aten"
    data: bool = True  # save tensors (else statistics only)
    backward: bool = False  # run loss.backward() and record backward ops
    inference: bool = False  # both runs' forwards under torch.inference_mode (composite ops recorded whole)
    optimizer: str | None = None  # then one AdamW step, implemented as archs.OPTIMIZERS names
    # both models in training mode: dropout drawn, batch norms on batch statistics (a batch of one
    # input is doubled by its mirror: a batch norm in training needs two values a channel)
    train_mode: bool = False
    dedup: bool = False  # both runs recorded with the recorder's default X_DEDUP=True
    dump_num: int | None = None  # X_DUMP_NUM where data is saved (None: every tensor of a call)
    # a TF32-emulated target ("tf32", and "cudnn-rnn": cuDNN's RNN kernel under its default
    # allow_tf32) is compared as a CUDA dump is, whose header allows TF32 (compare's --tf32 on);
    # False: as a run whose TF32 switch xray cannot read, told only by what the run itself shows
    tf32_declared: bool = True
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def noise_only(self) -> bool:
        return self.fault is None and self.param is None and self.target_only is None and self.attribute is None \
            and self.user_bug is None

    def describe(self) -> str:
        parts = [str(self.fault)] if self.fault else []
        if self.user_bug:
            parts.append(str(self.user_bug))
        if self.param:
            parts.append(f"param {self.param}[0,1] changed")
        if self.target_only:
            parts.append(f"target-only mul in {self.target_only}")
        if self.attribute:
            parts.append("{}.{} = {:g} in the target".format(*self.attribute))
        for label, value in (("noise", self.noise), ("AdamW", self.optimizer), ("mode", "train" if self.train_mode else None), ("wrap", self.wrap), ("extra op", self.extra_op),
                             ("missing op", self.missing_op), ("X_DEDUP", "on" if self.dedup else None),
                             ("X_DUMP_NUM", self.dump_num),
                             ("TF32", "undeclared" if self.noise in TF32_NOISES and not self.tf32_declared else None)):
            if value:
                parts.append(f"{label} {value}")
        return "; ".join(parts) or "-"
