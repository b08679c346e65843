"""A tied token embedding and LM head: the memory of 2 stages on 2 workers against 3 stages on 2 workers.

Where one table is the embedding (a ``Gather`` of its rows) and the LM head (a ``Gemm`` reading it
transposed, ``transB``, as ``MatMulNBits`` reads a builder's int4 blocks; or a ``Transpose`` and a
``MatMul``, as ``tools/export_decoders.py`` ties ``llama_tied``), 2 stages on 2 workers hold it on both
workers and ``--stages 3 --workers 2`` on worker 0 alone
(:func:`onnxpipe.planning.planner.keeping_tied`).  For a model made here (random weights, ``--vocab``
x ``--hidden`` float32 table, 4 residual ``MatMul`` layers), per form of the head:

* ``plain`` and ``tied``: the plan's weights over the workers (each tensor once per worker, as the
  manifest counts them), the stage files' bytes, and each worker's model memory measured by running the
  split in worker processes (``onnxpipe run --local-mode processes``: a process's peak less its memory
  before loading, a worker's stages hosted by one process);
* ``one_process``: worker 0's two stages (0 and 2 of the tied split) opened in one fresh process, each
  session reading its own stage file (``files``, what the runtime does), or both given one copy of the
  table through onnxruntime's ``SessionOptions.add_initializer`` (``shared``: the table read into memory;
  ``shared_mapped``: the table a ``numpy.memmap`` of stage 0's weights file): memory after loading and
  its peak, and whether the outputs agree.

Results: ``benchmarks/results/tied.json``::

    python -m benchmarks tied [--vocab 32000] [--hidden 512] [--microbatches 8] [--out DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.common import (
    MEMORY_PRELUDE,
    benchmark_parser,
    params_of,
    print_table,
    run_child,
    shown,
    write_result,
)
from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.choices import CostSource, LocalMode
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.options import RunOptions

LAYERS = 4
FORMS = ("gemm", "transpose")


def tied_model(path: Path, vocab: int, hidden: int, form: str) -> Path:
    """ids -> ``Gather(table)`` -> :data:`LAYERS` residual ``MatMul``/``Relu`` layers -> the LM head on the
    same table: ``Gemm(x, table, transB=1)`` or ``MatMul(x, Transpose(table))``; weights external."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((vocab, hidden)) * 0.02).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["x0"], name="embed")]
    for i in range(LAYERS):
        w = (rng.standard_normal((hidden, hidden)) * 0.02).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
            helper.make_node("Add", [f"x{i}", f"r{i}"], [f"x{i + 1}"], name=f"add{i}"),
        ]
    last = f"x{LAYERS}"
    if form == "gemm":
        nodes.append(helper.make_node("Gemm", [last, "table"], ["logits"], name="lm_head", transB=1))
    else:
        nodes += [
            helper.make_node("Transpose", ["table"], ["table_t"], name="lm_head_tied", perm=[1, 0]),
            helper.make_node("MatMul", [last, "table_t"], ["logits"], name="lm_head"),
        ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, vocab])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data", size_threshold=1024)
    return path


def layout(model: Path, out: Path, stages: int, microbatches: int) -> dict[str, Any]:
    """Split ``model`` into ``stages`` stages on 2 workers and run it in worker processes: the plan's
    weights over the workers, the files' bytes and each worker's measured model memory."""
    options = SplitOptions(
        out=out,
        plan=PlanRequest(stages, workers=2),
        profile=ProfileOptions(cost=CostSource.STATIC),
        verify=False,
    )
    api.split(model, options)
    m = load_manifest(out)
    held = m.plan.worker_param_bytes or tuple(s.param_bytes for s in m.stages)
    report = api.run(out, RunOptions(local_mode=LocalMode.PROCESSES, microbatches=microbatches))
    rss = [  # a process per worker: a stage alone, or the first of those its process hosts
        s.worker_model_rss_bytes or 0 for s in report.stages if s.index == min(s.hosted_with or (s.index,))
    ]
    files = sum(p.stat().st_size for p in out.glob("stage_*.onnx*"))
    return {
        "stages": stages,
        "workers_of_stages": [m.worker_of(s) for s in range(m.k)],
        "plan_weight_bytes_per_worker": list(held),
        "plan_weight_bytes": sum(held),
        "file_bytes": files,
        "model_rss_bytes_per_worker": rss,
        "model_rss_bytes": sum(rss),
    }


ONE_PROCESS = (
    MEMORY_PRELUDE
    + """
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor
folder, mode = sys.argv[1], sys.argv[2]
base = status("VmRSS")
paths = [f"{folder}/stage_0.onnx", f"{folder}/stage_2.onnx"]
table = next(t for t in onnx.load(paths[0], load_external_data=False).graph.initializer if t.name == "table")
info = {e.key: e.value for e in table.external_data}
if mode == "shared":
    load_external_data_for_tensor(table, folder)
    array = numpy_helper.to_array(table)
elif mode.startswith("shared_mapped"):
    dtype = helper.tensor_dtype_to_np_dtype(table.data_type)
    array = np.memmap(f"{folder}/{info['location']}", dtype=dtype, mode="r",
                      offset=int(info.get("offset", 0)), shape=tuple(table.dims))
value = ort.OrtValue.ortvalue_from_numpy(array) if mode != "files" else None
sessions = []
for p in paths:
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    if mode == "shared_mapped_unpacked":  # the head's kernel then reads the shared table as it is
        o.add_session_config_entry("session.disable_prepacking", "1")
    if value is not None:
        o.add_initializer("table", value)
    sessions.append(ort.InferenceSession(p, o, providers=["CPUExecutionProvider"]))
loaded = status("VmRSS") - base
s0, s2 = sessions
rows = s0.get_inputs()[0].shape[0]
for k in range(int(sys.argv[3])):  # tokens of a generation: the embedding reads their rows
    ids = np.random.default_rng(k).integers(0, int(sys.argv[4]), rows, dtype=np.int64)
    s2.run(None, {i.name: h for i, h in zip(s2.get_inputs(), s0.run(None, {"ids": ids}))})
hidden = s0.run(None, {"ids": np.arange(rows, dtype=np.int64)})
logits = s2.run(None, {i.name: h for i, h in zip(s2.get_inputs(), hidden)})[0]
print(json.dumps({"loaded_bytes": loaded, "ran_bytes": status("VmRSS") - base,
                  "peak_bytes": status("VmHWM") - base,
                  "logits_sum": float(logits.astype(np.float64).sum())}))
"""
)
"""A child process: worker 0's two sessions, the table given to both once or read from each file."""


def one_process(folder: Path, runs: int, vocab: int) -> list[dict[str, Any]]:
    """Worker 0's stages opened in one fresh process, each from its file or given one table, then run
    on ``runs`` micro-batches of random token ids."""
    rows = []
    for mode in ("files", "shared", "shared_mapped", "shared_mapped_unpacked"):
        done = run_child(ONE_PROCESS, str(folder), mode, str(runs), str(vocab))
        if done.returncode != 0:
            raise RuntimeError(f"the {mode} child failed: {done.stderr.strip().splitlines()[-1:]}")
        rows.append({"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--microbatches", type=int, default=64)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for form in FORMS:
            model = tied_model(Path(tmp) / f"{form}.onnx", args.vocab, args.hidden, form)
            for name, stages in (("plain", 2), ("tied", 3)):
                out = Path(tmp) / f"{form}_{name}"
                rows.append({"form": form, "case": name, **layout(model, out, stages, args.microbatches)})
            for r in one_process(Path(tmp) / f"{form}_tied", args.microbatches, args.vocab):
                rows.append({"form": form, "case": f"one_process_{r.pop('mode')}", **r})
    mib = 2**20
    print_table(
        "tied table: memory per layout (MiB)",
        ["form", "case", "plan weights", "files", "model RSS (per worker) / loaded, ran, peak"],
        [
            [
                r["form"],
                r["case"],
                f"{r['plan_weight_bytes'] / mib:.1f}" if "plan_weight_bytes" in r else "",
                f"{r['file_bytes'] / mib:.1f}" if "file_bytes" in r else "",
                (
                    f"{r['model_rss_bytes'] / mib:.1f} ("
                    + ", ".join(f"{b / mib:.1f}" for b in r["model_rss_bytes_per_worker"])
                    + ")"
                    if "model_rss_bytes" in r
                    else ", ".join(f"{r[k] / mib:.1f}" for k in ("loaded_bytes", "ran_bytes", "peak_bytes"))
                ),
            ]
            for r in rows
        ],
    )
    path = write_result("tied", params_of(args, layers=LAYERS), rows, out=args.out)
    print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
