"""Tensors of the optimized graph matched to the original ones for :mod:`onnxpipe.cost.measure`: both graphs
run with every tensor exposed, NCHWc blocked values read back as NCHW, degenerate constants jittered."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from onnxpipe.core.errors import ProfileError
from onnxpipe.cost.anchors import AnchorFinder, find_duplicates, topological, value_candidates
from onnxpipe.cost.sketch import Print, Sketcher, near_norm
from onnxpipe.cost.static import constant_tensors
from onnxpipe.cost.trace import Exposed, OrtModel, Timing, run_exposed
from onnxpipe.ir.external import tensor_values
from onnxpipe.ir.model import ModelView, itemsize
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.ir.static import concrete_shapes

_NCHWC_DOMAIN = "com.microsoft.nchwc"
_NCHWC_BLOCKS = (16, 8, 4)


@dataclass
class Matched:
    optimized: onnx.ModelProto
    anchors: dict[str, str]
    """Optimized tensor -> original tensor holding the same value."""
    duplicates: set[str]
    """Original tensors the optimizer computes once for another (common subexpressions)."""
    constant: set[str]
    """Original tensors that are constants (never joined across)."""
    shapes: dict[str, tuple[int, ...]]
    """Original tensor shapes at the profiled input shapes."""
    tensor_bytes: dict[str, int]
    notes: list[str]


def match_graphs(
    view: ModelView,
    ort_model: OrtModel,
    timing: Timing,
    feeds: Mapping[str, np.ndarray],
    input_shapes: Mapping[str, tuple[int, ...]],
    chunk_bytes: int,
) -> Matched:
    """Anchors between the original graph and the optimized one that was timed, and tensor sizes; values
    are exposed about ``chunk_bytes`` at a time."""
    notes: list[str] = []
    original, optimized, rename = _value_graphs(view, ort_model, timing.optimized, notes)
    constant = constant_tensors(view)
    sketcher = Sketcher()
    shapes: dict[str, tuple[int, ...]] = {}
    nbytes: dict[str, int] = {}
    o_prints: dict[str, Print] = {}

    def take_original(name: str, arr: np.ndarray) -> None:
        shapes[name] = tuple(int(d) for d in arr.shape)
        nbytes[name] = int(arr.nbytes) if arr.dtype.kind != "O" else 8 * int(arr.size)
        p = sketcher.sketch(arr)
        if p is not None:
            o_prints[name] = p

    for name, arr in feeds.items():  # the inputs first, as the run's values
        take_original(name, np.asarray(arr))

    o_names = [t for n in view.nodes if not n.is_constant for t in n.outputs if t not in constant]
    symbols = symbol_sizes(view, input_shapes)
    estimates = {t: view.tensor(t).nbytes(symbols) for t in o_names}
    p_prints: dict[str, list[Print]] = {}
    by_size: dict[int, list[tuple[float, str]]] = {}
    try:
        exposed = Exposed(original, o_names, estimates, view.base_dir, "the model")
        run_exposed(ort_model, exposed, feeds, take_original, chunk_bytes=chunk_bytes)
    except ProfileError as e:
        notes.append(f"values could not be compared ({e}); regions come from tensor names only")
        for t, shape in concrete_shapes(view, input_shapes).items():
            shapes.setdefault(t, shape)
    else:
        for name, p in o_prints.items():
            by_size.setdefault(p.size, []).append((p.norm, name))
        for lst in by_size.values():
            lst.sort()
        try:
            p_prints = _optimized_prints(
                ort_model, optimized, timing, feeds, o_prints, by_size, sketcher, chunk_bytes
            )
        except ProfileError as e:
            notes.append(
                f"values of the optimized graph could not be compared ({e}); regions come from names only"
            )

    anchors = AnchorFinder(view, optimized, o_prints, p_prints, by_size, constant).find()
    duplicates = find_duplicates(view, anchors, o_prints, p_prints, constant)
    if rename:
        # back to the tensor names of the graph that was timed
        anchors = {rename.get(p, p): o for p, o in anchors.items()}
    _add_unmeasured(view, symbols, shapes, nbytes)
    return Matched(
        optimized=timing.optimized,
        anchors=anchors,
        duplicates=duplicates,
        constant=constant,
        shapes=shapes,
        tensor_bytes=nbytes,
        notes=notes,
    )


def _value_graphs(
    view: ModelView, ort_model: OrtModel, optimized: onnx.ModelProto, notes: list[str]
) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, str]]:
    """The original and optimized graphs to compare values on, and the map from the latter's tensor
    names to the timed graph's: a jittered copy when the model's constants are degenerate and the copy
    optimizes the same way, else the model itself."""
    jittered = _jittered_copy(view)
    if jittered is None:
        return view.proto, optimized, {}
    other = ort_model.save_optimized(jittered.SerializeToString(), "jittered", "a jittered copy of the model")
    rename = _same_structure(optimized, other)
    if rename is not None:
        return jittered, other, rename
    notes.append(
        "the model's float constants are degenerate (all elements equal) and onnxruntime optimizes "
        "a jittered copy differently, so values were matched on the original constants; equal "
        "values were told apart by graph structure"
    )
    return view.proto, optimized, {}


def _optimized_prints(
    ort_model: OrtModel,
    optimized: onnx.ModelProto,
    timing: Timing,
    feeds: Mapping[str, np.ndarray],
    o_prints: Mapping[str, Print],
    by_size: Mapping[int, list[tuple[float, str]]],
    sketcher: Sketcher,
    chunk_bytes: int,
) -> dict[str, list[Print]]:
    """Prints of the optimized graph's tensors (NCHWc ones also read back as NCHW), only where an
    original tensor of the same size and norm exists."""
    blocked = _blocked_tensors(optimized)
    blocks = list(_NCHWC_BLOCKS)
    p_prints: dict[str, list[Print]] = {}

    def wanted(size: int, norm: float) -> bool:
        return bool(near_norm(by_size.get(size, []), norm))

    def matches(p: Print) -> bool:
        return bool(value_candidates([p], o_prints, by_size, set(), set()))

    def take(name: str, arr: np.ndarray) -> None:
        prints = []
        # a name the original graph also has is sketched anyway, to check that the values agree
        p = sketcher.sketch(arr, None if name in o_prints else wanted)
        if p is not None:
            prints.append(p)
        if name in blocked:
            prints.extend(_unblocked_prints(arr, blocks, by_size, wanted, matches, sketcher))
        if prints:
            p_prints[name] = prints

    names = [t for n in optimized.graph.node for t in n.output if t]
    estimates = {t: timing.output_bytes.get(n.name, 0) for n in optimized.graph.node for t in n.output}
    exposed = Exposed(
        optimized, names, estimates, timing.optimized_dir, "the optimized graph", prune_inputs=True
    )
    run_exposed(ort_model, exposed, feeds, take, chunk_bytes=chunk_bytes)
    return p_prints


def _add_unmeasured(
    view: ModelView, symbols: Mapping[str, int], shapes: dict[str, tuple[int, ...]], nbytes: dict[str, int]
) -> None:
    """Shapes and bytes of tensors the value run did not expose (weights, constants), from their types."""
    for t in [t for n in view.nodes for t in n.outputs] + list(view.initializers):
        if t in nbytes:
            continue
        info = view.tensor(t)
        if t not in shapes:
            if info.shape is None:
                continue
            shapes[t] = tuple(d if isinstance(d, int) else symbols.get(str(d), 1) for d in info.shape)
        nbytes[t] = view.initializers.get(t, math.prod(shapes[t]) * max(1, itemsize(info.elem_type)))


def _blocked_tensors(optimized: onnx.ModelProto) -> set[str]:
    """Tensors that may hold NCHWc blocked data: what the NCHWc ops write (but ReorderOutput's result),
    and what ordinary ops (Concat, Add, Relu...) compute from blocked tensors."""
    nodes = list(optimized.graph.node)
    blocked: set[str] = set()
    for idx in topological(
        nodes, {t.name for t in optimized.graph.initializer} | {i.name for i in optimized.graph.input}
    ):
        n = nodes[idx]
        if n.domain == _NCHWC_DOMAIN:
            if n.op_type != "ReorderOutput":
                blocked.update(t for t in n.output if t)
        elif any(i in blocked for i in n.input):
            blocked.update(t for t in n.output if t)
    return blocked


def _unblocked_prints(
    arr: np.ndarray,
    blocks: list[int],
    sizes: Container[int],
    wanted: Callable[[int, float], bool],
    matches: Callable[[Print], bool],
    sketcher: Sketcher,
) -> list[Print]:
    """Prints of ``arr`` read back from NCHWc blocks to NCHW, for each block size and channel count an
    original tensor could have (padding channels sliced off).

    A block size counts only when one of its prints matches an original value: a wrong block size
    only permutes the elements, which keeps the size and norm that ``wanted`` checks, so a print alone
    proves nothing (on an AVX2 machine, whose blocks are 8 wide, reading them as 16 wide once matched no
    tensor of ResNet-50 and fused all of it into one region).  The machine has one block size: the
    first that matches moves to the front of ``blocks``.  No match under any block size: ``[]``."""
    if arr.ndim < 3 or arr.dtype.kind != "f":
        return []
    n, cp, spatial = arr.shape[0], arr.shape[1], arr.shape[2:]
    per_channel = n * math.prod(spatial)
    for b in list(blocks):
        if cp % b:
            continue
        channels = [c for c in range(cp, max(0, cp - b), -1) if c * per_channel in sizes]
        if not channels:
            continue
        blocked = arr.reshape(n, cp // b, *spatial, b)
        nchw = np.moveaxis(blocked, -1, 2).reshape(n, cp, *spatial)
        prints = [p for c in channels if (p := sketcher.sketch(nchw[:, :c], wanted)) is not None]
        if any(matches(p) for p in prints):
            blocks.remove(b)
            blocks.insert(0, b)
            return prints
    return []


def _same_structure(timed: onnx.ModelProto, other: onnx.ModelProto) -> dict[str, str] | None:
    """When ``other`` has the same nodes as ``timed`` (names, ops, wiring), the map from its tensor names
    to ``timed``'s (generated names such as ``reorder_token_N`` are numbered differently); else ``None``."""
    a, b = timed.graph.node, other.graph.node
    if len(a) != len(b):
        return None
    rename: dict[str, str] = {}
    for x, y in zip(a, b, strict=True):
        if (x.name, x.op_type, x.domain, len(x.output)) != (y.name, y.op_type, y.domain, len(y.output)):
            return None
        rename.update(zip(y.output, x.output, strict=True))
    produced = set(rename.values())
    for x, y in zip(a, b, strict=True):
        ins_x = [i for i in x.input if i in produced]
        ins_y = [rename[i] for i in y.input if i in rename]
        if ins_x != ins_y:
            return None
    return rename


def _jittered_copy(view: ModelView) -> onnx.ModelProto | None:
    """A copy whose degenerate float constants (all elements equal, at least 16) are jittered by a
    factor in [0.5, 1.5) per element, or ``None`` when the model has none.  Signs are kept (so variances
    stay positive); all-zero constants stay zero; weights in external files are left alone."""
    rng = np.random.default_rng(20240531)
    proto = view.proto
    graph = proto.graph
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}

    def jitter(arr: np.ndarray) -> np.ndarray | None:
        if arr.size < 16 or arr.dtype.kind != "f":
            return None
        flat = arr.reshape(-1)
        if flat[0] == 0 or not (flat == flat[0]).all():
            return None
        return (arr * rng.uniform(0.5, 1.5, arr.shape)).astype(arr.dtype)

    new_inits: dict[int, onnx.TensorProto] = {}
    for i, t in enumerate(graph.initializer):
        if t.data_type in float_types and t.data_location != onnx.TensorProto.EXTERNAL:
            j = jitter(numpy_helper.to_array(t))
            if j is not None:
                new_inits[i] = numpy_helper.from_array(j, t.name)
    new_nodes: dict[int, onnx.NodeProto] = {}
    init_arrays = {t.name: t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for i, n in enumerate(graph.node):
        value = next(
            (a.t for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None
        )
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in init_arrays:
            dims = numpy_helper.to_array(init_arrays[n.input[0]]).astype(np.int64).tolist()
            fill = tensor_values(value, view.base_dir).reshape(-1)[0] if value is not None else np.float32(0)
            if value is None or value.data_type not in float_types or math.prod(dims) < 16:
                continue
            j = jitter(np.full(dims, fill, dtype=fill.dtype))
        elif n.op_type == "Constant" and value is not None and value.data_type in float_types:
            j = jitter(tensor_values(value, view.base_dir))
        else:
            continue
        if j is not None:
            new_nodes[i] = onnx.helper.make_node(
                "Constant", [], list(n.output), name=n.name, value=numpy_helper.from_array(j)
            )
    if not new_inits and not new_nodes:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for i, t in new_inits.items():
        copy.graph.initializer[i].CopyFrom(t)
    for i, n in new_nodes.items():
        copy.graph.node[i].CopyFrom(n)
    return copy
