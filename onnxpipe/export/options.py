"""What a split folder and a Triton repository are written with, apart from :mod:`onnxpipe.export.stages`
(which loads onnx) so that options objects are made without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.choices import ExternalData, TritonPlatform, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

DEFAULT_TRITON_MAX_BATCH = 8
"""``max_batch_size`` of a repository whose tensors all carry the batch at axis 0."""


@dataclass(frozen=True)
class ExportOptions:
    """How ``split`` writes the folder: replacing an earlier split (``force``), where weights go, and the
    config ONNX Runtime GenAI starts from (``genai_config``: the model's ``genai_config.json`` or Hugging
    Face ``config.json``; without it a decoder's ``genai_config.json`` is derived from the graph)."""

    force: bool = False
    external_data: ExternalData = ExternalData.AUTO
    """``never`` keeps weights inside each ``stage_<i>.onnx``; ``always`` writes each stage's weights to
    its own ``stage_<i>.onnx.data``; ``auto`` does so only for a stage over ~1.8 GB or when the source
    kept its weights in external files."""
    genai_config: Path | None = None
    source_name: str | None = None
    """The file name recorded for the source (default: the model's file name)."""
    microbatches: int = DEFAULT_MICROBATCHES
    """Micro-batches of the stream schedule recorded in the manifest."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "external_data", choice(ExternalData, self.external_data, "external_data"))
        if self.microbatches < 1:
            raise UsageError(
                f"{opt('microbatches', self.microbatches)}: give a positive number of micro-batches"
            )
        if self.genai_config is not None:
            object.__setattr__(self, "genai_config", Path(self.genai_config))


@dataclass(frozen=True)
class TritonOptions:
    """What :func:`onnxpipe.export_triton` writes into ``out``: an ensemble named ``name`` (default: the
    source model's file stem) over a model per stage, each run by ``platform`` (``auto``: each stage's
    runtime in the manifest), with ``max_batch_size`` where every tensor has its batch at axis 0 (else
    the configs say 0 and list full dims); ``force`` replaces an earlier repository in ``out``."""

    out: Path
    name: str | None = None
    platform: TritonPlatform = TritonPlatform.AUTO
    max_batch_size: int = DEFAULT_TRITON_MAX_BATCH
    force: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "platform", choice(TritonPlatform, self.platform, "platform"))
