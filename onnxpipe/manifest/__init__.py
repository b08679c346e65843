"""The manifest of a split folder (``manifest.json``): the contract between export and every reader.

Its parts are frozen dataclasses (:mod:`.entries`), the whole is :class:`.manifest.Manifest`; it is
written by :mod:`.write`, read field by field by :mod:`.read` and checked across fields by
:mod:`.check`.  ``docs/manifest.md`` documents every field and the versioning.  Importing this room
loads neither onnx nor onnxruntime: it imports ``core``, ``cluster`` and ``schedule`` only.
"""

from onnxpipe.core.kv import KVPair
from onnxpipe.manifest.entries import (
    MANIFEST_NAME,
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    DecoderModelRecord,
    DecoderRecord,
    DeviceRecord,
    ModelOutput,
    ModelTensor,
    NodeSplitRecord,
    PlanSummary,
    SameValue,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    VerificationRecord,
)
from onnxpipe.manifest.limits import DecoderLimits, decoder_limits
from onnxpipe.manifest.manifest import (
    Manifest,
    check_stage_files,
    content_digest,
    load_manifest,
    stage_file_problems,
    write_manifest,
)

__all__ = [
    "MANIFEST_NAME",
    "MODEL",
    "MODEL_INPUT",
    "MODEL_OUTPUT",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "DecoderLimits",
    "DecoderModelRecord",
    "DecoderRecord",
    "DeviceRecord",
    "KVPair",
    "Manifest",
    "ModelOutput",
    "ModelTensor",
    "NodeSplitRecord",
    "PlanSummary",
    "SameValue",
    "SourceInfo",
    "StageEntry",
    "StageInput",
    "StageOutput",
    "VerificationRecord",
    "check_stage_files",
    "content_digest",
    "decoder_limits",
    "load_manifest",
    "stage_file_problems",
    "write_manifest",
]
