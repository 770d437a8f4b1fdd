"""Which writer a dump folder belongs to: two writers never share one.

A folder holds one dump. Its ``owner.pid`` names the writer as ``<pid> <host> <token>`` (the
token is one per writer). A writer takes a folder that is new, or whose owner is a process of
this host that has exited (a re-run replaces its old dump, as always); a folder owned by a live
process, by another host, or by an earlier writer of this same process (a second session into
the same ``dump_dir``) is left alone, and the writer gets ``<folder>.<pid>`` (then
``<folder>.<pid>-2``...) beside it.
"""
from __future__ import annotations

import os
import platform
import secrets
import warnings
from pathlib import Path

from .writer import DumpWriteError

OWNER = "owner.pid"  # the writer of the folder (pid host token [released]), or a bare pid (older xray)
RELEASED = "released"
TRIES = 1000


def new_token() -> str:
    return secrets.token_hex(6)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill would terminate it there: assume the owner still runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in platform.node()) or "-"


def _may_take(text: str, token: str, keep_earlier: bool) -> bool:
    """Whether the writer ``token`` of this process may take a folder whose owner file says ``text``."""
    parts = text.split()
    try:
        pid = int(parts[0])
    except (IndexError, ValueError):
        return True  # an unreadable owner file: no writer can be proven to hold the folder
    if len(parts) >= 3:
        host, other = parts[1], parts[2]
        if other == token:
            return True  # this writer again (a paused session resumed)
        if host != _host():
            return False  # another machine on a shared file system: cannot tell whether it runs
        if pid == os.getpid():  # an earlier writer of this process: its dump stays, unless it was
            return not keep_earlier and parts[3:] == [RELEASED]  # finished and a re-run may replace it
    elif pid == os.getpid():
        return True  # an older xray's owner file with a reused pid: that process has exited
    return not _alive(pid)


def claim_folder(folder: Path, token: str, keep_earlier: bool = True) -> bool:
    """Make the writer ``token`` the folder's owner unless ``_may_take`` says no.

    The owner file is written whole under a private name and linked into place, so two
    processes claiming at once cannot both win, nor read a half-written owner."""
    folder.mkdir(parents=True, exist_ok=True)
    owner = folder / OWNER
    me = f"{os.getpid()} {_host()} {token}"
    tmp = folder / f".{OWNER}.{os.getpid()}.{token}.tmp"
    tmp.write_text(me)
    try:
        try:
            os.link(tmp, owner)
            return True
        except FileExistsError:
            pass
        except OSError:  # no hard links on this file system: exclusive create instead
            try:
                with open(owner, "x") as f:
                    f.write(me)
                return True
            except FileExistsError:
                pass
        try:
            text = owner.read_text()
        except OSError:
            text = ""
        if not _may_take(text, token, keep_earlier):
            return False
        os.replace(tmp, owner)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def own_folder(folder: Path, token: str, *, keep_earlier: bool = True) -> Path:
    """``folder``, or the first free ``<folder>.<pid>[-<n>]`` beside it (with a warning).
    ``keep_earlier=False``: a folder an earlier writer of this process released
    (``release_folder``) is taken over, as a re-run's output replaces the last one's."""
    folder = Path(folder)
    try:
        if claim_folder(folder, token, keep_earlier):
            return folder
        pid = os.getpid()
        for n in range(1, TRIES + 1):
            mine = folder.with_name(f"{folder.name}.{pid}" + (f"-{n}" if n > 1 else ""))
            if claim_folder(mine, token, keep_earlier):
                break
        else:
            raise DumpWriteError(f"cannot write dump folder {folder}: {TRIES} folders beside it are taken")
    except OSError as e:
        if isinstance(e, DumpWriteError):
            raise
        raise DumpWriteError(f"cannot write dump folder {folder}: {e.strerror or e}") from e
    warnings.warn(f"xray: {folder} is being written by another process, or holds an earlier dump of this "
                  f"one (see its {OWNER}); "
                  f"this one goes into {mine}", RuntimeWarning, stacklevel=3)
    return mine


def release_folder(folder: Path, token: str) -> None:
    """Mark the folder finished by the writer ``token`` (for ``keep_earlier=False`` claims)."""
    owner = Path(folder) / OWNER
    me = f"{os.getpid()} {_host()} {token}"
    try:
        if owner.read_text().split() == me.split():
            tmp = owner.with_name(f".{OWNER}.{token}.released.tmp")
            tmp.write_text(f"{me} {RELEASED}")
            os.replace(tmp, owner)
    except OSError:
        pass  # the folder stays claimed: a later writer of this process goes beside it


# An output folder a command builds (drift's eager dump, its per-backend dumps, its staging) is
# replaced by the next run of that command only when it carries this marker: a folder without it
# is the user's, and is refused, never deleted.
OUTPUT_MARKER = ".xray-output"


class OutputFolderError(ValueError):
    """An output folder that exists and was not written by the command that would replace it."""


def check_output(folder: Path, command: str) -> None:
    """Raise ``OutputFolderError`` unless ``command`` may replace ``folder``: it is absent, empty,
    or carries the marker ``command`` wrote there (``mark_output``)."""
    folder = Path(folder)
    if not os.path.lexists(folder):
        return
    if folder.is_symlink() or not folder.is_dir():
        raise OutputFolderError(f"{folder} exists and is not a folder; {command} needs it for its output "
                                "(pass another --out; nothing was deleted)")
    marker = folder / OUTPUT_MARKER
    try:
        mine = marker.is_file() and not marker.is_symlink() and marker.read_text().split("\n")[0] == command
    except OSError:
        mine = False
    if not mine and any(folder.iterdir()):
        raise OutputFolderError(f"{folder} holds files {command} did not write; move them or pass another --out "
                                "(nothing was deleted)")


def replace_output(folder: Path, command: str) -> Path:
    """``folder`` emptied and marked as ``command``'s (``check_output`` first: never the user's)."""
    import shutil

    folder = Path(folder)
    check_output(folder, command)
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    mark_output(folder, command)
    return folder


def mark_output(folder: Path, command: str) -> None:
    """Mark ``folder`` as written by ``command``, which may replace it on a later run."""
    (Path(folder) / OUTPUT_MARKER).write_text(f"{command}\nwritten by `{command}`; its next run into the same "
                                              "--out replaces this folder\n")
