"""Output folders a command owns: writable before any work starts, held by one process at a time, and cleared of an
older run's files as a whole.

A lock is an advisory ``flock`` on a hidden file in the folder: the kernel drops it when its process ends, however it
ends, so a killed run never leaves a folder stuck; the file records who holds it, for the message a second writer
gets.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from elastic_attention.errors import ConfigError

LOCK_FILE = ".elastic-attention.lock"
#: Prefix of the hidden folder an older run's files are moved into before they are deleted.
REPLACED_PREFIX = ".replaced-"


def check_writable(folder: str | Path, what: str) -> Path:
    """Create ``folder`` (and its parents) when missing and write a probe file in it.

    Args:
        folder: the output folder.
        what: what goes there, for the message (``"the run"``, ``"the evaluation"``).

    Raises:
        ConfigError: the folder cannot be created or written, with the reason and the fix.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"cannot write {what} to {folder}: {reason}; choose a folder you can write") from None
    return folder


class FolderLock:
    """One process's hold on an output folder (a context manager; `release` also ends it).

    Args:
        folder: the folder (created when missing).
        what: what the folder holds, for the message (``"a training run"``).
    """

    def __init__(self, folder: str | Path, what: str) -> None:
        self.folder = Path(folder)
        self.what = what
        self._handle = None

    def acquire(self) -> FolderLock:
        """Take the lock.

        Raises:
            ConfigError: another process holds it (named: process id, host, command, since when).
        """
        check_writable(self.folder, self.what)
        handle = open(self.folder / LOCK_FILE, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _holder(handle.read())
            handle.close()
            raise ConfigError(f"{self.folder} is in use by {holder}; wait for it to end or choose another folder"
                              ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
                                 "command": " ".join(sys.argv),
                                 "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}))
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return (f"process {holder['pid']} on {holder['host']} ({holder['command'][:120]}, since "
                f"{holder['since']}), which writes {holder['what']} there")
    except (ValueError, KeyError, TypeError):
        return "another process"


def move_aside(folder: str | Path, names: list[str]) -> Path | None:
    """Move the entries ``names`` of ``folder`` into one new hidden sibling folder inside it, all or none: a
    rename moves a symbolic link itself, never what it points to; if a rename fails, the entries already moved go
    back and the error is raised. Returns the folder holding them (delete it with `delete_moved`), None when
    ``names`` is empty."""
    folder = Path(folder)
    if not names:
        return None
    aside = Path(tempfile.mkdtemp(prefix=REPLACED_PREFIX, dir=folder))
    moved = []
    try:
        for name in names:
            os.rename(folder / name, aside / name)
            moved.append(name)
    except OSError:
        for name in reversed(moved):
            os.rename(aside / name, folder / name)
        aside.rmdir()
        raise
    return aside


def delete_moved(aside: Path | None) -> None:
    """Delete what `move_aside` moved (links are removed, never followed), and any such folder a killed command
    left beside it."""
    if aside is None:
        return
    for leftover in aside.parent.glob(REPLACED_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
