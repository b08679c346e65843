"""The choices of ``split --external-data``, apart from :mod:`onnxpipe.export.stages` (which loads onnx) so
that the CLI's parser can offer them without loading it."""

from __future__ import annotations

from typing import Literal, get_args

ExternalData = Literal["auto", "never", "always"]
"""Where stage weights go: ``auto`` (a side file for a big stage or a source with external weights),
``never`` or ``always``."""
EXTERNAL_DATA_MODES: tuple[str, ...] = get_args(ExternalData)
