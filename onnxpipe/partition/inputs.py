"""From a caller's request to a validated :class:`_Model`: every input check, and the lower bounds.

All refusals of bad input happen here, before any solving, with messages that name the argument, the
entry and what it should be.  :class:`HeterogeneousRequest` carries the heterogeneous entry points'
arguments as one value, so the solver, the scorer and the reference DP share one list of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

import numpy as np

from onnxpipe.core.choices import Objective
from onnxpipe.core.errors import PartitionError
from onnxpipe.partition.costmodel import _Model, _Work
from onnxpipe.partition.numeric import BoolArr, FloatArr, _prefix


@dataclass(frozen=True)
class HeterogeneousRequest:
    """Everything :func:`~onnxpipe.partition.solve_heterogeneous` is told except ``k``, as given.

    One value for the solver, the scorer, the reference DP, the model builder and the planner that fills
    it in (:mod:`onnxpipe.planning.cluster`), so that the fourteen arguments are spelled once.  Fields hold
    the caller's values unchecked: :func:`_heterogeneous_model` validates them for a given ``k``, so building
    a request never raises.
    ``k`` is not a field because the solver is told it while the scorer reads it from the bounds.
    """

    costs: Sequence[float] | None = None
    """Item ``i``'s compute time on a speed-1 device; ``None`` when :attr:`device_costs` is given."""
    _: KW_ONLY
    speeds: Sequence[float] | None = None
    """Speed of each stage's device (``k`` entries, > 0; default all 1): stage ``s`` computes in
    ``sum(costs[a:b]) / speeds[s]``.  Excludes :attr:`device_costs`."""
    cut_bytes: Sequence[float] | None = None
    """Bytes a stage starting at position ``p`` receives, one per position ``0..n`` (entry 0 never paid);
    default: nothing crosses a cut."""
    bandwidths: Sequence[float] | None = None
    """Bytes per second of the link into each stage (``k`` entries with entry 0 ignored, or ``k - 1``);
    default ``inf``, a free link."""
    latencies: Sequence[float] | None = None
    """Seconds added to every transfer into a stage (shaped like :attr:`bandwidths`); default 0."""
    overlap: bool = True
    """Transfers run concurrently with compute, so a stage costs ``max(compute, transfer)`` (else the sum)."""
    item_mem: Sequence[float] | None = None
    """Bytes each item keeps on its stage (parameters, optimizer state); goes with :attr:`mem_caps`."""
    mem_caps: Sequence[float] | None = None
    """Memory of each stage's device (``k`` entries, ``inf`` = unlimited); goes with :attr:`item_mem`."""
    cut_mem_factor: Sequence[float] | None = None
    """Per stage, how many copies of its received ``cut_bytes`` it holds (``k`` or ``k - 1`` entries,
    default 0); needs the memory fields."""
    allowed_cuts: Sequence[bool] | None = None
    """One flag per position ``0..n``: ``False`` forbids a stage boundary there (inside a fused group)."""
    device_costs: Sequence[Sequence[float]] | None = None
    """``k x n``: ``device_costs[s][i]`` is item ``i``'s time on stage ``s``'s device; replaces
    :attr:`costs` and :attr:`speeds`."""
    item_act: Sequence[float] | None = None
    """Activation bytes of each item, kept once per micro-batch in flight; goes with :attr:`act_factor`
    and needs the memory fields."""
    act_factor: Sequence[float] | None = None
    """Per stage (``k`` entries, stage 0 included), how many micro-batches' activations it holds (1F1B:
    ``min(M, k - s)``; GPipe: ``M``)."""
    objective: Objective = Objective.THROUGHPUT
    """What the solver minimises: the bottleneck, or (``latency``) the sum of every stage's compute and
    transfer (:func:`onnxpipe.partition.engine.latency_bounds`); either way the result reports the
    bottleneck too."""


def _vector(
    name: str,
    values: Sequence[float] | None,
    length: int,
    default: float,
    *,
    positive: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> FloatArr:
    """``values`` as a float array of ``length`` (``default`` everywhere when ``None``), refused with the
    first bad entry named: a NaN or negative entry would silently break the monotonicity of every cost."""
    if values is None:
        return np.full(length, default, dtype=np.float64)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PartitionError(f"{name} must be a sequence of numbers ({exc})") from None
    if arr.ndim != 1 or arr.size != length:
        got = arr.size if arr.ndim == 1 else f"shape {arr.shape}"
        raise PartitionError(f"{name} has {got} entries but needs {length}{hint}")
    bad = np.isnan(arr) | (arr < 0) | (~allow_inf & np.isinf(arr)) | (positive & (arr == 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        need = "> 0" if positive else ">= 0"
        need += "" if allow_inf else " and finite"
        raise PartitionError(f"{name}[{i}] = {float(arr[i])!r} is invalid: every entry must be {need}")
    return arr


def _per_stage(
    name: str,
    values: Sequence[float] | None,
    k: int,
    default: float,
    *,
    positive: bool = False,
    allow_inf: bool = False,
) -> FloatArr:
    """Per-link values: accept K entries (entry 0, the link into stage 0, is ignored) or K-1 entries."""
    if values is not None and k > 1 and len(values) == k - 1:
        values = [default, *values]
    hint = f" (one per stage, entry 0 ignored; or {k - 1}, one per link)"
    return _vector(name, values, k, default, positive=positive, allow_inf=allow_inf, hint=hint)


def _check_k(k: int, n: int) -> None:
    """Refuse a stage count no split can meet (every stage holds at least one item)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise PartitionError(f"k must be an integer number of stages, got {k!r}")
    if k < 1:
        raise PartitionError(f"k = {k} stages is impossible: ask for at least 1 stage")
    if n == 0:
        raise PartitionError("costs is empty: there are no items to split into stages")
    if k > n:
        raise PartitionError(f"cannot split {n} items into {k} non-empty stages: use k <= {n}")


def _allowed(allowed_cuts: Sequence[bool] | None, n: int, k: int) -> BoolArr:
    """Flags per position (the ends always allowed), refused when too few inner cuts remain for ``k``."""
    if allowed_cuts is None:
        allowed = np.ones(n + 1, dtype=bool)
    else:
        allowed = np.array(allowed_cuts, dtype=bool)
        if allowed.ndim != 1 or allowed.size != n + 1:
            raise PartitionError(
                f"allowed_cuts has {allowed.size} entries but needs n+1 = {n + 1} (one per position 0..n)"
            )
    allowed[0] = allowed[n] = True
    inner = int(allowed[1:n].sum())
    if inner < k - 1:
        raise PartitionError(
            f"allowed_cuts permits only {inner} cut positions but {k} stages need {k - 1}: "
            f"use k <= {inner + 1} or allow more cuts"
        )
    return allowed


def _costs(costs: Sequence[float]) -> FloatArr:
    """The item costs, whose length fixes ``n`` for every other per-item argument."""
    try:
        n = len(costs)
    except TypeError:
        raise PartitionError(f"costs must be a sequence of numbers, got {type(costs).__name__}") from None
    return _vector("costs", costs, n, 0.0)


def _homogeneous_model(
    costs: Sequence[float],
    k: int,
    cut_bytes: Sequence[float] | None,
    bandwidth: float,
    allowed_cuts: Sequence[bool] | None,
) -> tuple[_Model, float]:
    """Validate :func:`~onnxpipe.partition.solve`'s arguments: the heterogeneous request of one cost row
    at speed 1 and one link into every stage, its transfers not overlapping compute."""
    _check_k(k, _costs(costs).size)  # before the bandwidth, as every solver checks them
    try:
        bw = float(bandwidth)
    except (TypeError, ValueError):
        bw = math.nan
    if not bw > 0:  # also rejects NaN
        raise PartitionError(
            f"bandwidth = {bandwidth!r} is invalid: bandwidth must be a positive number of bytes per second "
            "(inf = free)"
        )
    request = HeterogeneousRequest(
        costs, cut_bytes=cut_bytes, bandwidths=[bw] * k, overlap=False, allowed_cuts=allowed_cuts
    )
    return _heterogeneous_model(request, k)


def _device_costs(device_costs: Sequence[Sequence[float]], k: int) -> FloatArr:
    """The ``k x n`` matrix of per-device item costs, validated (``k`` itself checked by the caller)."""
    try:
        arr = np.asarray(device_costs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PartitionError(
            f"device_costs must be one row of numbers per stage, all of the same length ({exc})"
        ) from None
    if arr.ndim != 2:
        raise PartitionError(
            f"device_costs has shape {arr.shape} but needs (k, n): one row per stage, one entry per item"
        )
    _check_k(k, arr.shape[1])
    if arr.shape[0] != k:
        raise PartitionError(f"device_costs has {arr.shape[0]} rows but needs {k} (one per stage)")
    bad = np.isnan(arr) | (arr < 0) | np.isinf(arr)
    if bad.any():
        s, i = (int(x) for x in np.argwhere(bad)[0])
        raise PartitionError(
            f"device_costs[{s}][{i}] = {float(arr[s, i])!r} is invalid: every entry must be >= 0 and finite"
        )
    return arr


def _memory_work(
    n: int,
    k: int,
    item_mem: Sequence[float],
    item_act: Sequence[float] | None,
    act_factor: Sequence[float] | None,
) -> _Work:
    """Per-stage item memory: ``item_mem[i] + act_factor[s] * item_act[i]`` (just ``item_mem`` without
    activations), one correctly rounded prefix array per distinct factor."""
    mem = _vector("item_mem", item_mem, n, 0.0, hint=" (one per item)")
    if item_act is None:
        return _Work.single(mem, _prefix("item_mem", mem), k)
    act = _vector("item_act", item_act, n, 0.0, hint=" (one per item)")
    fac = _vector("act_factor", act_factor, k, 0.0, hint=" (one per stage)")
    rows: dict[float, FloatArr] = {}
    for f in fac.tolist():
        if f not in rows:
            rows[f] = mem + f * act
    return _Work.table("item_mem + act_factor[{s}] * item_act", [rows[f] for f in fac.tolist()])


def _check_transfers(cut: FloatArr, bandwidth: float, latency: float = 0.0) -> None:
    """Refuse a link so slow that moving the largest cut takes longer than the largest float: every
    split would then cost ``inf`` and none could be told from another."""
    inner = float(cut[1:-1].max(initial=0.0))
    with np.errstate(over="ignore"):
        worst = inner / bandwidth + latency if inner > 0 else latency
    if not math.isfinite(worst):
        raise PartitionError(
            f"bandwidth {bandwidth!r} bytes/s: moving {inner:.0f} bytes across a cut would take longer than "
            "any float can count; give a bandwidth in bytes per second (e.g. 1e9 for 1 GB/s)"
        )


def _heterogeneous_model(request: HeterogeneousRequest, k: int) -> tuple[_Model, float]:
    """Validate ``request`` for ``k`` stages: the model, and a bound no split of it can beat."""
    work, n, speed, largest_item = _compute_work(request, k)
    bw = _per_stage("bandwidths", request.bandwidths, k, math.inf, positive=True, allow_inf=True)
    lat = _per_stage("latencies", request.latencies, k, 0.0)
    cut = _vector("cut_bytes", request.cut_bytes, n + 1, 0.0, hint=" (n+1: one per cut position 0..n)")
    _check_transfers(cut, float(bw[1:].min(initial=math.inf)), float(lat.max(initial=0.0)))
    mem, mem_cap, mem_fac = _memory_terms(request, n, k)
    model = _Model(
        n=n,
        k=k,
        work=work,
        cut=cut,
        speed=speed,
        tr_mul=np.ones(k),
        tr_div=bw,
        tr_add=lat,
        overlap=bool(request.overlap),
        allowed=_allowed(request.allowed_cuts, n, k),
        mem=mem,
        mem_cap=mem_cap,
        mem_fac=mem_fac,
    )
    # the work bound: total work over total speed, or its generalisation (see _Model.relaxation)
    if request.device_costs is not None:
        spread = model.spread_bound()
    else:
        spread = float(model.prefix(0)[n]) / float(speed.sum())
    lower = max(spread, largest_item)
    if k > 1:
        lower = max(lower, float(lat[1:].max()))  # every later stage pays its link's latency
    return model, lower


def _compute_work(request: HeterogeneousRequest, k: int) -> tuple[_Work, int, FloatArr, float]:
    """The compute side of ``request``: ``(work, n, speeds, largest item on its fastest device)``."""
    costs, speeds, device_costs = request.costs, request.speeds, request.device_costs
    if device_costs is not None:
        if costs is not None:
            raise PartitionError(
                "give costs (with speeds) or device_costs, not both: with device_costs each stage's compute "
                "is the sum of its device's row, so pass costs=None"
            )
        if speeds is not None:
            raise PartitionError(
                "speeds and device_costs exclude each other: device_costs rows are already per-device times"
            )
        d = _device_costs(device_costs, k)
        work = _Work.table("device_costs[{s}]", list(d))
        # every item runs somewhere, at best on its fastest device
        return work, d.shape[1], np.ones(k), float(d.min(axis=0).max())
    if costs is None:
        raise PartitionError("costs is missing: give costs (with speeds), or device_costs")
    c = _costs(costs)
    n = c.size
    _check_k(k, n)
    sp = _vector("speeds", speeds, k, 1.0, positive=True, hint=" (one per stage)")
    return _Work.single(c, _prefix("costs", c), k), n, sp, float(c.max()) / float(sp.max())


def _memory_terms(
    request: HeterogeneousRequest, n: int, k: int
) -> tuple[_Work | None, FloatArr | None, FloatArr | None]:
    """The memory side of ``request``: ``(per-item memory, caps, cut factors)``, all ``None`` without
    caps.  The fields only make sense together, so a partial set is refused rather than ignored."""
    item_mem, mem_caps, cut_mem_factor = request.item_mem, request.mem_caps, request.cut_mem_factor
    item_act, act_factor = request.item_act, request.act_factor
    if (item_mem is None) != (mem_caps is None):
        raise PartitionError("item_mem and mem_caps go together: give both to enforce memory, or neither")
    if cut_mem_factor is not None and mem_caps is None:
        raise PartitionError("cut_mem_factor needs item_mem and mem_caps: give them too, or drop it")
    if (item_act is None) != (act_factor is None):
        raise PartitionError(
            "item_act and act_factor go together: activation bytes per item, and per stage how many "
            "copies of them it holds; give both, or neither"
        )
    if item_act is not None and mem_caps is None:
        raise PartitionError(
            "item_act and act_factor need item_mem and mem_caps: give them too, or drop them"
        )
    if item_mem is None:
        return None, None, None
    mem = _memory_work(n, k, item_mem, item_act, act_factor)
    mem_cap = _vector("mem_caps", mem_caps, k, math.inf, allow_inf=True, hint=" (one per stage)")
    return mem, mem_cap, _per_stage("cut_mem_factor", cut_mem_factor, k, 0.0)


def _check_bounds(bounds: Sequence[int], n: int) -> list[int]:
    """A given split as plain ints, refused unless it is ``0 < ... < n`` (every stage non-empty)."""
    try:
        b = [int(x) for x in bounds]
    except (TypeError, ValueError):
        raise PartitionError(f"bounds must be integers, got {bounds!r}") from None
    if len(b) < 2 or b[0] != 0 or b[-1] != n or any(x >= y for x, y in itertools.pairwise(b)):
        raise PartitionError(f"bounds {tuple(b)} are not 0 < ... < n = {n} (strictly increasing, non-empty)")
    return b


def _item_count(request: HeterogeneousRequest) -> int:
    """How many items ``request`` describes, read before anything is validated so that a scored split's
    bounds are checked first."""
    costs, device_costs = request.costs, request.device_costs
    if device_costs is not None and costs is None:
        try:
            return len(device_costs[0]) if len(device_costs) else 0
        except (TypeError, IndexError, KeyError):
            _device_costs(device_costs, 1)  # malformed: raises, saying what is wrong
            raise AssertionError("unreachable") from None
    return len(costs) if costs is not None else 0


def _check_split(model: _Model, b: list[int]) -> None:
    """Refuse a split the solver could not return (a forbidden cut, a stage over its memory cap): scoring
    it would compare the solver with a baseline that breaks the rules."""
    for cut in b[1:-1]:
        if not model.allowed[cut]:
            raise PartitionError(f"bounds {tuple(b)} cut at {cut}, which allowed_cuts forbids")
    if model.mem_cap is not None:
        for s in range(model.k):
            held = float(model.memory(s, np.array([b[s]], dtype=np.intp), b[s + 1])[0])
            if not held <= model.mem_cap[s]:
                raise PartitionError(
                    f"bounds {tuple(b)}: stage {s} needs {held:.17g} bytes but mem_caps[{s}] is "
                    f"{float(model.mem_cap[s]):.17g}"
                )
