"""A console script whose reader goes away (``xray info DUMP | head``) ends quietly, as a Unix
tool does, instead of with a BrokenPipeError traceback, at once or at exit's flush."""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable

Main = Callable[[list[str] | None], int]


def closed_pipe_is_quiet(main: Main) -> Main:
    """Wrap a console script's ``main(argv)``: output cut off by a closed pipe exits 0, silently."""
    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            code = main(argv)
            sys.stdout.flush()  # the last buffered block meets the closed pipe here, not at exit
            return code
        except BrokenPipeError:
            try:  # Python flushes stdout again at exit: let that flush go nowhere
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
                pass
            return 0
    return run
