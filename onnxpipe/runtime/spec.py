"""What one worker runs: a model file, the tensors it receives, runs on and sends on, and how to run it.

A pipeline is a chain of workers.  Every micro-batch enters the first worker as the set of model inputs
any stage (or a pass-through model output) reads, and each worker forwards downstream exactly the tensors
that a later stage or the model outputs still need, so that one FIFO chain carries everything and the
order of micro-batches is kept by construction.  :func:`stage_specs` derives these sets from a manifest;
:func:`model_spec` makes the one-worker "chain" of a whole model (a replica, for the baselines).

Specs are plain frozen data: they are pickled to worker processes and Ray actors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from onnxpipe.cluster.model import Device
from onnxpipe.core.errors import UsageError
from onnxpipe.core.extras import install_hint
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.options import opt
from onnxpipe.core.runtimes import EngineConfig, runs_here
from onnxpipe.core.runtimes import available as runtime_available
from onnxpipe.manifest import Manifest, ModelTensor, StageEntry
from onnxpipe.runtime.kvstate import CONTROL, CacheSlot, PadSide

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

_GPU_DEVICE = re.compile(r"^(?:cuda|gpu)(?::?(\d+))?$", re.IGNORECASE)
_CPU_DEVICE = re.compile(r"^cpu\d*$", re.IGNORECASE)


@dataclass(frozen=True)
class Placement(EngineConfig):
    """How a worker runs its stage: its engine (the runtime, onnxruntime's provider and options or
    OpenVINO's device and config, intra-op threads) and the CPUs it is pinned to (none: not pinned; see
    :mod:`onnxpipe.runtime.affinity`)."""

    cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelFile:
    """A file a worker's model is made of: its name in the model's folder (the model file, or its
    external weights beside it) and its sha256 as the manifest records it."""

    name: str
    sha256: str


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of a chain.

    ``receives`` arrive from upstream (model inputs for the first worker); ``inputs`` of them are fed to
    the session, which computes ``outputs``; ``sends`` (a subset of ``receives`` and ``outputs``) go
    downstream, or back to the caller from the last worker.
    """

    index: int
    label: str
    path: str
    receives: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    sends: tuple[str, ...]
    placement: Placement = Placement()
    stage: StageEntry | None = None
    """The manifest's record of the stage; None for a worker of the whole model (a replica)."""
    caches: tuple[CacheSlot, ...] = ()
    """A generating worker's past inputs, fed from its own cache (:mod:`onnxpipe.runtime.kvstate`)."""
    generating: bool = False
    """Each micro-batch is a generation step carrying :data:`~onnxpipe.runtime.kvstate.CONTROL`."""

    @property
    def device(self) -> str:
        """The device the manifest names for the stage (a replica's: ``cpu``)."""
        return self.stage.device if self.stage is not None else "cpu"

    @property
    def files(self) -> tuple[ModelFile, ...]:
        """The stage's file and its external weights with the sha256 the manifest records, for a backend
        that ships them to another machine (Ray); empty for a replica: the backend reads them from the
        model (:mod:`.model_files`)."""
        st = self.stage
        if st is None:
            return ()
        if st.external_data is None or st.external_data_sha256 is None:
            return (ModelFile(st.file, st.sha256),)
        return ModelFile(st.file, st.sha256), ModelFile(st.external_data, st.external_data_sha256)


def placement_for_device(device: str, threads: int) -> Placement:
    """The provider a manifest's ``device`` names: ``cpu``/``cpuN``, ``cuda[:N]``/``gpu[N]``, or a provider.

    A device named after an onnxruntime provider (``"CUDAExecutionProvider"``) is taken as that provider.
    """
    if threads < 1:
        raise UsageError(f"threads {threads}: give a positive number of intra-op threads")
    name = device.strip()
    if not name or _CPU_DEVICE.match(name):
        return Placement(CPU_PROVIDER, (), threads)
    m = _GPU_DEVICE.match(name)
    if m:
        return Placement(CUDA_PROVIDER, (("device_id", m.group(1) or "0"),), threads)
    if name.endswith("ExecutionProvider"):
        return Placement(name, (), threads)
    raise UsageError(
        f"device {device!r}: onnxpipe run knows cpu, cpuN, cuda[:N] and onnxruntime provider names; "
        f"give a devices file ({opt('devices')}) that says which provider this device uses"
    )


def placement_of(device: Device, threads: int | None = None) -> Placement:
    """How a stage on ``device`` (of a devices file or a manifest's cluster) runs.

    Its provider and provider options, and its ``threads`` unless ``threads`` is given.
    """
    n = device.engine.threads if threads is None else threads
    if n < 1:
        raise UsageError(f"threads {n}: give a positive number of intra-op threads")
    c = device.engine_config(n)
    return Placement(c.provider, c.provider_options, n, c.runtime, c.openvino_device, c.openvino_config)


def manifest_placements(manifest: Manifest, threads: int | None = None) -> list[Placement]:
    """Each stage's placement as the split folder records it.

    A manifest with a ``cluster`` (a split made with ``--devices``) names, for each stage, a device of
    it: the stage runs with that device's provider, provider options and threads.  A manifest without
    one names devices like ``cpu0`` or ``cuda:1``, mapped by :func:`placement_for_device`, with the plan's
    threads.  ``threads``, when given, replaces every stage's.
    """
    if manifest.cluster is None:
        n = manifest.plan.threads if threads is None else threads
        return [placement_for_device(st.device, n) for st in manifest.stages]
    by_name = {d.name: d for d in manifest.cluster.devices}
    result: list[Placement] = []
    for st in manifest.stages:
        dev = by_name.get(st.device)
        if dev is None:  # load_manifest checks this, a manifest built in code (Pipeline.from_manifest) not
            raise UsageError(f"stage {st.index} runs on {st.device!r}, which is not a device of the manifest")
        result.append(placement_of(dev, threads))
    return result


def check_providers_here(specs: Sequence[WorkerSpec], available: Sequence[str]) -> None:
    """Refuse, naming the stage, its device and the provider, a stage whose provider this machine lacks
    (or, for another runtime, whose runtime's package is not installed: the extra to install)."""
    for spec in specs:
        kind = spec.placement.kind
        if not kind.takes_provider:
            if not runtime_available(spec.placement.runtime):
                raise UsageError(
                    f"{spec.label} runs on device {spec.device!r} with runtime {kind.name}, which is not "
                    f"installed here; {install_hint(kind.extra or kind.name)}, or give a devices file "
                    f"({opt('RunOptions.devices', 'FILE')}) that names another runtime for it"
                )
            if not runs_here(spec.placement):
                raise UsageError(
                    f"{spec.label} runs on device {spec.device!r}, {spec.placement.label}, which this "
                    f"machine does not have; give a devices file ({opt('RunOptions.devices', 'FILE')}) that "
                    "names a device it has"
                )
            continue
        provider = spec.placement.provider
        if provider not in available:
            raise UsageError(
                f"{spec.label} runs on device {spec.device!r}, whose provider {provider} (from the split's "
                f"manifest) is not available here (this onnxruntime has {', '.join(available)}); install "
                "the onnxruntime package that has it, or give a devices file "
                f"({opt('RunOptions.devices', 'FILE')}) "
                "that names an available provider for each device"
            )


def generation_specs(
    directory: Path, manifest: Manifest, placements: Sequence[Placement], contract: IOContract
) -> list[WorkerSpec]:
    """One spec per stage of a decoder's split, for generation: each stage feeds its past inputs from
    its worker's cache and keeps its presents there (they travel nowhere); the caller sends the token,
    mask and position inputs and :data:`~onnxpipe.runtime.kvstate.CONTROL`, and gets the logits back
    (``contract``: which inputs are the cache, which output the logits)."""
    past_to_present = contract.past_to_present()
    declared = {t.name: t for t in manifest.model_inputs}
    caches: dict[int, tuple[CacheSlot, ...]] = {}
    for st in manifest.stages:
        owned = {t for r in contract.kv if r.layer in st.kv_layers for t in r.pasts}
        caches[st.index] = tuple(
            cache_slot(
                declared[t.name], past_to_present[t.name] if t.name in owned else None, manifest.source.file
            )
            for t in st.inputs
            if t.name in past_to_present
        )
    inputs = list(generation_inputs(manifest, contract))
    return stage_specs(directory, manifest, placements, inputs, [str(contract.logits), CONTROL], caches)


def generation_inputs(manifest: Manifest, contract: IOContract) -> dict[str, str]:
    """What a generating pipeline takes (name: dtype): the model inputs but the cache, and the control
    tensor."""
    pasts = set(contract.past_to_present())
    types = {t.name: t.dtype for t in manifest.model_inputs if t.name not in pasts}
    types[CONTROL] = "int64"
    return types


def cache_slot(tensor: ModelTensor, present: str | None, source: str) -> CacheSlot:
    """The :class:`CacheSlot` of the past input ``tensor``: its batch (axis 0) and cached tokens (the
    axis before the last) stay open; any other symbolic dim (a head size GenAI's builder names
    ``kv_cache_dim``) is fixed for the model, and taken from the shape it was profiled at."""
    if tensor.shape is None:
        raise UsageError(f"{source}: past input {tensor.name!r} has no recorded shape; re-run onnxpipe split")
    rank = len(tensor.shape)
    dims: list[int | None] = []
    for axis, d in enumerate(tensor.shape):
        if isinstance(d, int):
            dims.append(d)
        elif axis in (0, rank - 2):
            dims.append(None)
        elif tensor.profiled_shape is not None and len(tensor.profiled_shape) == rank:
            dims.append(tensor.profiled_shape[axis])
        else:
            raise UsageError(
                f"{source}: past input {tensor.name!r} has shape {list(tensor.shape)}: dim {axis} is "
                "unknown besides the batch and the cached tokens, so its empty cache cannot be made; "
                "re-run onnxpipe split"
            )
    return CacheSlot(tensor.name, present, tensor.dtype, tuple(dims))


def stage_specs(
    directory: Path,
    manifest: Manifest,
    placements: Sequence[Placement],
    model_inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    caches: Mapping[int, tuple[CacheSlot, ...]] | None = None,
) -> list[WorkerSpec]:
    """One spec per stage of ``manifest``: the first worker receives ``model_inputs`` (default: the model
    inputs), each forwards what later stages and ``outputs`` (default: the model outputs) need; a stage's
    ``caches`` are fed by its worker, never received."""
    model_inputs = [t.name for t in manifest.model_inputs] if model_inputs is None else model_inputs
    outputs = [o.name for o in manifest.model_outputs] if outputs is None else outputs
    caches = caches or {}
    generating = CONTROL in model_inputs
    local = {s.past for slots in caches.values() for s in slots}
    # tensors still needed after stage i: read by a later stage or a model output
    later: set[str] = set(outputs)
    needed_after: list[set[str]] = []
    for st in reversed(manifest.stages):
        needed_after.append(set(later))
        later |= {t.name for t in st.inputs if t.name not in local}
        if generating:
            later.add(CONTROL)
    needed_after.reverse()
    available: list[str] = [n for n in model_inputs if n in later]  # later: what any stage or output reads
    specs: list[WorkerSpec] = []
    for st, place, after in zip(manifest.stages, placements, needed_after, strict=True):
        receives = tuple(available)
        produced = [t.name for t in st.outputs]
        sends = tuple(n for n in dict.fromkeys([*receives, *produced]) if n in after)
        specs.append(
            WorkerSpec(
                index=st.index,
                label=f"stage {st.index} ({st.file})",
                path=str(directory / st.file),
                receives=receives,
                inputs=tuple(t.name for t in st.inputs),
                outputs=tuple(produced),
                sends=sends,
                placement=place,
                stage=st,
                caches=caches.get(st.index, ()),
                generating=generating,
            )
        )
        available = list(sends)
    missing = [o for o in outputs if o not in available]
    if missing:  # a manifest built in code, or a contract whose logits no stage of the split makes
        raise UsageError(f"model output {missing[0]!r} is produced by no stage of the manifest")
    return specs


def model_spec(
    path: Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    placement: Placement,
    *,
    index: int = 0,
) -> WorkerSpec:
    """A one-worker chain running the whole model at ``path`` (a replica of the original model)."""
    session_outputs = tuple(o for o in outputs if o not in inputs)
    return WorkerSpec(
        index=index,
        label=f"replica {index} ({path.name})",
        path=str(path),
        receives=tuple(inputs),
        inputs=tuple(inputs),
        outputs=session_outputs,
        sends=tuple(outputs),
        placement=placement,
    )


def model_generation_spec(
    path: Path, manifest: Manifest, placement: Placement, contract: IOContract, *, index: int = 0
) -> WorkerSpec:
    """A one-worker chain generating with the whole source model at ``path`` (a replica), keeping its
    whole KV cache: the baseline a split's generation is compared with."""
    past_to_present = contract.past_to_present()
    inputs = [t.name for t in manifest.model_inputs]
    whole = model_spec(path, inputs, [o.name for o in manifest.model_outputs], placement, index=index)
    return replace(
        whole,
        receives=(*(n for n in inputs if n not in past_to_present), CONTROL),
        sends=(str(contract.logits), CONTROL),
        caches=tuple(
            cache_slot(t, past_to_present[t.name], manifest.source.file)
            for t in manifest.model_inputs
            if t.name in past_to_present
        ),
        generating=True,
    )


def padding_side(paths: Sequence[str | Path]) -> PadSide:
    """Where the caches of sequences sharing a step are padded, for the model files ``paths``: at the end
    for onnxruntime's ``GroupQueryAttention`` (which reads each sequence's length off the mask), else at
    the start (:class:`~onnxpipe.runtime.kvstate.PadSide`)."""
    import onnx

    for path in paths:
        model = onnx.load(str(path), load_external_data=False)
        if any(n.op_type == "GroupQueryAttention" for n in model.graph.node):
            return PadSide.RIGHT
    return PadSide.LEFT
