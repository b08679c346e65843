"""Write a :class:`~onnxpipe.planning.types.Plan` as one valid ONNX file per stage, plus ``manifest.json``.

One pass over the already loaded model (:mod:`onnxpipe.export.build` copies each stage out of
``view.proto``; :mod:`onnxpipe.export.boundary` settles the types of the tensors between stages).  A
stage written with external data (``always``; ``auto`` for a source whose weights are in external
files, or a stage over ~1.8 GB) gets its weights copied into its own ``.data`` file in chunks, straight
from the source's files (:mod:`onnxpipe.export.weightfile`): memory holds the graph, whatever the size
of the model.  An inline stage is built with its weights and released before the next, so memory holds
the graph plus one stage.  Each stage is checked with ``onnx.checker`` and opened in onnxruntime before
the export counts as done.  The manifest is made from what was written (:mod:`onnxpipe.export.record`).

The folder appears atomically (:mod:`onnxpipe.export.outdir`): a failure at any step leaves the user's
old folder as it was and no half-written one behind.

What export refuses, before writing anything (:func:`onnxpipe.export.checks.check_exportable`): a model
with ``training_info`` (a training algorithm bound to the weights cannot be split across stages), an
opset the installed onnxruntime cannot run, an output folder that is not empty (without ``force``) or
holds the source.

Compressed boundaries (``boundary_dtype``, :mod:`onnxpipe.planning.wire`) are written into the stage files
here (:func:`compress_stage`).  The sending stage casts each compressed float32 output to float16 or
bfloat16, or quantizes it to int8 with a per-tensor scale it computes at run time (``max|x| / 127``,
symmetric, zero point 0) and sends beside it; the receiving stage casts back, or dequantizes, into the
source's own tensor name first thing, so its nodes read what they read in the source.  The tensor on the
link takes a derived name (:meth:`BoundaryDtype.wire_name`, :func:`scale_name`), which both stages and the
manifest use: every runtime that chains stages by name runs the compressed split as it is.

A split of a decoder is a model folder too (:func:`with_decoder_files`): the tokenizer, its chat template
and the generation defaults found beside the model (:func:`onnxpipe.core.tokenizer_files.tokenizer_files`)
are copied beside the stages, so that a generator takes text from the folder alone and GenAI's
``og.Tokenizer`` loads it, and a ``genai_config.json`` is written (:mod:`onnxpipe.export.genai`).  The
manifest's ``plan.decoder.model`` (:class:`~onnxpipe.planning.records.DecoderModelRecord`) records the
model's vocabulary and context, the token ids of its own config, the files copied and where the chat
template is: what ``generate`` checks a prompt against before it runs a step
(:func:`onnxpipe.manifest.decoder_limits`).  The config used is the one named (``split --genai-config``),
else the one beside the model when its dims agree with the graph's
(:func:`onnxpipe.ir.decoder_dims.own_config`); never a guess: without one, the record says no token ids.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.choices import BoundaryDtype, ExternalData, scale_name
from onnxpipe.core.errors import ExportError, UsageError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, HF_CONFIG_NAME, SourceConfig
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.tokenizer_files import chat_template, folder_place, model_folders, tokenizer_files
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.export.build import StageBuilder
from onnxpipe.export.checks import check_exportable, check_plan
from onnxpipe.export.genai import Unsupported, check_source_fits, describe_written, genai_config, model_facts
from onnxpipe.export.options import ExportOptions
from onnxpipe.export.outdir import normalized, staged_folder, writing
from onnxpipe.export.record import ContractMaker, StageFile, build_manifest, required_opsets, shared_weights
from onnxpipe.export.weightfile import externalize
from onnxpipe.ir.decoder import DecoderInfo, FoundDecoder, decoder_of
from onnxpipe.ir.decoder_dims import decoder_dims, own_config, own_context
from onnxpipe.ir.external import holds_external
from onnxpipe.ir.load import check_model
from onnxpipe.ir.model import PROTOBUF_LIMIT, ModelView
from onnxpipe.manifest import MANIFEST_NAME, Manifest, write_manifest
from onnxpipe.planning.records import DecoderModelRecord
from onnxpipe.planning.types import Plan, StageSpec

AUTO_EXTERNAL_BYTES = 1_800_000_000
"""``external_data="auto"``: a stage above this size gets a weights side file (protobuf stops at 2 GB)."""
EXTERNAL_THRESHOLD = 1024
"""Tensors smaller than this stay inside the ``.onnx`` file even when weights go to a ``.data`` file."""


def stage_file_name(index: int) -> str:
    return f"stage_{index}.onnx"


def stage_data_name(index: int) -> str:
    return f"stage_{index}.onnx.data"


def export_stages(
    view: ModelView,
    plan: Plan,
    out_dir: str | Path,
    options: ExportOptions | None = None,
    *,
    feeds: Mapping[str, Any] | None = None,
    genai_source: SourceConfig | None = None,
) -> Manifest:
    """Write ``plan``'s stages of ``view`` and their manifest into ``out_dir``, as ``options`` say; return
    the manifest.

    ``feeds``: one sample of the user's inputs, which a run of the source that settles boundary ranks
    uses instead of random values (:mod:`onnxpipe.export.boundary`).  A decoder's split also gets a
    ``genai_config.json`` for ONNX Runtime GenAI (:mod:`.genai`), started from ``genai_source`` when
    given; where GenAI cannot run the split, a plan note says why instead (and with ``genai_source`` it is
    an error).

    Raises :class:`ExportError` when ``out_dir`` is not empty (without ``force``), when a file cannot
    be written (the old folder is left intact), or when a stage fails the checker or onnxruntime;
    :class:`ModelLoadError` for an opset onnxruntime cannot run (see :func:`check_exportable`).
    """
    opts = options or ExportOptions()
    out = normalized(out_dir)
    check_exportable(view, out, force=opts.force)
    return write_stages(view, plan, out, opts, feeds=feeds, genai_source=genai_source)


def write_stages(
    view: ModelView,
    plan: Plan,
    out: Path,
    options: ExportOptions,
    *,
    feeds: Mapping[str, Any] | None = None,
    genai_source: SourceConfig | None = None,
    then: Callable[[Path, Manifest], Manifest] | None = None,
    decoder: FoundDecoder | None = None,
) -> Manifest:
    """:func:`export_stages` for a request whose model and folder were checked already (the door's, which
    found its ``decoder``).

    ``then``: a last step on the complete folder while it is still the temporary one beside ``out``
    (its path and manifest in, the manifest as it then is out), such as the verification, so that an
    earlier split in ``out`` is replaced only once it is done, and stays if it fails or is interrupted.
    """
    check_plan(view, plan)
    specs = plan.stages
    with staged_folder(out, last=MANIFEST_NAME) as tmp:
        writer = _StageWriter(view, plan, tmp, out, options.external_data, feeds)
        writer.check_sizes(specs)
        contract = ContractMaker(view, plan.input_shapes)
        if not writer.source_external:  # one run of the source: it would have to be loaded whole
            boundary = [t for s in specs for t in (*s.inputs, *s.outputs)]
            contract.observe([*view.inputs, *boundary, *view.outputs], writer.types)
        written = [writer.write(spec) for spec in specs]
        workers = [s.index if s.worker is None else s.worker for s in specs]
        shared = shared_weights(view, [writer.builder.weights_of(s) for s in specs], workers)
        manifest = build_manifest(view, plan, out, written, writer.types, shared, contract, options)
        manifest = with_decoder_files(view, manifest, tmp, out, genai_source, decoder)
        with writing(out / MANIFEST_NAME, out):
            write_manifest(tmp / MANIFEST_NAME, manifest)
        if then is not None:
            manifest = then(tmp, manifest)
    return manifest


# --------------------------------------------------------------------------------------------------
# writing and checking one stage


class _StageWriter:
    """Builds, writes, checks and hashes each stage in turn; remembers the boundary types it learns."""

    def __init__(
        self,
        view: ModelView,
        plan: Plan,
        tmp: Path,
        out: Path,
        external_data: ExternalData,
        feeds: Mapping[str, Any] | None = None,
    ) -> None:
        self.view = view
        self.feeds = feeds
        self.plan = plan
        self.tmp = tmp
        self.out = out
        self.mode = external_data
        self.types = BoundaryTypes(view)
        self.builder = StageBuilder(view, self.types)
        self.source_external = holds_external(view.proto)

    def _build(self, spec: StageSpec, weights: bool, untyped: frozenset[str]) -> onnx.ModelProto:
        return self.builder.build(spec, weights=weights, untyped=untyped, keep_external=True)

    def check_sizes(self, specs: Sequence[StageSpec]) -> None:
        """With ``external_data="never"``, refuse a stage over protobuf's limit before any weight is read
        (with ``auto`` a stage that big gets a weights file: only ``never`` writes one so big inline)."""
        if self.mode != ExternalData.NEVER:
            return
        for spec in specs:
            i, size = spec.index, self.stage_bytes(spec)
            if size > PROTOBUF_LIMIT:
                raise ExportError(
                    f"{self.out / stage_file_name(i)}: stage {i} holds {size / 1e9:.2f} GB, over protobuf's "
                    f"2 GB limit; use {opt('external_data', ExternalData.AUTO)} or always"
                )

    def stage_bytes(self, spec: StageSpec) -> int:
        """About the bytes of the stage file with its weights inside, from dims: no weight is read."""
        weights = sum(self.view.initializers.get(t, 0) for t in self.builder.weights_of(spec))
        nodes = self.view.proto.graph.node
        names = spec.recomputed_nodes + spec.file_node_names + spec.constant_nodes
        return weights + sum(int(nodes[self.builder.by_name[n].index].ByteSize()) for n in names)

    def write(self, spec: StageSpec) -> StageFile:
        """Build, write, check and hash one stage.

        With external data the stage's weights go straight from the source (its external files, or the
        loaded model) into the stage's own ``.data`` file (:mod:`onnxpipe.export.weightfile`); the model proto
        never holds them.  Inline, the stage is built with its weights and saved as one file.
        """
        i = spec.index
        self.types.resolve(
            spec,
            self._build,
            self.tmp,
            self.plan.input_shapes,
            can_run_source=not self.source_external,
            feeds=self.feeds,
        )
        size = self.stage_bytes(spec)
        external = self.mode == ExternalData.ALWAYS or (
            self.mode == ExternalData.AUTO and (self.source_external or size > AUTO_EXTERNAL_BYTES)
        )
        name, data_name = stage_file_name(i), stage_data_name(i)
        path, data_path = self.tmp / name, self.tmp / data_name
        model = self.builder.build(spec, weights=True, keep_external=external)
        compress_stage(model, spec, self.plan.boundary_dtypes)
        opsets = required_opsets(model)
        data_sha: str | None = None
        if external:
            with writing(self.out / data_name, self.out):
                data_sha = externalize(model, data_path, self.view.base_dir, EXTERNAL_THRESHOLD)
        with writing(self.out / name, self.out):
            onnx.save_model(model, str(path))
        del model
        self._check(spec, path)
        with writing(self.out / name, self.out):
            data = data_name if data_sha is not None else None
            return StageFile(name, file_sha256(path), data, data_sha, opsets)

    def _check(self, spec: StageSpec, path: Path) -> None:
        """The checker and onnxruntime must both accept the written stage.

        onnxruntime opens it without graph optimizations: loading resolves every kernel and type, which
        is what can fail; optimizing a 100,000-node graph would cost several times as long, and
        ``onnxpipe verify`` runs the stages at deployment settings anyway.
        """
        i = spec.index
        try:
            check_model(path)  # onnxruntime's default-domain ops stay as the source wrote them
        except (onnx.checker.ValidationError, ValueError) as e:
            raise ExportError(
                f"{self.out / path.name}: stage {i} fails the ONNX checker{self._node_in(spec, str(e))}: "
                f"{self._error_line(e)}; please report this with the model"
            ) from e
        options = session_options(
            level="ORT_DISABLE_ALL",
            threads=1,
            config={"session.disable_prepacking": "1"},  # no second copy of weights
        )

        def does_not_load(e: Exception) -> ExportError:
            return ExportError(
                f"{self.out / path.name}: stage {i} does not load in onnxruntime{self._node_in(spec, str(e))}"
                f": {self._error_line(e)}; check that the model itself loads in onnxruntime, "
                "else please report this with the model"
            )

        open_session(path, options, fail=does_not_load)  # and let it go at once

    def _error_line(self, e: BaseException) -> str:
        """The error's first line, naming files by where they will be, not the temporary folder."""
        return error_line(e).replace(str(self.tmp), str(self.out))

    def _node_in(self, spec: StageSpec, message: str) -> str:
        """`` at node 'name'`` for the node an error message is about: by name, else by op type."""
        names = [n for n in spec.node_names + spec.constant_nodes if n and n in message]
        if names:
            return f" at node {max(names, key=len)!r}"
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
        for name in spec.node_names:
            info = self.builder.by_name[name]
            if info.op_type in words:
                return f" at node {name!r} ({info.op_type})"
        return ""


# --------------------------------------------------------------------------------------------------
# compressed boundaries

NODE_PREFIX = "onnxpipe/wire/"
ELEM_TYPE = {
    BoundaryDtype.FLOAT16: onnx.TensorProto.FLOAT16,
    BoundaryDtype.BFLOAT16: onnx.TensorProto.BFLOAT16,
    BoundaryDtype.INT8: onnx.TensorProto.INT8,
}
MIN_OPSET = {BoundaryDtype.FLOAT16: 6, BoundaryDtype.BFLOAT16: 13, BoundaryDtype.INT8: 10}
"""The default domain's opset each needs: Cast to bfloat16 (13), ``QuantizeLinear`` (10)."""


def compress_stage(model: onnx.ModelProto, spec: StageSpec, wire: Mapping[str, BoundaryDtype]) -> None:
    """Rewrite ``model`` (stage ``spec``) so that the tensors of ``wire`` it emits or receives cross
    compressed (see the module docstring)."""
    graph = model.graph
    inputs = {vi.name: vi for vi in graph.input}
    decompress: list[onnx.NodeProto] = []
    for t in spec.inputs:
        dtype = wire.get(t)
        if dtype is None:
            continue
        _to_wire(model, spec, inputs[t], dtype)
        if dtype == BoundaryDtype.INT8:
            graph.input.append(helper.make_tensor_value_info(scale_name(t), onnx.TensorProto.FLOAT, []))
            decompress.append(_node("DequantizeLinear", [dtype.wire_name(t), scale_name(t)], t))
        else:
            decompress.append(_node("Cast", [dtype.wire_name(t)], t, to=onnx.TensorProto.FLOAT))
    for i, node in enumerate(decompress):
        graph.node.insert(i, node)
    for out in list(graph.output):
        dtype = wire.get(out.name)
        if dtype is None:
            continue
        t = out.name
        _to_wire(model, spec, out, dtype)
        if dtype == BoundaryDtype.INT8:
            graph.output.append(helper.make_tensor_value_info(scale_name(t), onnx.TensorProto.FLOAT, []))
        if t not in inputs:  # else the stage passes on the compressed input it received
            graph.node.extend(_compressed(graph, t, dtype))


def _compressed(graph: onnx.GraphProto, t: str, dtype: BoundaryDtype) -> list[onnx.NodeProto]:
    """The nodes that make ``t``'s wire tensor (and an int8 one's scale)."""
    if dtype != BoundaryDtype.INT8:
        return [_node("Cast", [t], dtype.wire_name(t), to=ELEM_TYPE[dtype])]
    base = NODE_PREFIX + t
    constants: dict[str, np.ndarray] = {
        f"{base}/127": np.array(127.0, dtype=np.float32),
        f"{base}/tiny": np.array(np.finfo(np.float32).tiny, dtype=np.float32),
        f"{base}/zero_point": np.array(0, dtype=np.int8),
    }
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in constants.items())
    return [
        _node("Abs", [t], f"{base}/abs"),
        _node("ReduceMax", [f"{base}/abs"], f"{base}/max", keepdims=0),
        _node("Div", [f"{base}/max", f"{base}/127"], f"{base}/step"),
        _node("Max", [f"{base}/step", f"{base}/tiny"], scale_name(t)),  # an all-zero tensor: no 0/0
        _node("QuantizeLinear", [t, scale_name(t), f"{base}/zero_point"], dtype.wire_name(t)),
    ]


def _node(op: str, inputs: list[str], output: str, **attrs: int) -> onnx.NodeProto:
    node = helper.make_node(op, inputs, [output], name=NODE_PREFIX + output)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return node


def _to_wire(model: onnx.ModelProto, spec: StageSpec, vi: onnx.ValueInfoProto, dtype: BoundaryDtype) -> None:
    """Declare the boundary tensor ``vi`` as its wire tensor of ``dtype``, once the model's opset has the
    ops that make and read it."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if version < MIN_OPSET[dtype]:
        raise ExportError(
            f"stage {spec.index}: {dtype} boundaries need ONNX opset {MIN_OPSET[dtype]} or later and the "
            f"model imports opset {version}; choose {opt('boundary_dtype', BoundaryDtype.FLOAT16)}, or "
            "convert the model to a newer opset"
        )
    vi.name = dtype.wire_name(vi.name)
    vi.type.tensor_type.elem_type = ELEM_TYPE[dtype]


# --------------------------------------------------------------------------------------------------
# a decoder's own files


@dataclass(frozen=True)
class ModelSource:
    """The config a decoder's split takes its ids and context from (None: the graph alone), and the notes
    that say why one beside the model was set aside."""

    config: SourceConfig | None
    named: bool
    """Whether the user named it (``--genai-config``): a named config that does not fit is an error."""
    notes: tuple[str, ...] = ()


def model_source(view: ModelView, dec: DecoderInfo, named: SourceConfig | None) -> ModelSource:
    """``named``, else the config beside the model, kept only when its dims agree with the graph's (else
    set aside with a note: the user did not ask for it)."""
    if named is not None:
        return ModelSource(named, True)
    found = own_config(view, dec)
    config = found.config
    if config is None:
        return ModelSource(None, False, found.notes)
    facts = model_facts(view, dec)
    if not isinstance(facts, Unsupported):
        try:
            check_source_fits(config, facts[1])
        except UsageError as e:
            reason = str(e).split(": ", 1)[-1]
            return ModelSource(
                None, False, (*found.notes, f"{config.path.name} beside the model set aside: {reason}")
            )
    return ModelSource(config, False, found.notes)


def copy_model_files(view: ModelView, source: ModelSource, tmp: Path) -> tuple[tuple[str, ...], str | None]:
    """Copy the tokenizer, chat template and generation files beside the model (else one folder up, the
    ``onnx/`` layout, else beside the named config) into ``tmp``; their names, and where they were found
    when not beside the model.  A ``config.json`` is copied only when it is the config used."""
    folders = list(model_folders(view.path)) if view.path is not None else []
    if source.config is not None and source.config.path.parent.absolute() not in folders:
        folders.append(source.config.path.parent.absolute())
    for folder in folders:
        files = [
            p
            for p in tokenizer_files(folder)
            if p.name != HF_CONFIG_NAME
            or (source.config is not None and p.resolve() == source.config.path.resolve())
        ]
        if not files:
            continue
        for p in files:
            try:
                shutil.copyfile(p, tmp / p.name)
            except OSError as e:
                raise ExportError(
                    f"{tmp / p.name}: cannot copy {p} into the split ({e}); free space or fix access"
                ) from e
        origin = _origin(view.path, folder)
        return tuple(p.name for p in files), origin
    return (), None


def _origin(model: Path | None, folder: Path) -> str | None:
    """Where the model's files came from, when not from beside it."""
    if model is None or folder not in model_folders(model):
        return str(folder)
    return None if folder == model.absolute().parent else folder_place(model, folder)


def model_record(
    view: ModelView, dec: DecoderInfo, source: ModelSource, files: tuple[str, ...], folder: Path
) -> DecoderModelRecord:
    """``plan.decoder.model``: the vocabulary and context (the config's and the graph's), the config's
    token ids, the files copied into ``folder`` and which holds the chat template."""
    config = source.config
    dims = decoder_dims(view, dec)
    context = own_context(view, dec, config)
    tokens = config.tokens if config is not None else None
    template = chat_template(folder) if files else None
    return DecoderModelRecord(
        vocab_size=dims.vocab_size or (config.dims.vocab_size if config is not None else None),
        context_length=context.tokens if context is not None else None,
        bos_token_id=tokens.bos if tokens is not None else None,
        eos_token_ids=tokens.eos if tokens is not None else (),
        pad_token_id=tokens.pad if tokens is not None else None,
        config=config.path.name if config is not None else None,
        files=files,
        chat_template=template[1] if template is not None else None,
    )


def with_decoder_files(
    view: ModelView,
    manifest: Manifest,
    tmp: Path,
    out: Path,
    named: SourceConfig | None,
    decoder: FoundDecoder | None = None,
) -> Manifest:
    """A decoder split's own files written into ``tmp`` (the model's tokenizer files, a
    ``genai_config.json``) and recorded in ``manifest`` (its decoder's ``model`` record, the notes on the
    config and the files); nothing for a model that is not a decoder (and a ``named`` config is then
    refused)."""
    record = manifest.plan.decoder
    dec = decoder_of(view, decoder) if record is not None else None
    if record is None or dec is None:
        if named is not None:
            raise UsageError(
                f"{named.path}: {opt('genai_config')} is for a decoder LLM split between its layers, and "
                f"{view.label} was not split as one; leave {opt('genai_config')} out"
            )
        return manifest
    source = model_source(view, dec, named)
    files, origin = copy_model_files(view, source, tmp)
    notes = list(source.notes)
    if files:
        where = "" if origin is None else f" from {origin}"
        notes.append(f"copied the model's {', '.join(files)}{where} into the folder")
    notes.append(_write_genai_config(view, dec, manifest, tmp, out, source))
    plan = dataclasses.replace(
        manifest.plan,
        decoder=dataclasses.replace(record, model=model_record(view, dec, source, files, tmp)),
        notes=(*manifest.plan.notes, *notes),
    )
    return dataclasses.replace(manifest, plan=plan)


def _write_genai_config(
    view: ModelView, dec: DecoderInfo, manifest: Manifest, tmp: Path, out: Path, source: ModelSource
) -> str:
    """Write a decoder split's ``genai_config.json`` into ``tmp``, derived from ``source``'s config (the
    builder's own, when it lies beside the model); the note saying so, or saying why GenAI cannot run the
    split (an error for a config the user named)."""
    config = genai_config(view, dec, manifest, source.config)
    if isinstance(config, Unsupported):
        if source.named:
            raise ExportError(f"{out / GENAI_CONFIG_NAME}: cannot be written: {config.reason}")
        return f"{GENAI_CONFIG_NAME} not written: ONNX Runtime GenAI cannot run this split ({config.reason})"
    with writing(out / GENAI_CONFIG_NAME, out):
        # plain JSON, as GenAI's parser takes, with a 4-space indent as its builder writes
        (tmp / GENAI_CONFIG_NAME).write_text(json.dumps(config.to_json(), indent=4) + "\n", encoding="utf-8")
    return describe_written(config, source.config)


__all__ = [
    "AUTO_EXTERNAL_BYTES",
    "ExportOptions",
    "ExternalData",
    "export_stages",
    "stage_data_name",
    "stage_file_name",
]
