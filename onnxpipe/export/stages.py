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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from onnxpipe.core.choices import ExternalData
from onnxpipe.core.errors import ExportError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.model_config import SourceConfig
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.export.build import StageBuilder
from onnxpipe.export.checks import check_exportable, check_plan
from onnxpipe.export.contract import ContractMaker, required_opsets
from onnxpipe.export.model_files import with_decoder_files
from onnxpipe.export.options import ExportOptions
from onnxpipe.export.outdir import normalized, staged_folder, writing
from onnxpipe.export.record import StageFile, build_manifest, shared_weights
from onnxpipe.export.weightfile import externalize
from onnxpipe.export.wire import compress_stage
from onnxpipe.ir.decoder import FoundDecoder
from onnxpipe.ir.external import holds_external
from onnxpipe.ir.load import check_model
from onnxpipe.ir.model import PROTOBUF_LIMIT, ModelView
from onnxpipe.manifest import MANIFEST_NAME, Manifest, write_manifest
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


__all__ = [
    "AUTO_EXTERNAL_BYTES",
    "ExportOptions",
    "ExternalData",
    "export_stages",
    "stage_data_name",
    "stage_file_name",
]
