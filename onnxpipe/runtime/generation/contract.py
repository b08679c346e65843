"""The IO contract a generator drives a split by: read from the manifest (``plan.decoder.io``), or, for a
manifest written before the planner recorded it, made from the source model by the planner's own logic.
"""

from __future__ import annotations

from pathlib import Path

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest
from onnxpipe.planning.decoder_plan import io_contract
from onnxpipe.runtime.kvstate import CONTROL
from onnxpipe.verification.verify import source_model_path


def split_contract(manifest: Manifest, folder: str | Path) -> IOContract:
    """The IO contract of the split in ``folder``, or a :class:`UsageError` naming the folder and saying
    why it cannot generate."""
    where = Path(folder)
    file = manifest.source.file
    dec = manifest.plan.decoder
    if dec is None:
        raise UsageError(
            f"{where}: {file} was not split as a decoder LLM with a KV cache (the manifest has no "
            "plan.decoder); only such a split can generate"
        )
    if not dec.layer_cuts:
        raise UsageError(
            f"{where}: {file} was split with {opt('layer_cuts', False)}: a layer's cache may lie in two "
            "stages, so no worker can keep it; split it again with layer cuts"
        )
    contract = dec.io if dec.io is not None else _from_source(manifest, where)
    if contract.logits is None:
        raise UsageError(f"{where}: {file}: no logits output was found among the model outputs")
    return contract


def _from_source(manifest: Manifest, folder: Path) -> IOContract:
    """The contract of a manifest written before ``plan.decoder.io``: the planner's, from the source model
    the manifest records (:func:`onnxpipe.planning.decoder_plan.io_contract`)."""
    try:
        path = source_model_path(folder, manifest, None)
    except UsageError as e:
        raise UsageError(
            f"{e}: the manifest predates plan.decoder.io (what a generation loop feeds), which is made "
            "from the source model; re-run onnxpipe split"
        ) from None
    view = load_model(path, check=False)
    dec = find_decoder(view)
    if dec is None:
        raise UsageError(
            f"{path}: the source model recorded in {folder} is no decoder with a KV cache any more; "
            "re-run onnxpipe split"
        )
    return io_contract(view, dec)


def generation_input_types(manifest: Manifest, contract: IOContract) -> dict[str, str]:
    """What a generating pipeline takes: the model inputs but the cache, and the control tensor."""
    pasts = set(contract.past_to_present())
    types = {t.name: t.dtype for t in manifest.model_inputs if t.name not in pasts}
    types[CONTROL] = "int64"
    return types
