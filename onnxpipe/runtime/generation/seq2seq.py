"""Generating through an encoder-decoder's split (``seq2seq.json``, :mod:`onnxpipe.manifest.seq2seq`).

Each sequence's encoder inputs (a row of ``--inputs``' arrays) run once through the encoder's split;
its output is the :attr:`~onnxpipe.core.iocontract.Role.ENCODER_OUTPUT` the decoder's first step takes
(:func:`encoder_output`, the builder of that role: the sequence's own output at its first step, no frames
at every later one), from which each decoder stage makes its layers' cross-attention cache and keeps it.
A T5- or Marian-style decoder also takes the encoder's mask at every step (:func:`encoder_mask`, the
builder of :attr:`~onnxpipe.core.iocontract.Role.ENCODER_MASK`).  Everything else is a decoder's
generation: the :class:`~.generator.Generator` and its scheduler, the start tokens the prompt.
:func:`plain_greedy` is the baseline: the folder's unsplit files in a plain onnxruntime loop, the tokens
the split must reproduce.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.ir.seq2seq import DECODER, ENCODER, ENCODER_OUTPUT, MERGED, WITH_PAST
from onnxpipe.manifest.seq2seq import Seq2SeqRecord
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.generation.feeds import Builder, Step
from onnxpipe.runtime.generation.scheduler import Run
from onnxpipe.runtime.kvstate import StepFlags
from onnxpipe.runtime.pipeline import Pipeline


def read_inputs(files: Sequence[Path], names: Sequence[str]) -> list[Tensors]:
    """Each sequence's encoder inputs: a row of each ``.npz`` in ``files``, in order; a
    :class:`UsageError` naming the file and the input it lacks.  An encoder's mask (T5's
    ``attention_mask``) a file leaves out is ones over its other input (every token real); the files'
    rows may differ in length (a decode step carries one sequence, its own cross cache)."""
    rows: list[Tensors] = []
    for file in files:
        try:
            data = np.load(file)
        except (OSError, ValueError) as e:
            raise UsageError(f"{file}: cannot be read as a .npz of the encoder's inputs ({e})") from None
        if not isinstance(data, np.lib.npyio.NpzFile):  # a .npy: one array, with no input's name
            raise UsageError(
                f"{file}: not a .npz; save the encoder's inputs by name, e.g. "
                "numpy.savez(FILE, input_features=...)"
            )
        with data:
            arrays = {n: np.asarray(data[n]) for n in data.files}
        given = [arrays[n] for n in names if n in arrays]
        for name in names:
            if name not in arrays and "mask" in name and given and given[0].ndim == 2:
                arrays[name] = np.ones(given[0].shape, np.int64)
        missing = [n for n in names if n not in arrays]
        if missing:
            raise UsageError(
                f"{file}: holds no {missing[0]!r}, the encoder's input "
                f"(it holds {', '.join(arrays) or 'nothing'})"
            )
        count = len(arrays[names[0]])
        rows += [{n: arrays[n][i : i + 1] for n in names} for i in range(count)]
    if not rows:
        raise UsageError(f"{opt('inputs')}: give at least one .npz of the encoder's inputs")
    return rows


def encode(
    directory: Path, rows: Sequence[Tensors], output: str, threads: int | None
) -> tuple[list[np.ndarray], float]:
    """Each row's encoder output through the encoder's split in ``directory``, and the seconds the rows
    took (the stages' opening not counted, as :func:`plain_greedy` does not count its sessions')."""
    with Pipeline.from_manifest(directory, threads=threads, check_files=False) as pipe:
        start = time.perf_counter()
        encoded = [np.asarray(out[output]) for out in pipe.run_many(rows)]
        return encoded, time.perf_counter() - start


def encoder_output(encoded: Sequence[np.ndarray]) -> Builder:
    """The builder of the encoder-output role: at a sequence's first step (``START``) its own encoder
    output (sequence ``i`` the ``i``-th of ``encoded``), at later steps one of no frames."""
    width = encoded[0].shape[-1]

    def build(step: Step) -> np.ndarray:
        rows = step.control.rows
        if all(r.flags & StepFlags.START for r in rows):
            return np.concatenate([encoded[r.sequence] for r in rows])
        return np.zeros((len(rows), 0, width), dtype=encoded[0].dtype)

    return build


def encoder_mask(rows: Sequence[Tensors], encoded: Sequence[np.ndarray]) -> Builder:
    """The builder of the encoder-mask role (T5's ``encoder_attention_mask``), fed at every step: the
    mask among sequence ``i``'s encoder inputs (``rows[i]``), else ones over its encoder output's frames."""
    made = [_mask(row, e) for row, e in zip(rows, encoded, strict=True)]

    def build(step: Step) -> np.ndarray:
        return np.concatenate([made[r.sequence] for r in step.control.rows])

    return build


def _mask(row: Tensors, encoded: np.ndarray) -> np.ndarray:
    """The encoder's mask of one sequence: its mask input (``attention_mask``), else ones over the frames
    of its encoder output ``encoded``."""
    return next((v for n, v in row.items() if "mask" in n), np.ones(encoded.shape[:2], np.int64))


def plain_greedy(
    source: Path, rows: Sequence[Tensors], record: Seq2SeqRecord, max_new_tokens: int, eos_ids: Sequence[int]
) -> Run:
    """Greedy tokens of each row through the unsplit files in ``source`` (optimum's), one row at a time in
    a plain onnxruntime loop: the encoder, ``decoder_model`` on the start tokens, then
    ``decoder_with_past_model`` per token (or ``decoder_model_merged`` for both, its flag saying which),
    up to one of ``eos_ids`` (the split's, settled from the options).  The clock starts before the first
    row's encoder: its time counts every row's encoding."""
    fail = lambda e: UsageError(f"{source}: onnxruntime cannot open its model ({e})")  # noqa: E731
    merged = not (source / DECODER).is_file()
    names = (ENCODER, MERGED, MERGED) if merged else (ENCODER, DECODER, WITH_PAST)
    encoder, first, later = (open_session(source / name, session_options(), fail=fail) for name in names)
    first_names, later_names = [o.name for o in first.get_outputs()], [o.name for o in later.get_outputs()]
    flag = {i.name for i in first.get_inputs()} & {"use_cache_branch"}
    empty = {  # a merged file takes every input at every step: empty pasts at the first (unread there)
        i.name: np.zeros(
            (1, i.shape[1], i.shape[2] if isinstance(i.shape[2], int) else 0, i.shape[3]), np.float32
        )
        for i in first.get_inputs()
        if i.name.startswith("past_key_values")
    }
    start = time.perf_counter()
    made: list[tuple[int, ...]] = []
    times: list[tuple[float, ...]] = []
    steps = 0
    masked = [i.name for i in first.get_inputs() if "encoder" in i.name and "mask" in i.name]
    for row in rows:
        (encoded,) = encoder.run([record.encoder_output], row)
        mask = dict.fromkeys(masked, _mask(row, encoded))
        feeds: Tensors = {"input_ids": np.array([record.start_ids]), ENCODER_OUTPUT: encoded, **empty, **mask}
        feeds |= {f: np.array([False]) for f in flag}
        outs = dict(zip(first_names, first.run(None, feeds), strict=True))
        tokens: list[int] = []
        stamps: list[float] = []
        while True:
            steps += 1
            tokens.append(int(np.argmax(outs["logits"][0, -1])))
            stamps.append(time.perf_counter() - start)
            if tokens[-1] in eos_ids or len(tokens) == max_new_tokens:
                break
            feeds = {"input_ids": np.array([[tokens[-1]]]), **mask}
            feeds |= {n.replace("present", "past_key_values", 1): v for n, v in outs.items() if n != "logits"}
            feeds |= {f: np.array([True]) for f in flag} | ({ENCODER_OUTPUT: encoded} if flag else {})
            made_now = zip(later_names, later.run(None, feeds), strict=True)
            outs |= {n: v for n, v in made_now if ".encoder." not in n}  # the cross cache stays the first's
        made.append(tuple(tokens))
        times.append(tuple(stamps))
    return Run(tuple(made), tuple(times), time.perf_counter() - start, steps, 1, 0)
