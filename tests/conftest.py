import contextlib
import os
import threading
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

# Triton's own library functions are decorated when triton is first imported, and only under
# TRITON_INTERPRET=1 can they run on CPU tensors; any test may import triton first (torch.compile
# does), so the flag is set here, before any test module, for tests/test_stats_triton.py.
# No CPU path of xray or torch launches a triton kernel, so nothing else sees it; where CUDA is
# present the kernels must compile for real, so the flag stays off.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class _StillRunning:
    """Under ``-n N`` the dots say nothing about what the workers are doing, and a long test looks
    like a hang: each time a test has run another ``EVERY`` seconds, one line names it and says how long.

    Only in the xdist controller, which receives the workers' start and finish events: there the
    tests run in other processes, so this thread's lines never land in a test's captured output.
    """

    EVERY = 30.0

    def __init__(self, reporter) -> None:
        self.reporter = reporter
        self.started: dict[str, float] = {}
        self.said: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="still-running", daemon=True)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.started[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.started.pop(nodeid, None)
        self.said.pop(nodeid, None)

    def _watch(self) -> None:
        while not self.stop.wait(1.0):
            now = time.monotonic()
            for nodeid, t0 in list(self.started.items()):
                ticks = int((now - t0) // self.EVERY)
                if ticks > self.said.get(nodeid, 0):
                    self.said[nodeid] = ticks
                    if self.reporter._tw.width_of_current_line:  # mid-way through a row of dots
                        self.reporter._tw.line()
                    self.reporter.write_line(f"   still running after {ticks * self.EVERY:.0f} s: {nodeid}")


def pytest_report_header(config):
    if config.option.markexpr == "not slow":
        return "slow tests (real models end to end, deployment backends, the wheel) left out: add -m slow to run them"


@pytest.hookimpl(trylast=True)  # after the terminal plugin has registered its reporter
def pytest_configure(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        watcher = _StillRunning(reporter)
        config.pluginmanager.register(watcher, "xray-still-running")
        watcher.thread.start()
        config.add_cleanup(watcher.stop.set)


@pytest.fixture(autouse=True)
def _no_leaked_dump():
    """Every test starts and ends without an active dump session."""
    from xray.record import session

    yield
    if session._ACTIVE is not None:
        session.end_dump()
        pytest.fail("test left a dump session active")


@pytest.fixture(scope="session")
def llama():
    from xray.demo.models import tiny_llama

    return tiny_llama(layers=2, hidden=64)


@pytest.fixture(scope="session")
def tokens():
    from xray.demo.models import token_batch

    return token_batch(batch=2, seq=16, vocab=256)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


class ScaleNthMM(TorchDispatchMode):
    """A scaling bug: the output of the n-th aten.mm is ``factor`` times too large, its direction
    unchanged. Entered *before* the dump, so the recorder's mode sits above it and records the scaled
    output (and not this mode's mul_). Test modules import it: ``from conftest import ScaleNthMM``."""

    def __init__(self, n: int, factor: float = 1.01) -> None:
        super().__init__()
        self.n, self.factor, self.calls = n, factor, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mm.default:
            self.calls += 1
            if self.calls == self.n:
                out.mul_(self.factor)
        return out


def record_forward(model, folder: Path, ids: torch.Tensor, fault: TorchDispatchMode | None = None,
                   autocast: bool = False, **dump_options) -> Path:
    """One no-grad forward of ``model`` on ``ids`` recorded into ``folder`` (the dump folder is
    returned); ``fault`` (e.g. ScaleNthMM) is entered before the dump, ``autocast`` runs it in bf16."""
    import xray

    with torch.no_grad(), fault if fault is not None else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
                xray.dump(dump_dir=folder, **dump_options) as d:
            model(ids)
    return d.folder


def sweep_noise_run(model_type: str, tmp_path: Path, defaults: bool = True, noise: str = "bf16",
                    backward: bool = True, train_mode: bool = False):
    """The architecture sweep's noise-only run of one transformers model (tools/accuracy: fp32
    bench against ``noise`` on the target), with the recorder's defaults or every call recorded;
    skipped where the installed transformers has no such model. Returns the Outcome, checked to
    have run without a crash or a harness error."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from accuracy import zoo
    from accuracy.runner import run_scenario
    from accuracy.scenario import Scenario
    from accuracy.scenarios import RECORDER_DEFAULTS

    entry = next((x for x in zoo.listed() if x.model_type == model_type), None)
    if entry is None:
        pytest.skip(f"this transformers has no {model_type}")
    flags = RECORDER_DEFAULTS if defaults else {"dedup": False, "dump_num": None}
    o = run_scenario(Scenario(f"t/{model_type}", "noise", zoo.register(entry), noise=noise, backward=backward,
                              train_mode=train_mode, **flags), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    return o


@pytest.fixture
def one_record_per_key(monkeypatch):
    """De-dup with one record per key (X_DEDUP_RECORDS=1, X_DEDUP_PASS_RECORDS=1): every later
    call of a key folds, in its first pass too, as the tests of folding itself need (the default
    gives each key two records first, and a record per call of its first pass)."""
    monkeypatch.setenv("X_DEDUP_RECORDS", "1")
    monkeypatch.setenv("X_DEDUP_PASS_RECORDS", "1")
