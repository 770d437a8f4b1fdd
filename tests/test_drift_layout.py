"""Whole-model intermediates get compare's layout check (issue 19, export-validator's NCHW/NHWC
check): a backend that holds a convolution's output channels-last is reported as a layout, never
compared in memory order and never dropped."""
from __future__ import annotations

import torch

from xray.backends.base import ModelCapture
from xray.compare import compare_dumps
from xray.drift.capture_dump import CaptureResolver, write_capture
from xray.drift.reference import record_reference
from xray.dump import load_dump


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.conv(x).relu().mean((2, 3)))


def test_a_channels_last_intermediate_is_reported_as_a_layout(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    ref = record_reference(Net().eval(), (x,), {}, tmp_path / "ref")
    conv = next(n for n in ref.node_seq if "convolution" in n)
    values = {n: [t.clone() for t in v] for n, v in ref.values.items()}
    values[conv] = [values[conv][0].permute(0, 2, 3, 1).contiguous()]  # NHWC, values right
    capture = ModelCapture(outputs=list(ref.outputs), values=values, granularity="every node")
    for placeholder, t in ref.user_placeholders.items():
        capture.values.setdefault(placeholder, [t])
    with load_dump(ref.dump) as eager:
        written = write_capture(tmp_path / "nhwc", eager, capture,
                                CaptureResolver(capture, ref.seq_node, ref.state, ref.placeholder_args),
                                ref.seq_node, backend="test", options={})
    assert not written.misshapen
    rows = [r for r in compare_dumps(ref.dump, written.folder).rows if r.bench_seq == ref.node_seq[conv]]
    assert rows and rows[0].layout and "permute" in rows[0].layout, [(r.status, r.layout, r.note) for r in rows]
