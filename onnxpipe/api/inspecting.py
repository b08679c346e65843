"""``inspect``: what a split folder holds, or what a model is (its inputs, opsets, whether it is a decoder
with a KV cache)."""

from __future__ import annotations

from pathlib import Path

from onnxpipe.api.options import InspectOptions
from onnxpipe.api.results import FolderInspection, Inspection, ModelInspection
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_facts
from onnxpipe.ir.load import load_model, summarize
from onnxpipe.manifest import load_manifest, stage_file_problems


def inspect(target: str | Path, options: InspectOptions | None = None) -> Inspection:
    """A split folder's manifest, its stage files checked against it (unless ``options.check_files`` is
    false): what is missing or changed is reported, not raised, so the folder can still be looked at; or
    a model's summary and decoder, if it is one."""
    opts = options or InspectOptions()
    path = Path(target)
    if path.is_dir():
        manifest = load_manifest(path, check_files=False)
        problems = stage_file_problems(path, manifest) if opts.check_files else []
        return FolderInspection(manifest, tuple(problems), checked=opts.check_files)
    view = load_model(path)
    dec = find_decoder(view)
    facts = decoder_facts(view, dec) if dec is not None else None
    return ModelInspection(view=view, summary=summarize(view), decoder=dec, facts=facts)
