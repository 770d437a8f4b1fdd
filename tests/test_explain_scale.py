"""explain at scale (``search="tree"``): whole subtrees first, descending only where a module makes
most of its parent's share, and a stack of layers bisected. Counted in forwards, not seconds:
a 32-layer decoder (hidden 256, CPU) with a broken matmul in layer 20 is explained in at least
10x fewer forwards than measuring every module costs."""
from __future__ import annotations

from xray.explain import analysis
from xray.explain.examples import deep_llama, module_fault

FAULT_MODULE = "model.layers.20.mlp.up_proj"


def _llama(layers: int):
    model, args = deep_llama(layers=layers)
    forwards = [0]
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    return model, args, forwards


def _explain(model, args, search: str, fault: str):
    return analysis.explain(model, args, target="cpu", target_context=module_fault(model, fault), op_modules=0,
                            residual=False, search=search)


def test_a_32_layer_decoder_is_explained_in_a_tenth_of_the_per_module_forwards():
    # what measuring every module costs, per module, on the same layers (2 of them): fed, grafted
    # and the cumulative view (the residual, 2 more a module, is left out on both sides here)
    small, args, counted = _llama(2)
    x = _explain(small, args, "all", "model.layers.0.mlp.up_proj")
    per_module = counted[0] / len([r for r in x.rows if r.kind == "module"])
    assert 3 <= per_module <= 4

    model, args, counted = _llama(32)
    x = _explain(model, args, "tree", FAULT_MODULE)
    modules = [r for r in x.rows if r.kind == "module"]
    assert len(modules) > 400
    assert x.top == FAULT_MODULE  # reached along one path: model -> layers 16..31 -> ... -> layer 20 -> mlp
    assert counted[0] * 10 <= per_module * len(modules), (counted[0], per_module, len(modules))
    groups = [r for r in x.rows if r.kind == "group"]
    assert groups and all(r.module == "model" for r in groups)  # layers left whole, in runs
    assert sum(r.share is not None for r in modules) < 40  # the few modules measured one by one


def test_groups_left_whole_are_reported_and_can_be_the_largest_part(tmp_path):
    from xray.explain import report
    from xray.explain.analysis import Explanation, Row
    from xray.explain.verdict import verdict

    rows = [Row("module", "lm_head", "lm_head", "Linear", 1, 1, share=0.11, self_share=0.11),
            Row("group", "model.layers.4..7", "model", "4 x LlamaDecoderLayer", 3, 0, share=0.19, self_share=0.19)]
    x = Explanation("cpu", "cpu:bf16", 0.0078, rows, top="lm_head", search="tree",
                    compare={"verdict_kind": "precision", "verdict": "no row fails", "born": []})
    x.verdict = verdict(x)
    assert ("the largest part accumulates in model.layers.4..7 (4 x LlamaDecoderLayer, not descended), 19% of it"
            in x.verdict)
    assert "not descended (--search tree): model.layers.4..7 (4 x LlamaDecoderLayer) 19.0%" in report.terminal(x)
    assert "<code>model.layers.4..7</code>" in report.write_html(x, tmp_path / "x.html").read_text()
