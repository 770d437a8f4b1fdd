"""The xray pytest plugin (registered via the ``pytest11`` entry point ``xray``)."""
from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("xray", "xray generated op tests")
    group.addoption("--device", default="cpu", help="torch device the generated op tests run on")
    group.addoption("--seed", type=int, default=0, help="seed for random input factories")
    group.addoption("--detail_compare_path", "--detail-compare-path", dest="xray_detail_compare_path",
                    default=None, help="write one CSV row per generated op test here")
