"""Reading the user's sample inputs from disk (``--inputs``), and the record the manifest keeps of them.

Why: users split the model they deploy and have real inputs for it.  Random values at guessed sizes
cannot run every model (an ``If`` on a sample rate, a reflect pad longer than a guessed sequence), and
real data also gives costs and a verification of the inputs that matter.  This module only reads
files into arrays by name; checking them against the model is :mod:`onnxpipe.ir.samples`'s job.

Three layouts:

* an ``.npz`` file: one array per model input, by name; one sample;
* a folder of ``.npy`` files, one per model input, named ``<input>.npy``; one sample;
* an ``.npz`` file read *stacked*: every array has a leading sample axis of the same length ``n``,
  giving ``n`` samples.

Only the file's name, sha256 and the shapes read are recorded (:class:`InputRecord`), never the data.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated

import numpy as np

from onnxpipe.core.codec import Minimum
from onnxpipe.core.errors import UsageError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.options import opt

Feeds = Mapping[str, np.ndarray]
"""One sample: an array per model input, by name."""


@dataclass(frozen=True)
class InputRecord:
    """What the manifest and the profile keep of one ``--inputs`` file: never its data."""

    file: str
    """The file's (or folder's) name as given on the command line, without its folders."""
    sha256: str
    """The file's sha256; for a folder, that of its ``.npy`` files' names and hashes in name order."""
    shapes: Mapping[str, tuple[int, ...]]
    """Each input's shape in one sample (without the sample axis of a stacked file)."""
    samples: Annotated[int, Minimum(1)] = 1
    """How many samples the file held."""


def read_input_file(
    path: str | Path, *, stacked: bool = False
) -> tuple[InputRecord, list[dict[str, np.ndarray]]]:
    """The samples in ``path`` (see the module docstring) and their record.

    Raises :class:`UsageError` naming the file for one that cannot be read, that holds no array, that
    is a folder while ``stacked``, or whose stacked arrays disagree on the number of samples.
    """
    p = Path(path)
    if p.is_dir():
        if stacked:
            raise UsageError(
                f"{opt('stacked_files', p)}: a folder of .npy files holds one sample; "
                f"give an .npz file with a leading sample axis, or use {opt('input_files')}"
            )
        arrays, digest = _read_folder(p)
    elif p.is_file():
        arrays = _read_npz(p, "stacked_files" if stacked else "input_files")
        digest = file_sha256(p)
    else:
        raise UsageError(
            f"{opt('input_files', p)}: no such file or folder; give an .npz file or a folder of .npy files"
        )
    if not stacked:
        record = InputRecord(p.name, digest, _shapes(arrays), 1)
        return record, [arrays]
    counts = {n: (a.shape[0] if a.ndim else None) for n, a in arrays.items()}
    for name, n in counts.items():
        if n is None or n < 1:
            raise UsageError(
                f"{opt('stacked_files', p)}: array {name!r} has no leading sample axis "
                f"(shape {list(arrays[name].shape)}); "
                f"stack the samples along a first axis, or use {opt('input_files')}"
            )
    sizes = sorted(set(counts.values()), key=lambda v: v or 0)
    if len(sizes) > 1:
        shown = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise UsageError(
            f"{opt('stacked_files', p)}: the arrays hold different numbers of samples ({shown}); "
            "give every input the same leading sample axis"
        )
    n = sizes[0] or 0
    samples = [{name: np.array(a[i]) for name, a in arrays.items()} for i in range(n)]  # 0-d stays 0-d
    return InputRecord(p.name, digest, _shapes(samples[0]), n), samples


def _shapes(arrays: Mapping[str, np.ndarray]) -> Mapping[str, tuple[int, ...]]:
    return MappingProxyType({n: tuple(int(d) for d in a.shape) for n, a in arrays.items()})


_NPZ_MAGIC = b"PK"  # an .npz is a zip archive of .npy files
_NPY_MAGIC = b"\x93NUMPY"


def _read_npz(p: Path, field: str) -> dict[str, np.ndarray]:
    try:
        with p.open("rb") as f:
            head = f.read(6)
    except OSError as e:
        raise UsageError(f"{opt(field, p)}: cannot be read ({error_line(e)})") from None
    if not head.startswith(_NPZ_MAGIC) and head != _NPY_MAGIC:
        raise UsageError(
            f"{opt(field, p)}: is not an .npz file (no zip archive of arrays); save the inputs with "
            "numpy.savez(file, name=array, ...)"
        )
    try:
        data = np.load(p, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise UsageError(
                f"{opt(field, p)}: holds a single array, not one per input; "
                "save it with numpy.savez(file, name=array, ...)"
            )
        with data:
            arrays = {name: np.asarray(data[name]) for name in data.files}
    except UsageError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise UsageError(
            f"{opt(field, p)}: cannot be read as an .npz file ({error_line(e)}); "
            "save it with numpy.savez(file, name=array, ...)"
        ) from None
    if not arrays:
        raise UsageError(f"{opt(field, p)}: holds no array; save one per model input with numpy.savez")
    return arrays


def _read_folder(p: Path) -> tuple[dict[str, np.ndarray], str]:
    files = sorted(f for f in p.iterdir() if f.suffix == ".npy" and f.is_file())
    if not files:
        raise UsageError(
            f"{opt('input_files', p)}: the folder holds no .npy file; save one per model input as <input>.npy"
        )
    arrays: dict[str, np.ndarray] = {}
    digest = hashlib.sha256()
    for f in files:
        try:
            arrays[f.stem] = np.asarray(np.load(f, allow_pickle=False))
        except (OSError, ValueError, EOFError) as e:
            raise UsageError(
                f"{opt('input_files', f)}: cannot be read as an .npy file ({error_line(e)}); save it with "
                "numpy.save"
            ) from None
        digest.update(f.name.encode() + b"\0" + file_sha256(f).encode() + b"\n")
    return arrays, digest.hexdigest()


__all__ = ["Feeds", "InputRecord", "read_input_file"]
