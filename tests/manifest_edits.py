"""Manifests changed by a test as onnxpipe would have written them: the content edited, then sealed with
its digest again (a manifest whose digest does not match is refused: tests/unit/test_manifest.py)."""

from __future__ import annotations

import json
from typing import Any

from onnxpipe.manifest import content_digest


def sealed(obj: dict[str, Any]) -> str:
    """``obj`` as manifest text, its ``digest`` that of its content (dropped and remade)."""
    content = {k: v for k, v in obj.items() if k != "digest"}
    try:
        digest = content_digest(content)
    except ValueError:  # NaN, as a test puts there: JSON has none, so no writer could have sealed it
        return json.dumps(content)
    return json.dumps({**content, "digest": digest})
