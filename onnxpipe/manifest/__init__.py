"""The manifest of a split folder (``manifest.json``): the contract between export and every reader.

Its parts are frozen dataclasses (:mod:`.entries` for the files and tensors written, the plan's own
records from :mod:`onnxpipe.planning.records`), the whole is :class:`.manifest.Manifest`; it is written
and read by one codec (:mod:`onnxpipe.core.codec`), older versions brought up to date by :mod:`.layout`,
and checked across fields by :mod:`.manifest`.  ``docs/manifest.md`` documents every field and the
versioning.  Importing this room loads neither onnx nor onnxruntime (nor does ``planning.records``).
"""

from onnxpipe.manifest.entries import (
    MANIFEST_NAME,
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    DeviceRecord,
    ModelOutput,
    ModelTensor,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    VerificationRecord,
)
from onnxpipe.manifest.manifest import (
    DecoderLimits,
    Manifest,
    content_digest,
    decoder_limits,
    load_manifest,
    stage_file_problems,
    write_manifest,
)
from onnxpipe.planning.records import PlanSummary

__all__ = [
    "MANIFEST_NAME",
    "MODEL",
    "MODEL_INPUT",
    "MODEL_OUTPUT",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "DecoderLimits",
    "DeviceRecord",
    "Manifest",
    "ModelOutput",
    "ModelTensor",
    "PlanSummary",
    "SourceInfo",
    "StageEntry",
    "StageInput",
    "StageOutput",
    "VerificationRecord",
    "content_digest",
    "decoder_limits",
    "load_manifest",
    "stage_file_problems",
    "write_manifest",
]
