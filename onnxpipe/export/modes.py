"""The choices of ``split --external-data``, apart from :mod:`onnxpipe.export.stages` (which loads onnx) so
that the CLI's parser can offer them without loading it."""

from __future__ import annotations

from typing import Literal, get_args

ExternalData = Literal["auto", "never", "always"]
"""Where stage weights go: ``auto`` (a side file for a big stage or a source with external weights),
``never`` or ``always``."""
EXTERNAL_DATA_MODES: tuple[str, ...] = get_args(ExternalData)

TritonPlatform = Literal["auto", "onnxruntime", "openvino"]
"""What runs each stage of a Triton repository (``export-triton --platform``): ``auto`` takes each stage's
runtime from the manifest (OpenVINO where it says so, else onnxruntime)."""
TRITON_PLATFORMS: tuple[str, ...] = get_args(TritonPlatform)
DEFAULT_TRITON_MAX_BATCH = 8
"""``max_batch_size`` of a repository whose tensors all carry the batch at axis 0."""
