"""xray fix and explain on fp16 overflows that grafts cannot rank: a graft casts the bench's
value to fp16, Inf again, so every share is 0. The search starts where the first Inf/NaN is born
(compare's nan/inf status, in the target's order) and tries islands around it: an overflow in
the model's own code between two submodules, one at a hand-off between modules, and one inside
a module that moves downstream once that module runs in fp32."""
from __future__ import annotations

import pytest
import torch

from xray.explain import analysis, hooks
from xray.explain.examples import overflow_between_modules, overflow_in_parent_code, overflow_inside_module
from xray.explain.search import fix
from xray.explain.spec import parse_spec
from xray.explain.trees import error

BOUND = 1e-2


def _fix(factory):
    model, args = factory()
    return fix(model, args, target="cpu:fp16", max_error=BOUND)


def test_overflow_in_the_parents_own_code_is_fixed_by_its_producer_in_fp32():
    """``h = self.big(h) * 300.0``: fix answered "no set of fp32 islands ... (all of them: inf)"."""
    f = _fix(overflow_in_parent_code)
    assert f.error_before == float("inf")
    assert f.born.startswith("<root>/aten.mul.Tensor#")  # born in the model's own forward
    assert f.found and f.modules == ["big"] and f.error_after <= BOUND  # the producer, its fp32 output carried on
    assert f.ops == {"big": ["aten.addmm.default"]} and f.error_after_ops <= BOUND


def test_overflow_between_modules_is_fixed_by_the_module_that_casts():
    f = _fix(overflow_between_modules)
    assert f.born.startswith("down/")
    assert f.found and f.modules == ["down"] and f.error_after <= BOUND
    # the cast is autocast's, before any op of down can run in fp32: the op step says so
    assert not f.ops and any("then ops: none of the" in n and "down" in n for n in f.notes)


def test_overflow_inside_a_module_is_followed_downstream():
    """``up`` in fp32 stops its own overflow, and its fp32 output overflows where ``down`` casts it."""
    f = _fix(overflow_inside_module)
    assert f.born.startswith("up/aten.native_layer_norm")
    assert f.found and sorted(f.modules) == ["down", "up"] and f.error_after <= BOUND
    assert any("the next Inf/NaN followed" in n for n in f.notes)


def test_pasted_fix_for_the_parent_overflow_does_the_same():
    f = _fix(overflow_in_parent_code)
    model, args = overflow_in_parent_code()
    namespace = {"model": model}
    exec(f.code, namespace)  # noqa: S102 - the code xray printed, as a user pastes it
    with analysis.capped_threads(1):
        bench = hooks.run(overflow_in_parent_code()[0], args, {}, parse_spec("cpu")).final
        fixed = hooks.run(namespace["model"], args, {}, parse_spec("cpu:fp16")).final
    assert f.found and error(fixed, bench) == f.error_after <= BOUND


@pytest.fixture(scope="module")
def parent_explained():
    model, args = overflow_in_parent_code()
    return analysis.explain(model, args, target="cpu:fp16", residual=False)


def test_explain_names_where_the_overflow_is_born_and_who_made_its_input(parent_explained):
    x = parent_explained
    assert x.first_nonfinite.startswith("<root>/aten.mul.Tensor#")
    assert x.birth["producers"][0] == "big"
    assert x.verdict.startswith(f"final error inf: the first Inf/NaN the bench does not have comes out of "
                                f"{x.first_nonfinite} (its input made by big)")  # not "norm makes 100%"
    born = x.row(x.first_nonfinite)
    assert born is not None and born.kind == "op" and born.key  # in the op table, whatever its share


class _Functional(torch.nn.Module):
    """``F.linear(x, w) * 300`` in the model's own forward: no submodule makes the product's input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64) * 20.0)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(torch.nn.functional.linear(x, self.w) * 300.0)


def _functional():
    torch.manual_seed(0)
    return _Functional().eval(), (torch.randn(4, 64),)


def test_overflow_in_functional_code_keeps_that_op_kind_of_the_model_in_fp32():
    f = _fix(_functional)
    assert f.born.startswith("<root>/aten.mul.Tensor#")
    assert f.found and f.modules == [] and f.ops == {"": ["aten.mul.Tensor"]} and f.error_after <= BOUND
    model, args = _functional()
    namespace = {"model": model}
    exec(f.code, namespace)  # noqa: S102 - the code xray printed
    with analysis.capped_threads(1):
        bench = hooks.run(_functional()[0], args, {}, parse_spec("cpu")).final
        fixed = hooks.run(namespace["model"], args, {}, parse_spec("cpu:fp16")).final
    assert error(fixed, bench) == f.error_after
