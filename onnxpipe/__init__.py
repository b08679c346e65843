"""onnxpipe: split one ONNX model into a balanced pipeline of stage models.

The public API is this module's ``__all__``; everything else is private and may change.

>>> import onnxpipe
>>> sorted(onnxpipe.__all__)[:3]
['Manifest', 'ModelView', 'OnnxpipeError']
"""

from onnxpipe.api import SplitResult, get_profile, split
from onnxpipe.costs import static_profile
from onnxpipe.errors import (
    ExportError,
    ManifestError,
    MemoryFitError,
    ModelLoadError,
    OnnxpipeError,
    PartitionError,
    ProfileError,
    UsageError,
    VerificationError,
)
from onnxpipe.export import export_stages
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.model import ModelView, load_model
from onnxpipe.partition import Partition, solve
from onnxpipe.plan import Plan, StageSpec, make_plan
from onnxpipe.profile import Profile, profile_model
from onnxpipe.verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "ExportError",
    "Manifest",
    "ManifestError",
    "MemoryFitError",
    "ModelLoadError",
    "ModelView",
    "OnnxpipeError",
    "Partition",
    "PartitionError",
    "Plan",
    "Profile",
    "ProfileError",
    "SplitResult",
    "StageSpec",
    "UsageError",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "export_stages",
    "get_profile",
    "load_manifest",
    "load_model",
    "make_plan",
    "profile_model",
    "solve",
    "split",
    "static_profile",
    "verify",
]
