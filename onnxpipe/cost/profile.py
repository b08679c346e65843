"""The cost of every node of one model: a :class:`Profile`, and its JSON file.

A profile is what the planner reads, whoever made it: measured with onnxruntime
(:func:`onnxpipe.cost.measure.profile_model`, ``source="profile"``) or from FLOPs and bytes
(:func:`onnxpipe.cost.static.static_profile`, ``source="static"``), or either corrected by the stages'
own times (calibration, :func:`corrected`).  Its file is read field by field with
:mod:`onnxpipe.core.codec` from the fields' types, each error naming the file and the JSON path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

from onnxpipe.core.choices import CostSource
from onnxpipe.core.codec import Codec, Finite, Minimum
from onnxpipe.core.errors import ProfileError
from onnxpipe.core.files import write_text_atomic
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.jsonread import Document, Value
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples

SCHEMA_VERSION = 1
_CODEC = Codec()
_ADVICE = "re-run onnxpipe profile to make a new one"
Seconds = Annotated[float, Finite(least=0.0)]

DEFAULT_RUNTIME = "onnxruntime (CPUExecutionProvider)"
"""What measured a profile that does not say (every profile before ``profile --runtime``)."""


@dataclass(frozen=True)
class Profile:
    """Seconds per compute node of one model at fixed input shapes, with what the partitioner needs."""

    schema_version: int
    model_sha256: str
    model_name: str
    source: CostSource
    """``"profile"`` (measured) or ``"static"`` (cost model): a :class:`CostSource` value."""
    threads: Annotated[int, Minimum(1)]
    runs: int
    input_shapes: Mapping[str, tuple[int, ...]]
    node_seconds: Mapping[str, Seconds]
    """Every compute node of the view; 0.0 for nodes the optimizer folded away."""
    tensor_bytes: Mapping[str, int]
    """Bytes of each tensor at the profiled shapes."""
    total_seconds: Seconds
    """Median whole-run wall time at deployment settings (static: the sum of node times)."""
    regions: tuple[tuple[str, ...], ...]
    """Groups of original nodes onnxruntime runs as one fused kernel (each of size >= 2)."""
    unattributed: tuple[str, ...]
    """Human-readable notes on every time not attributed to exactly one original node."""
    exact_fraction: Seconds
    """Share of the time attributed to exactly one original node."""
    inputs: tuple[InputRecord, ...] = ()
    """The ``--inputs`` files the costs were measured on (name, sha256, shapes; never the data); empty
    when the inputs were random at ``input_shapes``."""
    samples: Samples | None = field(default=None, compare=False, repr=False)
    """The sample inputs themselves, in memory only (not saved): calibration times the stages on them."""
    origin: str = field(default="", compare=False, repr=False)
    """The file the profile was read from, for messages (not saved)."""
    runtime: str = DEFAULT_RUNTIME
    """What measured it: ``"onnxruntime (CPUExecutionProvider)"`` (``onnxpipe profile``'s default),
    ``"openvino (CPU)"``, ``"tract"``... (``profile --runtime``, :mod:`onnxpipe.cost.runtime_profile`).
    Optional in the file (older profiles are onnxruntime's)."""

    @property
    def on_reference(self) -> bool:
        """Whether the reference runtime measured it (onnxruntime on the CPU), as calibration times."""
        return self.runtime == DEFAULT_RUNTIME

    # ---- JSON

    def to_json(self) -> str:
        return json.dumps(_CODEC.encode(Profile, self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source_name: str = "") -> Profile:
        """Parse and validate; :class:`ProfileError` naming ``source_name`` and the JSON path on bad
        content (maps keyed by node and tensor names name their entries ``node_seconds['name']``)."""
        doc = Document(source_name or "profile", ProfileError, _ADVICE, root="profile")
        data = doc.parse(text)
        top = doc.read(data)
        if not isinstance(data, dict):
            raise top.expected("a JSON object")
        f = top.fields()
        version = f["schema_version"].integer(minimum=None)
        if version != SCHEMA_VERSION:
            raise f["schema_version"].fail(f"schema_version {version}, this onnxpipe reads {SCHEMA_VERSION}")
        profile: Profile = _CODEC.decode(Profile, top)
        if profile.exact_fraction > 1.0 + 1e-9:
            raise f["exact_fraction"].fail(f"expected a share in [0, 1], got {profile.exact_fraction}")
        for i, region in enumerate(profile.regions):
            if len(region) < 2:
                raise Value(region, f"regions[{i}]", doc).fail("expected a region of at least two node names")
        return replace(profile, origin=source_name)

    def save(self, path: str | Path) -> None:
        """Write through a temporary file renamed into place: a failed write leaves nothing behind."""
        p = Path(path)
        try:
            write_text_atomic(p, self.to_json())
        except OSError as e:
            raise ProfileError(f"{p}: cannot write the profile ({e.strerror}); choose another path") from e

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise ProfileError(
                f"{p}: cannot read the profile ({reason}); give a file onnxpipe profile wrote"
            ) from e
        return cls.from_json(text, source_name=str(p))

    def check_matches(self, view: ModelView) -> None:
        """Refuse a profile made for another model (compared by the model file's sha256)."""
        if self.model_sha256 == view.sha256:
            return
        which = Path(self.origin).name if self.origin else "the profile"
        made_for = self.model_name or "another model"
        this = view.file_name or "the in-memory model"
        raise ProfileError(
            f"{which}: made for model {made_for} (sha256 {self.model_sha256[:12]}), not {this} "
            f"(sha256 {view.sha256[:12]}); re-run onnxpipe profile"
        )


def corrected(profile: Profile, stage_nodes: Sequence[Sequence[str]], factors: Sequence[float]) -> Profile:
    """``profile`` with every node of stage ``s`` (``stage_nodes[s]``, node names) scaled by ``factors[s]``:
    calibration's correction, once the stages' own times are known."""
    scale = {name: f for names, f in zip(stage_nodes, factors, strict=True) for name in names}
    node_seconds: Mapping[str, float] = {n: t * scale.get(n, 1.0) for n, t in profile.node_seconds.items()}
    return replace(profile, node_seconds=node_seconds, total_seconds=sum(node_seconds.values()))


__all__ = ["SCHEMA_VERSION", "CostSource", "Profile", "corrected"]
