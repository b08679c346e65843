"""Every choice the product offers, as an enum: what each option may be set to.

One module for all of them, at the bottom of the house, so that every room names a choice the same way
and the CLI offers them (``--schedule``, ``--local-mode``...) without loading the rooms that act on them.
A value is the text the user writes; a StrEnum compares equal to that text, so a choice read from a
file or given as a string in Python is the enum once the options object that holds it is made
(:func:`choice`).  The defaults are the options objects' fields, defined there once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt

E = TypeVar("E", bound=StrEnum)


class CostSource(StrEnum):
    """Where a profile's costs come from: measured with onnxruntime, or counted from the graph."""

    PROFILE = "profile"
    STATIC = "static"


class Runtime(StrEnum):
    """Which engine runs a stage."""

    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TRACT = "tract"


class VerifyRuntime(StrEnum):
    """What runs the stages a verification chains: one runtime for every stage, or each stage on its
    own device's runtime (a split made for a devices file)."""

    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TRACT = "tract"
    DEVICES = "devices"


class Phase(StrEnum):
    """The two shapes a decoder LLM runs at: a prompt, and one generation step."""

    PREFILL = "prefill"
    DECODE = "decode"


class PhaseChoice(StrEnum):
    """Which phase a decoder's split is balanced for: a prompt, a generation step, or both at once."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases this choice balances, prefill first."""
        return (Phase.PREFILL, Phase.DECODE) if self == PhaseChoice.BOTH else (Phase(self.value),)


class Ends(StrEnum):
    """Where a decoder's embedding and LM head go."""

    FREE = "free"
    """Wherever the balance puts them."""
    ATTACHED = "attached"
    """The embedding with the first layer, the LM head with the last."""
    OWN = "own"
    """Each in a stage of its own (the first and the last), as Olive's ``unique_embeds_lm_head_splits``."""


class ScheduleKind(StrEnum):
    """How micro-batches flow: streaming inference, or a training schedule (forward and backward)."""

    STREAM = "stream"
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @property
    def training(self) -> bool:
        return self != ScheduleKind.STREAM


class ScheduleChoice(StrEnum):
    """A schedule, or ``auto``: the faster of the two training ones."""

    STREAM = "stream"
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    AUTO = "auto"

    @property
    def kinds(self) -> tuple[ScheduleKind, ...]:
        """The schedules this choice tries."""
        if self == ScheduleChoice.AUTO:
            return (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)
        return (ScheduleKind(self.value),)


class DeviceOrder(StrEnum):
    """The devices in the file's order, or the best order (and choice) the planner finds."""

    FIXED = "fixed"
    FREE = "free"


class SplitNodes(StrEnum):
    """Whether the planner may cut one node into parts over consecutive stages."""

    AUTO = "auto"
    OFF = "off"


class LinkModel(StrEnum):
    """How a link's transfer time counts against a stage (:mod:`onnxpipe.planning.request`)."""

    SERIAL = "serial"
    """A stage receives its inputs, then computes: compute + transfer in."""
    OVERLAP = "overlap"
    """Links move the next micro-batch while the stage computes: the larger of the two."""

    @property
    def described(self) -> str:
        """The link model and what it means, for a plan's table."""
        if self == LinkModel.SERIAL:
            return "serial (a stage's transfer in adds to its compute)"
        return "overlap (links run beside compute; the larger of the two counts)"


class Objective(StrEnum):
    """What a plan minimises: the slowest stage or hop (a stream of requests), or the sum of every stage
    and hop (one request at a time, as single-sequence decoding feels it)."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"


class BoundaryDtype(StrEnum):
    """What the float32 activations crossing a cut travel as: cast to 16 bits, quantized to int8 with a
    per-tensor scale (``max|x| / 127``, computed in the sending stage), left as they are, or ``auto``:
    float16 where a cut's transfer would bound the pipeline at its link's rate, float32 elsewhere."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT8 = "int8"
    AUTO = "auto"

    def wire_bytes(self, nbytes: int) -> int:
        """Bytes a float32 tensor of ``nbytes`` takes on the link (int8: with its 4-byte scale)."""
        if self == BoundaryDtype.INT8:
            return nbytes // 4 + SCALE_BYTES
        return nbytes // 2 if self in (BoundaryDtype.FLOAT16, BoundaryDtype.BFLOAT16) else nbytes

    def wire_name(self, tensor: str) -> str:
        """The name ``tensor`` crosses the cut under (the receiving stage remakes ``tensor`` from it)."""
        return f"{tensor}/onnxpipe_{self.value}"


SCALE_BYTES = 4
"""An int8 boundary tensor's scale: one float32, sent as ``<tensor>/onnxpipe_scale``."""


def scale_name(tensor: str) -> str:
    """The name of the scale an int8 boundary tensor is sent with."""
    return f"{tensor}/onnxpipe_scale"


class CalibrationMode(StrEnum):
    """How calibration times the stages: each alone, together as a pinned thread pipeline, ``auto``: as a
    pipeline when this machine has a physical core for every stage thread, alone otherwise; or ``ray``:
    as a pipeline on a Ray cluster, each stage on the node it will run on."""

    ALONE = "alone"
    PIPELINE = "pipeline"
    AUTO = "auto"
    RAY = "ray"


class ExternalData(StrEnum):
    """Where stage weights go: a side file for a big stage or a source with external weights (``auto``),
    never, or always."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class TritonPlatform(StrEnum):
    """What runs each stage of a Triton repository: ``auto`` takes each stage's runtime from the
    manifest (OpenVINO where it says so, else onnxruntime)."""

    AUTO = "auto"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"


class Backend(StrEnum):
    """Where a pipeline's workers run: on this machine, or as actors of a Ray cluster."""

    LOCAL = "local"
    RAY = "ray"


class RayFiles(StrEnum):
    """How a Ray actor gets its stage's files: shipped by the driver through Ray to the node it lands on
    (checked by sha256, kept in the node's cache), or read from a folder every node shares."""

    SHIP = "ship"
    SHARED = "shared"


class LocalMode(StrEnum):
    """Local workers as threads of this process, or as processes joined by shared memory."""

    THREADS = "threads"
    PROCESSES = "processes"


def choice(kind: type[E], value: object, field: str) -> E:
    """``value`` as the enum ``kind`` (an enum member, or its text), or a :class:`UsageError` naming the
    option ``field`` and the choices."""
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value))
    except ValueError:
        names = ", ".join(str(m.value) for m in kind)
        raise UsageError(f"{opt(field, value)}: choose one of {names}") from None


def values(kind: type[StrEnum]) -> tuple[str, ...]:
    """The texts of an enum's members, in order: what the CLI offers."""
    return tuple(str(m.value) for m in kind)
