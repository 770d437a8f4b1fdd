"""Crash and hang isolation: each backend runs in its own persistent ``spawn`` worker process.

A worker stays alive between jobs (imports and backend start-up are paid once); when a job
kills it (segfault, ``abort``) the job is CRASH, and when it does not answer in time it is
killed and the job is TIMEOUT. Either way the next job starts a fresh worker. The worker's
stdout/stderr go to a log file, whose tail is kept as the crash's error text.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import warnings
from pathlib import Path

from ..backends.base import ReplayStatus
from .job import Job, JobContext, JobResult, execute

_READY = "ready"


def _serve(conn, log_path: str, backend: str, threads: int, imports: tuple[str, ...] = ()) -> None:
    """Worker main loop: silence noisy imports into the log, then answer jobs until told to stop."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import torch

    torch.set_num_threads(threads)
    ctx = JobContext()
    try:
        import importlib

        for name in imports:  # e.g. modules that register custom ops the dump uses
            importlib.import_module(name)
        ctx.backend(backend)
        # Import the backend's libraries now, so the first job's timeout covers only its own work.
        b = ctx.backends[backend]
        b.versions()
    except Exception as e:  # noqa: BLE001 - the parent reports it for every job
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send((_READY, None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(execute(job, ctx))


class Worker:
    """A restartable worker process for one backend spec."""

    def __init__(self, backend: str, log_dir: Path, *, start_timeout: float = 300.0, threads: int = 1,
                 imports: tuple[str, ...] = ()) -> None:
        self.backend = backend
        self.log_path = Path(log_dir) / f"worker-{safe_name(backend)}.log"
        self.start_timeout = start_timeout
        self.threads = threads
        self.imports = tuple(imports)
        self.proc: mp.Process | None = None
        self.conn = None
        self.starts = 0
        self.unusable: str | None = None  # set when the backend cannot start here; no more retries

    def _start(self) -> str | None:
        """Start the process; return an error text when its set-up failed."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = (child, str(self.log_path), self.backend, self.threads, self.imports)
        self.proc = ctx.Process(target=_serve, args=args,
                                daemon=True, name=f"xray-replay-{self.backend}")
        try:
            self.proc.start()
        except (OSError, RuntimeError) as e:  # e.g. a script without `if __name__ == "__main__":`
            self.proc = None
            child.close()
            parent.close()
            return f"cannot start a worker process for {self.backend}: {' '.join(str(e).split())}"
        child.close()
        self.conn = parent
        self.starts += 1
        if not parent.poll(self.start_timeout):
            self.kill()
            return f"worker for {self.backend} did not start within {self.start_timeout:.0f} s"
        try:
            kind, detail = parent.recv()
        except EOFError:
            code = self._reap()
            return f"worker for {self.backend} died while starting ({_exit_text(code)}){self._log_tail()}"
        if kind != _READY:
            self.kill()
            return f"backend {self.backend} is not usable here: {detail}"
        return None

    def run(self, job: Job, timeout: float) -> JobResult:
        """Run ``job`` isolated; CRASH/TIMEOUT results when the worker dies or hangs."""
        if self.unusable is not None:
            return JobResult(int(ReplayStatus.RUN_FAIL), self.unusable)
        if self.proc is None or not self.proc.is_alive():
            error = self._start()
            if error is not None:
                if self.starts == 1:  # it never worked: every later job would fail the same way
                    self.unusable = error
                return JobResult(int(ReplayStatus.RUN_FAIL), error)
        log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self.conn.send(job)
            ready = self.conn.poll(timeout)
        except (BrokenPipeError, EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            return JobResult(int(ReplayStatus.TIMEOUT), f"no answer within {timeout:g} s; worker killed")
        try:
            return self.conn.recv()
        except (EOFError, OSError, ConnectionResetError):
            code = self._reap()
            return JobResult(int(ReplayStatus.CRASH),
                             f"worker process died ({_exit_text(code)}){self._log_tail(log_size)}")

    def _reap(self) -> int | None:
        if self.proc is not None:
            self.proc.join(timeout=10)
            code = self.proc.exitcode
            if code is None:
                self.kill()
            self.proc = None
            return code
        return None

    def _log_tail(self, start: int = 0, limit: int = 400) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return f"; log: {' | '.join(lines[-3:])[-limit:]}" if lines else ""

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=10)
        self.proc = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self.kill()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
