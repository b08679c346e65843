"""The output folder of a split, made atomically: all of it appears, or nothing changes.

:func:`staged_folder` hands out a temporary folder next to ``out``; when the block ends without error
the temporary folder is renamed to ``out``.  With ``force`` an existing ``out`` is swapped with it in one
step where the OS can (Linux), else first renamed aside, and deleted only once the new one is in place,
so a failure at any step (a full disk, a stage that fails its checks or its verification, Ctrl-C)
leaves the user's old folder exactly as it was and no half-written one behind, and removes the parent
folders it had to create.

:func:`check_target` refuses, before any work, a target that is a file or a non-empty folder without
``force``.  ``force`` replaces only what a split wrote: a non-empty folder is replaced only when it holds
a previous split (its ``manifest.json``, or an encoder-decoder's ``seq2seq.json`` and its two split
folders), and never when it holds the source model or is the current folder or one above it (the process
would be left in a deleted folder).  Anything else of the user's is refused, not deleted.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from onnxpipe.core.errors import ExportError, ManifestError
from onnxpipe.core.model_config import GENAI_CONFIG_NAME
from onnxpipe.core.options import opt
from onnxpipe.core.text import names_text
from onnxpipe.core.tokenizer_files import tokenizer_files
from onnxpipe.manifest import MANIFEST_NAME, load_manifest
from onnxpipe.manifest.seq2seq import Seq2SeqRecord, read_seq2seq


def normalized(out_dir: str | Path) -> Path:
    """``out_dir`` as a folder that can be renamed (``.`` and ``..`` made absolute)."""
    out = Path(out_dir)
    return Path(os.path.abspath(out)) if out.name in ("", ".", "..") else out


def check_target(out: Path, *, force: bool, protected: Iterable[Path | None] = ()) -> None:
    """Refuse ``out`` unless it is absent, empty, or (with ``force``) a previous split that may go.

    A non-empty ``out`` is refused when it holds a ``protected`` path (the source model), is the current
    folder or one of its parents, or holds no ``manifest.json`` (it is not a split's), with or without
    ``force``, saying why ``force`` would not replace it; an earlier split without ``force`` is refused
    naming what ``force`` would replace.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"{out}: exists and is not a folder; choose another {opt('out')}")
    if not out.exists() or not any(out.iterdir()):
        return
    root = out.resolve()
    for p in protected:
        if p is not None and p.resolve().is_relative_to(root):
            raise ExportError(
                f"{out}: holds the source model {p.name}; {opt('force', True)} would delete it; choose "
                f"another {opt('out')}"
            )
    check_replaceable(out)
    if not force:
        written = sorted(p.name for p in out.iterdir() if p.name in _written_by_the_split(out))
        added = [p.name for p in added_by_the_user(out)]
        kept = f" (the {names_text(added, 3)} you added stay)" if added else ""
        raise ExportError(
            f"{out}: exists and holds an earlier split ({names_text(written, 3)}); choose another "
            f"{opt('out')} or pass {opt('force', True)} to replace it{kept}"
        )


def check_replaceable(out: Path) -> None:
    """Refuse to replace the non-empty folder ``out`` unless it is a previous split away from the cwd."""
    cwd = _current_folder()
    if cwd is not None and cwd.is_relative_to(out.resolve()):
        where = "is the current folder" if cwd == out.resolve() else "holds the current folder"
        raise ExportError(
            f"{out}: {where}; {opt('force', True)} would delete it; choose another {opt('out')} or run from "
            "elsewhere"
        )
    mark = out / MANIFEST_NAME
    family = _family(out)
    if family is None and (mark.is_symlink() or not mark.is_file()):
        raise ExportError(
            f"{out}: exists, is not empty and holds no earlier split ({MANIFEST_NAME}); choose another "
            f"{opt('out')} or empty it ({opt('force', True)} replaces only an earlier split)"
        )
    written = _written_by_the_split(out)
    carried = {p.name for p in tokenizer_files(out)}
    unknown = sorted(p.name for p in out.iterdir() if p.name not in written | carried)
    if unknown:
        raise ExportError(
            f"{out}: holds {names_text(unknown, 3)}, which no split wrote; {opt('force', True)} replaces "
            f"only an earlier split's own files: move them, or choose another {opt('out')}"
        )
    for part in _parts(family):  # an encoder-decoder's two splits: each replaceable as any split
        check_replaceable(out / part)


def added_by_the_user(out: Path) -> list[Path]:
    """The tokenizer, chat template and generation files in the split folder ``out`` that its split did
    not write (a ``chat_template.jinja`` put there for ``generate --chat``): a split that replaces
    ``out`` carries them across."""
    written = _written_by_the_split(out)
    return [p for p in tokenizer_files(out) if p.name not in written]


def _written_by_the_split(out: Path) -> set[str]:
    """The names a split wrote into ``out``: its manifest and the files the manifest lists (stages, their
    weights, a decoder's tokenizer files), the ONNX Runtime GenAI config; by their pattern where the
    manifest cannot be read."""
    family = _family(out)
    if family is not None:
        return set(family.written())
    names = {MANIFEST_NAME, GENAI_CONFIG_NAME}
    try:
        manifest = load_manifest(out, check_files=False)
    except ManifestError:
        return names | {p.name for p in out.glob("stage_*.onnx*")}
    names |= {f for st in manifest.stages for f in (st.file, st.external_data) if f is not None}
    model = manifest.plan.decoder.model if manifest.plan.decoder is not None else None
    return names | set(model.files if model is not None else ())


def _family(out: Path) -> Seq2SeqRecord | None:
    """The record of the encoder-decoder split in ``out``; ``None`` where there is none or it cannot be
    read (then ``out`` is no split's, and is refused)."""
    if out.is_symlink() or not out.is_dir():
        return None
    try:
        record = read_seq2seq(out)
    except ManifestError:
        return None
    if record is None or not all(_parts(record)):
        return None
    return record


def _parts(family: Seq2SeqRecord | None) -> tuple[str, ...]:
    """The two split folders of an encoder-decoder's split, by name; an empty name for one that is not a
    plain folder name (a record pointing out of its folder names nothing of its own)."""
    if family is None:
        return ()
    return tuple(
        p if Path(p).name == p and p not in ("", ".", "..") else "" for p in (family.encoder, family.decoder)
    )


def _current_folder() -> Path | None:
    try:
        return Path.cwd().resolve()
    except OSError:  # the current folder was deleted: no folder on disk holds it
        return None


@contextmanager
def staged_folder(
    out: Path, *, last: str | None = None, replaceable: Callable[[Path], None] | None = None
) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``out``; on success it becomes ``out``, else it vanishes.

    ``last`` names the file that must appear last (the manifest) when files move into an empty ``out``.
    ``replaceable`` refuses a non-empty ``out`` that may not be replaced (default: a split's own check,
    :func:`check_replaceable`, which also carries the files the user added across).
    """
    created = _make_parents(out.parent)
    try:
        tmp = _make_temporary(out)
    except OSError as e:
        _remove_empty(created)
        raise ExportError(
            f"{out.parent}: cannot create a temporary folder ({reason(e)}){hint(e, _ANOTHER_OUT)}"
        ) from e
    try:
        yield tmp
        _move_into_place(tmp, out, last, replaceable)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise


@contextmanager
def writing(final: Path, out: Path) -> Iterator[None]:
    """Turn an OSError while writing ``final`` into an ExportError that names it (as it will be named)."""
    try:
        yield
    except OSError as e:
        raise ExportError(
            f"{final}: cannot be written ({reason(e)}); {out} is left as it was{hint(e, '')}"
        ) from e
    except ValueError as e:  # onnx refuses protos over 2 GB with a ValueError
        raise ExportError(f"{final}: cannot be written: {e}") from e


def reason(e: OSError) -> str:
    text = e.strerror or str(e) or type(e).__name__
    return f"{text}: disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else text


_ANOTHER_OUT = f"choose another {opt('out')}"


def hint(e: OSError, otherwise: str) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"; free some space or choose another {opt('out')}"
    return f"; {otherwise}" if otherwise else ""


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` (and its missing parents); return what was created, deepest first."""
    created: list[Path] = []
    p = parent
    while not p.exists():
        created.append(p)
        p = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(created)
        raise ExportError(f"{parent}: cannot create the folder ({reason(e)}){hint(e, _ANOTHER_OUT)}") from e
    return created


def _make_temporary(out: Path) -> Path:
    """A new folder beside ``out``, with the mode the umask gives (``mkdtemp`` would make it 0700)."""
    while True:
        tmp = out.parent / f".{out.name}.onnxpipe-tmp-{uuid.uuid4().hex[:12]}"
        with suppress(FileExistsError):  # else another name
            tmp.mkdir(mode=0o777)
            return tmp


def _remove_empty(folders: Iterable[Path]) -> None:
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            return


def _move_into_place(
    tmp: Path, out: Path, last: str | None, replaceable: Callable[[Path], None] | None
) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and deleted last.

    An existing *empty* ``out`` stays (it may be the current folder, or have its own owner and mode):
    the files move into it one by one, and back out if one cannot.
    """
    if not out.exists():
        with writing(out, out):
            os.rename(tmp, out)
        return
    if not any(out.iterdir()):
        _move_files_into(tmp, out, last)
        return
    if replaceable is not None:  # again: the folder may have changed while it was written
        replaceable(out)
    else:
        check_replaceable(out)
        _carry_across(out, tmp)
    with writing(out, out):
        swapped = _exchange(tmp, out)
    if swapped:  # one step: out was the old split, then the new one, never absent
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = out.parent / f".{out.name}.onnxpipe-old-{uuid.uuid4().hex[:8]}"
    with writing(out, out):
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError as e:
        os.rename(old, out)
        raise ExportError(f"{out}: cannot be replaced ({reason(e)}); {out} is left as it was") from e
    shutil.rmtree(old, ignore_errors=True)


def _carry_across(out: Path, tmp: Path) -> None:
    """Link (else copy) into the new split ``tmp`` the files the user added to the earlier one in ``out``
    (:func:`added_by_the_user`), so that replacing it loses none; one the new split writes too must be
    the same file, or nothing is replaced."""
    for part in _parts(_family(out)):  # what the user added to an encoder-decoder's two splits too
        _carry_across(out / part, tmp / part)
    for p in added_by_the_user(out):
        target = tmp / p.name
        if target.exists():
            if target.read_bytes() == p.read_bytes():
                continue
            raise ExportError(
                f"{out}: holds {p.name}, which its split did not write and this split writes too (another "
                f"one); move yours out of {out} to keep it, and split again; {out} is left as it was"
            )
        with writing(out / p.name, out):
            try:
                os.link(p, target)
            except OSError:
                shutil.copy2(p, target)


def _exchange(a: Path, b: Path) -> bool:
    """Swap folders ``a`` and ``b`` in one step (Linux's ``renameat2`` with ``RENAME_EXCHANGE``); False
    where the OS or the file system cannot, and the caller renames in two steps."""
    rename = (
        getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
    )
    if rename is None:
        return False
    at_cwd, exchange = -100, 2
    if rename(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _move_files_into(tmp: Path, out: Path, last: str | None) -> None:
    moved: list[Path] = []
    try:
        for f in sorted(tmp.iterdir(), key=lambda p: (p.name == last, p.name)):
            target = out / f.name
            os.rename(f, target)
            moved.append(target)
        tmp.rmdir()
    except OSError as e:
        for target in moved:
            os.rename(target, tmp / target.name)
        raise ExportError(f"{out}: cannot be filled ({reason(e)}); {out} is left as it was") from e


__all__ = ["check_replaceable", "check_target", "hint", "normalized", "reason", "staged_folder", "writing"]
