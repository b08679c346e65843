"""The manifest of a split folder: the contract between the exporter and everything that reads a split.

``manifest.json`` says which stage files make up the pipeline, what flows between them, where the
source model is, what the plan estimated and how a stream of micro-batches moves through the stages.
``docs/manifest.md`` documents every field; :data:`SCHEMA_VERSION` is bumped on any change a reader of
the previous version would misread (see the versioning policy there).

The file's records are written and read by one codec (:data:`CODEC`, :mod:`onnxpipe.core.codec`) from
their own types: this module adds the envelope (the schema version, the digest, the stage files' hashes)
and the rules that span fields; a file of an older schema version is first brought to today's layout by
the explicit steps of :func:`onnxpipe.manifest.layout.upgraded`.  A new field is one declaration on its
record (with a default, so that older files read), and a row in ``docs/manifest.md``.

JSON has no infinity: every float field writes ``+inf`` as ``null`` and reads ``null`` back as
``math.inf`` (an infinite bandwidth, the throughput of stages that take no time).  NaN is refused.

The file is sealed with the ``digest`` of its content (:func:`content_digest`): a manifest changed by hand
would have its figures believed (an estimate of 5 s shown at 100% under a bottleneck of 0.2 ms), so it is
refused when read, until its user deletes the digest to take the edit on purpose.

A decoder's split also says what a generator checks a request against before any work
(:func:`decoder_limits`): a prompt of ids beyond the vocabulary, or a prompt and new tokens past the
context, fails deep inside a run (onnxruntime's raw error, after the work); a chat request needs a
template, and text needs a tokenizer.  The split records all of it (``plan.decoder`` and its ``model``
record, the tokenizer files copied beside the stages: :func:`onnxpipe.export.stages.with_decoder_files`),
read back here as one typed value, without onnx.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxpipe.manifest.layout as layout
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.codec import Codec, Special
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.files import file_sha256, write_text_atomic
from onnxpipe.core.jsonread import Document
from onnxpipe.core.tokenizer_files import chat_template, has_tokenizer
from onnxpipe.manifest.entries import (
    MANIFEST_NAME,
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    SCHEMA_VERSION,
    DeviceRecord,
    ModelOutput,
    ModelTensor,
    SourceInfo,
    StageEntry,
    VerificationRecord,
)
from onnxpipe.manifest.seq2seq import SEQ2SEQ_FILE
from onnxpipe.planning.records import PlanSummary
from onnxpipe.schedule.timeline import Timeline

CODEC = Codec(
    {
        Cluster: Special(Cluster.to_obj, layout.cluster),
        Timeline: Special(layout.timeline_obj, layout.timeline),
    }
)
"""The manifest's records as JSON: each from its fields' types, the devices and the schedule in formats
of their own (a devices file's, a compact timeline)."""


@dataclass(frozen=True)
class Manifest:
    """Everything ``manifest.json`` holds; build it with :func:`onnxpipe.export.stages.export_stages`."""

    source: SourceInfo
    model_inputs: tuple[ModelTensor, ...]
    model_outputs: tuple[ModelOutput, ...]
    stages: tuple[StageEntry, ...]
    plan: PlanSummary
    schedule: Timeline
    schema_version: int = field(default=SCHEMA_VERSION)
    cluster: Cluster | None = None
    device_costs: tuple[DeviceRecord, ...] = ()
    verification: VerificationRecord | None = None
    """None: a manifest written before the field, which cannot say whether it was verified."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def workers(self) -> int:
        """How many workers run the stages: ``k``, or fewer for an interleaved split."""
        return self.plan.workers if self.plan.workers is not None else self.k

    def worker_of(self, stage: int) -> int:
        """The worker that runs ``stage`` (the stage's own index in a split that is not interleaved)."""
        w = self.stages[stage].worker
        return stage if w is None else w

    def stages_of(self, worker: int) -> tuple[int, ...]:
        """The stages ``worker`` runs, in pipeline order."""
        return tuple(s for s in range(self.k) if self.worker_of(s) == worker)

    def to_obj(self) -> dict[str, Any]:
        """The manifest as a JSON object, ``schema_version`` first (its ``digest`` not yet added)."""
        obj: dict[str, Any] = CODEC.encode(Manifest, self)
        obj["schedule"] = layout.timeline_obj(self.schedule, [s.device for s in self.stages])
        return {"schema_version": obj.pop("schema_version"), **obj}

    def to_json(self) -> str:
        """The manifest as indented JSON text (ends with a newline), sealed with its ``digest``."""
        obj = self.to_obj()
        obj["digest"] = content_digest(obj)
        return layout.dumps(obj) + "\n"

    @staticmethod
    def from_json(text: str, source: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate ``text``; ``source`` names the file in error messages."""
        doc = _document(source)
        return _decoded(doc.parse(text), doc)


def _decoded(obj: Any, doc: Document) -> Manifest:
    """Validate the parsed manifest ``obj`` of the file ``doc`` reads."""
    manifest: Manifest = CODEC.decode(Manifest, doc.read(layout.upgraded(obj, doc)))
    check_consistency(manifest, doc)
    _check_digest(obj, doc.source)  # last: a field an edit broke is named by its own check first
    return manifest


def _document(source: str) -> Document:
    """The manifest file ``source`` being read: its errors are :class:`ManifestError`."""
    return Document(source, ManifestError, "re-run onnxpipe split", root="manifest")


def content_digest(obj: dict[str, Any]) -> str:
    """The sha256 of a manifest document's content, its ``digest`` left out: the same for the object
    written and for the one read back (keys sorted, no spaces, floats as Python writes them)."""
    content = {k: v for k, v in obj.items() if k != "digest"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _check_digest(obj: dict[str, Any], source: str) -> None:
    """Refuse a manifest changed since onnxpipe wrote it: its figures (estimates, bounds, the
    verification) would be believed, though no split made them.  A manifest without a digest (written
    before it) is read as it is; so is one whose user removed it to take an edit on purpose."""
    digest = obj.get("digest")
    if digest is None:
        return
    if not isinstance(digest, str) or digest != content_digest(obj):
        raise ManifestError(
            f"{source}: was changed after onnxpipe wrote it (its content does not match its digest), so its "
            'figures are not the split\'s; re-run onnxpipe split, or delete its "digest" line to take the '
            "edited file as it is"
        )


def write_manifest(path: str | Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` through a temporary file, so a reader never sees half of it."""
    write_text_atomic(Path(path), manifest.to_json())


def load_manifest(directory: str | Path, *, check_files: bool = True) -> Manifest:
    """Read and validate ``<directory>/manifest.json``.

    With ``check_files`` every stage file (and its external data file) must exist and hash to the
    sha256 recorded at export, so a runner never chains stages that were edited or mixed up.
    """
    d = Path(directory)
    path = d / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: no such file; {d} is an encoder-decoder's split: give its encoder/ or decoder/ folder"
            if (d / SEQ2SEQ_FILE).is_file()
            else f"{path}: no such file; give a folder written by 'onnxpipe split'"
            if d.is_dir()
            else f"{d}: no such folder; give a folder written by 'onnxpipe split'"
        )
    doc = _document(str(path))
    manifest = _decoded(doc.load(path), doc)
    problems = stage_file_problems(d, manifest) if check_files else []
    if problems:
        raise ManifestError(f"{path}: {problems[0]}; re-run onnxpipe split")
    return manifest


def stage_file_problems(directory: Path, manifest: Manifest) -> list[str]:
    """What is wrong with the stage files (and their external data) of ``directory``: each one missing,
    or whose sha256 is not the one recorded at export."""
    problems: list[str] = []
    for st in manifest.stages:
        files = [(st.file, st.sha256)]
        if st.external_data is not None and st.external_data_sha256 is not None:
            files.append((st.external_data, st.external_data_sha256))
        for name, sha in files:
            p = directory / name
            if not p.is_file():
                problems.append(f"stage {st.index} file {name} is missing")
            elif file_sha256(p) != sha:
                problems.append(f"stage {st.index} file {name} changed after export (sha256 mismatch)")
    return problems


@dataclass(frozen=True)
class DecoderLimits:
    """A decoder split's limits and token ids.

    ``context`` is the most tokens (prompt and new) a sequence may hold: the context the split counted
    its KV cache at (``max_context``, or the model's own where smaller), the ``context_length`` its
    ``genai_config.json`` says.  ``vocab_size`` bounds the token ids (None where neither the graph nor a
    config says it).  ``eos_ids`` are the model's own end-of-sequence ids (empty when no config of the
    model states them: no id is guessed).  ``tokenizer_dir`` is the folder when it holds a tokenizer
    (``tokenizer.json``, a SentencePiece model, or BPE vocabulary and merges), ``chat_template`` the
    template's text when the model has one.
    """

    vocab_size: int | None
    context: int
    eos_ids: tuple[int, ...]
    tokenizer_dir: Path | None
    chat_template: str | None
    bos_id: int | None = None
    pad_id: int | None = None


def decoder_limits(folder: str | Path, manifest: Manifest | None = None) -> DecoderLimits:
    """The limits of the decoder split in ``folder`` (its ``manifest``, read from the folder unless
    given).

    Raises :class:`UsageError` naming the folder when it was not split as a decoder with a KV cache, and
    :class:`~onnxpipe.core.errors.ManifestError` for a manifest that cannot be read.
    """
    path = Path(folder)
    m = manifest if manifest is not None else load_manifest(path, check_files=False)
    record = m.plan.decoder
    if record is None:
        raise UsageError(
            f"{path}: was not split as a decoder LLM with a KV cache, so it has no vocabulary or context to "
            "check against; split a decoder"
        )
    model = record.model
    context = record.max_context
    if model is not None and model.context_length is not None:
        context = min(context, model.context_length)
    template = chat_template(path)
    return DecoderLimits(
        vocab_size=model.vocab_size if model is not None else None,
        context=context,
        eos_ids=model.eos_token_ids if model is not None else (),
        tokenizer_dir=path if has_tokenizer(path) else None,
        chat_template=template[0] if template is not None else None,
        bos_id=model.bos_token_id if model is not None else None,
        pad_id=model.pad_token_id if model is not None else None,
    )


# --------------------------------------------------------------------------------------------------
# the rules that span fields: stages numbered in order, edges that point backwards, names that resolve,
# workers dealt out as the planner deals them.  Each failure names the JSON path at fault.


def _check_workers(m: Manifest, doc: Document) -> None:
    """Every stage has a worker exactly when ``plan.workers`` is given, each worker runs a stage, and
    stage ``s`` runs on worker ``s % workers`` (the only assignment the planner makes: ``V * workers``
    stages, or one more whose last is back on worker 0 with the first)."""
    fail = doc.fail
    given = [st.worker is not None for st in m.stages]
    if m.plan.workers is None:
        if any(given):
            raise fail(f"stages[{given.index(True)}].worker", "is given but plan.workers is not")
        if m.plan.time_slack != 0.0:
            raise fail("plan.time_slack", "is given but plan.workers is not")
        if m.schedule.workers is not None:
            raise fail("schedule.devices[0].worker", "is given but plan.workers is not")
        if m.plan.worker_param_bytes is not None:
            raise fail("plan.worker_param_bytes", "is given but plan.workers is not")
        return
    workers = m.plan.workers
    if workers > m.k or m.k % workers > 1:
        raise fail("plan.workers", f"{workers} workers cannot each run the same number of the {m.k} stages")
    for i, st in enumerate(m.stages):
        if st.worker is None:
            raise fail(f"stages[{i}].worker", "missing; plan.workers says the stages share workers")
        if st.worker != i % workers:
            raise fail(
                f"stages[{i}].worker", f"expected {i % workers} (stage s runs on worker s % {workers})"
            )
    held = m.plan.worker_param_bytes
    if held is not None and len(held) != workers:
        raise fail(
            "plan.worker_param_bytes", f"gives {len(held)} workers' weights; plan.workers is {workers}"
        )
    sched = m.schedule.workers
    if sched is None:
        raise fail("schedule.devices[0].worker", "missing; plan.workers says the stages share workers")
    for i, w in enumerate(sched):
        if w != i % workers:
            raise fail(f"schedule.devices[{i}].worker", f"expected {i % workers}, the worker of stages[{i}]")


def check_consistency(m: Manifest, doc: Document) -> None:
    """Cross-field rules: stages numbered in order, edges that point backwards, names that resolve, an
    IO contract that can drive a generation."""
    fail = doc.fail
    io = m.plan.decoder.io if m.plan.decoder is not None else None
    problem = io.problem() if io is not None else None
    if problem is not None:
        raise fail("plan.decoder.io", f"the IO contract is incomplete: {problem}")
    k = len(m.stages)
    if k == 0:
        raise fail("stages", "expected at least one stage, got none")
    if m.plan.k != k:
        raise fail("plan.k", f"says {m.plan.k} stages but 'stages' lists {k}")
    if len(m.schedule.stages) != k:
        raise fail("schedule.devices", f"lists {len(m.schedule.stages)} stages, expected {k}")
    _check_workers(m, doc)
    if m.cluster is not None:
        names = set(m.cluster.names)
        for i, st in enumerate(m.stages):
            if st.device not in names:
                raise fail(f"stages[{i}].device", f"{st.device!r} is not a device of 'cluster'")
    files: set[str] = set()
    model_inputs = {t.name for t in m.model_inputs}
    produced: dict[str, int] = {}
    for i, st in enumerate(m.stages):
        w = f"stages[{i}]"
        if st.index != i:
            raise fail(f"{w}.index", f"expected {i} (stages are listed in order), got {st.index}")
        if (st.external_data is None) != (st.external_data_sha256 is None):
            raise fail(f"{w}.external_data_sha256", "must be null exactly when external_data is null")
        for name in (st.file, st.external_data):
            if name is None:
                continue
            if name in files:
                raise fail(w, f"file {name} is listed twice")
            files.add(name)
        for j, t in enumerate(st.inputs):
            if t.source == MODEL:
                if t.name not in model_inputs:
                    raise fail(f"{w}.inputs[{j}].source", f"{t.name!r} is not a model input")
            elif produced.get(t.name) != t.source:
                raise fail(
                    f"{w}.inputs[{j}].source",
                    f"says stage {t.source} produces {t.name!r}, but no earlier stage output matches",
                )
        received = {t.name for t in st.inputs}
        for j, a in enumerate(st.same_values):
            if a.same_as not in received:
                raise fail(f"{w}.same_values[{j}].same_as", f"{a.same_as!r} is not an input of this stage")
            if a.name in received:
                raise fail(f"{w}.same_values[{j}].name", f"{a.name!r} is an input of this stage already")
        for j, out in enumerate(st.outputs):
            for c in out.consumers:
                if c != MODEL_OUTPUT and not (i < c < k):
                    why = f"there are only {k} stages" if c >= k else f"it does not come after stage {i}"
                    raise fail(f"{w}.outputs[{j}].consumers", f"lists stage {c}, but {why}")
            produced[out.name] = i
    for j, o in enumerate(m.model_outputs):
        if o.produced_by == MODEL_INPUT:
            if o.name not in model_inputs:
                raise fail(f"model_outputs[{j}].produced_by", f"{o.name!r} is not a model input")
        elif produced.get(o.name) != o.produced_by:
            raise fail(
                f"model_outputs[{j}].produced_by",
                f"says stage {o.produced_by} produces {o.name!r}, but that stage does not output it",
            )
