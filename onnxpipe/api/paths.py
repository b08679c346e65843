"""Checks of the paths a request writes or reads, run before anything is loaded or measured.

A request that loads a 650 MB model for 15 s and then refuses its output path, its picture's file name
or a missing matplotlib has wasted the user's time; every such refusal is made here first, from the
arguments and the file system alone, in one line with the documented exit code.  A path is writable
when a file can really be made there (a probe file made and removed in the nearest folder that exists):
permission bits do not say it for root, nor for a read-only file system.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.extras import install_hint
from onnxpipe.core.options import opt
from onnxpipe.planning.draw import SUFFIXES


def _nearest_folder(path: Path) -> Path:
    """The folder ``path`` (a file or folder to be made) would be created in, or the nearest one above
    it that exists, where the missing ones would be created."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in ``folder``, or None when one can (a probe file made and removed)."""
    if not folder.is_dir():
        return f"{folder} is not a folder"
    probe = folder / f".onnxpipe-probe-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return _reason(e)
    os.close(fd)
    probe.unlink(missing_ok=True)
    return None


def _reason(e: OSError) -> str:
    if e.errno == errno.EROFS:
        return "the file system is read-only"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return e.strerror or str(e)


def check_output_file(path: Path, field: str) -> None:
    """Refuse an output file ``path`` that cannot be written: a folder, or in a folder where no file can be
    made; the line names the option ``field`` to change."""
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; give {opt(field)} a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{path}: cannot be written (permission denied); choose another {opt(field)}")
    folder = _nearest_folder(path)
    why = _cannot_write_in(folder)
    if why is not None:
        raise UsageError(f"{path}: cannot be written ({why} in {folder}); choose another {opt(field)}")


@contextlib.contextmanager
def writing(path: Path, field: str) -> Iterator[None]:
    """Writing the output file ``path`` (checked before the work by :func:`check_output_file`): an
    ``OSError`` that still comes is one line naming the option ``field`` to change."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"{path}: cannot be written ({e.strerror or e}); choose another {opt(field)}") from e


def check_output_folder(path: Path) -> None:
    """Refuse a split's output folder that cannot be made: split writes its stages into a temporary
    folder beside it and renames it, so the folder it lives in must take a new entry."""
    why = _cannot_write_in(_nearest_folder(path if path.name not in ("", ".", "..") else path.absolute()))
    if why is None and path.is_dir() and not any(path.iterdir()):
        why = _cannot_write_in(path)  # an empty folder stays: the stages move into it, one by one
    if why is not None:
        raise ExportError(f"{path}: cannot be written ({why}); choose another {opt('out')}")


def check_plot(path: Path) -> None:
    """Refuse a picture to draw before the work: a format not drawn, matplotlib missing, not writable."""
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(
            f"{path}: cannot tell the picture format; give a file name ending in " + " or ".join(SUFFIXES)
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            f"{opt('plot')} needs matplotlib, which is not installed; {install_hint('plot')}, "
            f"or leave out {opt('plot')}"
        )
    check_output_file(path, "plot")
