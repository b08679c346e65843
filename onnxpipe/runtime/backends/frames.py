"""The frame: how a message's tensors travel between workers, one format for the data plane's connections
(:mod:`~onnxpipe.runtime.backends.ray_plane`) and for the shared-memory channels between worker processes
(:mod:`~onnxpipe.runtime.backends.shm`).

A frame is a fixed header of lengths, a small pickled part (``meta``, and each tensor's name, dtype,
shape and place) and the arrays' bytes (:func:`encode`): written from the arrays' own memory, read as
arrays whose memory is the frame's own (:func:`decode`, no copy).
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

LENGTHS = struct.Struct("!QQ")
"""A frame's header: its bytes before the arrays' (this header, the pickled part, padding), and the
arrays' bytes."""
ALIGN = 64
"""The arrays' bytes start at a multiple of this from the frame's start, each one at a multiple of it
from there (padding between)."""
_PADDING = memoryview(bytes(ALIGN))


def _formats() -> dict[str, str]:
    """The buffer format of each dtype whose arrays travel as their bytes (booleans, integers, floats,
    complex numbers, either byte order), and the dtype's name on the wire: ``l`` is 8 bytes on Linux and
    4 on Windows, ``<i8`` is ``<i8`` everywhere."""
    formats = {}
    for code in "?bBhHiIlLqQefdFD":
        for dtype in (np.dtype(code), np.dtype(code).newbyteorder("<"), np.dtype(code).newbyteorder(">")):
            formats[np.empty(0, dtype).data.format] = dtype.str
    return formats


_FORMATS = _formats()


class _Dtypes(dict[str, np.dtype[Any]]):
    """Each dtype a frame names, made once: a name of :data:`_FORMATS` or of ml_dtypes' (``bfloat16``,
    the float8s, int4), which numpy knows once ml_dtypes is imported."""

    def __missing__(self, name: str) -> np.dtype[Any]:
        try:
            dtype = np.dtype(name)
        except TypeError:
            importlib.import_module("ml_dtypes")
            dtype = np.dtype(name)
        self[name] = dtype
        return dtype


_DTYPES = _Dtypes()


def _raw(value: Any) -> tuple[str, memoryview] | None:
    """What :func:`encode` takes apart from an array of a dtype of :data:`_FORMATS`: a numpy scalar or an
    array of a subclass (as an array), a strided array (copied to a contiguous one), an array of
    ml_dtypes' (its bytes as unsigned integers of its size, its dtype by name: ``bfloat16``'s dtype
    string, ``<V2``, names no type); None for a value that travels pickled (not an array, or an array
    of Python objects, strings or dates)."""
    if not isinstance(value, np.ndarray | np.generic):  # an ONNX sequence, map or absent optional
        return None
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.type.__module__ == "ml_dtypes":
        return array.dtype.name, array.view(f"u{array.dtype.itemsize}").data
    with contextlib.suppress(ValueError):  # no buffer: dates, times
        view = array.data
        name = _FORMATS.get(view.format)
        if name is not None:
            return name, view
    return None


def encode(meta: Any, tensors: Mapping[str, Any]) -> tuple[list[memoryview], int]:
    """The frame of ``meta`` and ``tensors`` as the pieces to write, the arrays' memory not copied (a
    strided array is copied to a contiguous one), and its size.

    The pickled part holds ``meta`` and, per tensor, its name, dtype, shape and offset; a value that is
    no array of :func:`_raw`'s travels inside it.  Why not the arrays pickled (protocol 5, out of band)
    as before: numpy's pickling cost 60-90 us a frame each way on a busy node, most of a small frame's
    hop beyond the wire.  Why the buffer's format and no dtype attribute in the common case: after a
    stage's run has passed its weights through the CPU's caches, every distinct piece of numpy touched
    costs microseconds: a generation step's frame of 5 tensors took 117 us to encode by dtype, 90 by
    format."""
    specs: list[tuple[str, str | None, Any, int]] = []
    parts: list[memoryview] = []
    data = 0
    for name, value in tensors.items():
        dtype = None
        if type(value) is np.ndarray:  # the common case, by the buffer's own format
            try:
                view = value.data
            except ValueError:  # no buffer: an array of ml_dtypes', dates
                pass
            else:
                dtype = _FORMATS.get(view.format)
        if dtype is None or not view.c_contiguous:
            raw = _raw(value)
            if raw is None:
                specs.append((name, None, value, 0))
                continue
            dtype, view = raw
        pad = -data % ALIGN
        if pad:
            parts.append(_PADDING[:pad])
            data += pad
        specs.append((name, dtype, view.shape, data))
        if view.nbytes:
            parts.append(view)
            data += view.nbytes
    body = pickle.dumps((meta, specs), protocol=5)
    pad = -(LENGTHS.size + len(body)) % ALIGN
    head = LENGTHS.size + len(body) + pad
    return [memoryview(LENGTHS.pack(head, data) + body + _PADDING[:pad]), *parts], head + data


def decode(buf: bytearray | memoryview) -> tuple[Any, dict[str, Any]]:
    """The meta and the tensors of the frame at the start of ``buf``: each array a view of ``buf``, a value
    that travelled pickled (not an array of :func:`_raw`'s) its own."""
    head = LENGTHS.unpack_from(buf)[0]
    meta, specs = pickle.loads(memoryview(buf)[LENGTHS.size :])
    tensors = {
        name: shape if dtype is None else np.ndarray(shape, _DTYPES[dtype], buf, head + offset)
        for name, dtype, shape, offset in specs
    }
    return meta, tensors
