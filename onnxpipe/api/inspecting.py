"""``inspect``: what a split folder holds, or what a model is (its inputs, opsets, whether it is a decoder
with a KV cache)."""

from __future__ import annotations

from pathlib import Path

from onnxpipe.api.options import InspectOptions
from onnxpipe.api.results import FolderInspection, Inspection, ModelInspection
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_facts
from onnxpipe.ir.load import load_model
from onnxpipe.ir.summary import summarize
from onnxpipe.manifest import load_manifest


def inspect(target: str | Path, options: InspectOptions | None = None) -> Inspection:
    """A split folder's manifest (its stage files checked against it with ``options.check_files``), or a
    model's summary and decoder, if it is one."""
    opts = options or InspectOptions()
    path = Path(target)
    if path.is_dir():
        return FolderInspection(load_manifest(path, check_files=opts.check_files))
    view = load_model(path)
    dec = find_decoder(view)
    facts = decoder_facts(view, dec) if dec is not None else None
    return ModelInspection(view=view, summary=summarize(view), decoder=dec, facts=facts)
