"""The kinds of cost a profile holds, apart from :mod:`onnxpipe.cost.profile` so that the CLI's parsers
can offer them as ``--cost`` choices without loading the model code (``onnxpipe --help`` stays fast)."""

from __future__ import annotations

from enum import StrEnum


class CostSource(StrEnum):
    """Where a profile's costs come from: measured with onnxruntime, or counted from the graph."""

    PROFILE = "profile"
    STATIC = "static"


COST_SOURCES: tuple[str, ...] = tuple(s.value for s in CostSource)
