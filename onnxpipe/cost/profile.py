"""The cost of every node of one model: a :class:`Profile`, and its JSON file.

A profile is what the planner reads, whoever made it: measured with onnxruntime
(:func:`onnxpipe.cost.measure.profile_model`, ``source="profile"``) or from FLOPs and bytes
(:func:`onnxpipe.cost.static.static_profile`, ``source="static"``), or either corrected by the stages'
own times (calibration, :func:`corrected`).  Its file is read field by field with
:mod:`onnxpipe.core.jsonread`, each error naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from onnxpipe.core.choices import CostSource, values
from onnxpipe.core.codec import Codec
from onnxpipe.core.errors import ProfileError
from onnxpipe.core.files import write_text_atomic
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.jsonread import Document, Fields, Value, syntax_error_text
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples

SCHEMA_VERSION = 1
_CODEC = Codec()
_Inputs = tuple[InputRecord, ...]

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
    threads: int
    runs: int
    input_shapes: Mapping[str, tuple[int, ...]]
    node_seconds: Mapping[str, float]
    """Every compute node of the view; 0.0 for nodes the optimizer folded away."""
    tensor_bytes: Mapping[str, int]
    """Bytes of each tensor at the profiled shapes."""
    total_seconds: float
    """Median whole-run wall time at deployment settings (static: the sum of node times)."""
    regions: tuple[tuple[str, ...], ...]
    """Groups of original nodes onnxruntime runs as one fused kernel (each of size >= 2)."""
    unattributed: tuple[str, ...]
    """Human-readable notes on every time not attributed to exactly one original node."""
    exact_fraction: float
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
        data = {
            "schema_version": self.schema_version,
            "model_sha256": self.model_sha256,
            "model_name": self.model_name,
            "source": self.source,
            "threads": self.threads,
            "runs": self.runs,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "total_seconds": self.total_seconds,
            "exact_fraction": self.exact_fraction,
            "node_seconds": dict(self.node_seconds),
            "tensor_bytes": dict(self.tensor_bytes),
            "regions": [list(r) for r in self.regions],
            "unattributed": list(self.unattributed),
            **({"inputs": _CODEC.encode(_Inputs, self.inputs)} if self.inputs else {}),
            "runtime": self.runtime,
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source_name: str = "") -> Profile:
        """Parse and validate; :class:`ProfileError` naming ``source_name`` and the field on bad content."""
        where = source_name or "profile"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(
                f"{where}: not valid JSON ({syntax_error_text(e)}); re-run onnxpipe profile"
            ) from None
        doc = Document(where, ProfileError, "re-run onnxpipe profile to make a new one", root="profile")
        top = doc.read(data)
        if not isinstance(data, dict):
            raise top.expected("a JSON object")
        return _read_profile(top.fields(), source_name)

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
    scale: dict[str, float] = {}
    for names, f in zip(stage_nodes, factors, strict=True):
        for name in names:
            scale[name] = f
    node_seconds: Mapping[str, float] = {n: t * scale.get(n, 1.0) for n, t in profile.node_seconds.items()}
    return replace(profile, node_seconds=node_seconds, total_seconds=sum(node_seconds.values()))


# --------------------------------------------------------------------------------------------------
# reading: one line per field (onnxpipe.core.jsonread); maps keyed by node and tensor names name their
# entries as ``node_seconds['name']``, since those names hold dots of their own


def _read_profile(f: Fields, origin: str) -> Profile:
    version = f["schema_version"].integer(minimum=None)
    if version != SCHEMA_VERSION:
        raise f["schema_version"].fail(f"schema_version {version}, this onnxpipe reads {SCHEMA_VERSION}")
    text = f["source"].string()
    if text not in values(CostSource):
        raise f["source"].fail(f"source {text!r}, expected 'profile' or 'static'")
    source = CostSource(text)
    exact = _seconds(f["exact_fraction"])
    if exact > 1.0 + 1e-9:
        raise f["exact_fraction"].fail(f"expected a share in [0, 1], got {exact}")
    return Profile(
        schema_version=version,
        model_sha256=f["model_sha256"].string(),
        model_name=f["model_name"].string(),
        source=source,
        threads=f["threads"].integer(minimum=1),
        runs=f["runs"].integer(minimum=0),
        input_shapes=MappingProxyType(
            f["input_shapes"].dict_of(lambda dims: dims.list_of(Value.integer), subscript=True)
        ),
        node_seconds=MappingProxyType(f["node_seconds"].dict_of(_seconds, subscript=True)),
        tensor_bytes=MappingProxyType(f["tensor_bytes"].dict_of(Value.integer, subscript=True)),
        total_seconds=_seconds(f["total_seconds"]),
        regions=f["regions"].list_of(_region),
        unattributed=f["unattributed"].list_of(Value.string),
        exact_fraction=exact,
        inputs=_CODEC.decode(_Inputs, f.get("inputs", [])),
        origin=origin,
        runtime=f.get("runtime", DEFAULT_RUNTIME).string(),
    )


def _seconds(v: Value) -> float:
    """A finite number of seconds, 0 or more."""
    x = v.finite()
    if x < 0:
        raise v.fail(f"expected a finite non-negative number, got {x}")
    return x


def _region(v: Value) -> tuple[str, ...]:
    names = v.list_of(Value.string)
    if len(names) < 2:
        raise v.fail("expected a region of at least two node names")
    return names


__all__ = ["SCHEMA_VERSION", "CostSource", "Profile", "corrected"]
