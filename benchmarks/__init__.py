"""onnxpipe's benchmarks: one package, one entry point, one result schema.

Run one from the repository root with ``python -m benchmarks NAME [ARGS...]`` (``python -m benchmarks
--list`` lists them; ``python -m benchmarks NAME --help`` gives a benchmark's arguments).  Each writes
one JSON result, ``benchmarks/results/<name>.json`` unless ``--out DIR`` says elsewhere, in the schema
of :func:`benchmarks.common.write_result`: ``schema``, ``name``, ``git_sha`` and ``dirty``, ``machine``,
``params`` (the benchmark's arguments), ``rows`` (one per measured case) and an optional ``summary``.
The latest result of each benchmark is committed; earlier ones are in git history
(``git log -p -- benchmarks/results/<name>.json``).

Deterministic: generated graphs, fixed seeds, sample models and cached profiles; what they compare
(bottlenecks, bytes, memory, one solver's time against another's in the same run) holds on any machine,
busy or not, though their seconds are the machine's.  ``CI_RUNS`` gives each the small inputs on which
``tests/test_benchmarks.py`` runs them in CI (``--out`` a temporary folder, so nothing committed moves):

* ``partition`` — each partitioner's bottleneck against the lower bound, and the exact solver's speed;
* ``partition_speed`` — the exact partitioner's solve time against the O(K n^2) reference DP;
* ``order`` — bytes live across cut points: onnxpipe's chosen topological order against the file's;
* ``export`` — exporting K stages: onnxpipe's one-pass export against ``onnx.utils.extract_model``;
* ``scale`` — time and memory of load, partition and export on graphs of 1k to 100k nodes;
* ``bigmodel`` — peak memory of splitting a model over 2 GB: the graph's, not the weights'.

Machine-bound: their figures are this machine's timings of corpus models (throughput, stage times,
measured profiles); they take minutes, want a quiet machine, and are run by hand:

* ``balance`` — measured stage times of exported splits: onnxpipe's against the baselines';
* ``planner`` — cluster-aware plans against cluster-blind splits on the same devices;
* ``profile`` — how much of onnxruntime's measured time the profiler maps back to original nodes;
* ``pipeline`` — a K-stage pipeline against the model run without one (sessions, replicas);
* ``overhead`` — onnxpipe's thread pipeline against the simplest pipeline written by hand;
* ``calibrate`` — calibration's stage times taken in turns against one stage after the other;
* ``interleave`` — interleaved stages against a contiguous split: throughput and weights per worker;
* ``ray`` — the Ray backend: one actor per worker against one per stage, and the whole model;
* ``cluster`` — the Ray backend across nodes: a hop's overhead per transport, the 2-stage pipeline
  against two Ray replicas and the threads backend, a decoder's generation split over two nodes against
  the unsplit model and two replicas (``--cases generate`` alone), and the time a killed node costs;
* ``stagecost`` — what a cut costs: K stages one after the other against the whole model, one CPU;
* ``nodesplit`` — plans that cut one dominating node (GPT-2 small's LM head, an Inception Conv) against
  the best contiguous split: bottlenecks over ``total / K``, and the slowest stage timed alone.
* ``runtimes`` — per runtime (onnxruntime, OpenVINO, tract): plans from onnxruntime's costs against plans
  from the runtime's own measured and calibrated costs, slowest against mean stage;
* ``gpu`` — for a machine with an accelerator: a CPU stage and a GPU stage planned from profiles on each,
  verified, measured against predicted; skips, saying why, where no GPU provider is present.
* ``decoders`` — decoder LLMs: stage balance at prefill and decode for splits balanced for prefill,
  decode, both phases, and equal layer counts;
* ``generate`` — decode throughput of a decoder's K-stage pipeline with K and more sequences in flight,
  against the unsplit model and K replicas running the same sequences;
* ``decoder_copies`` — decoders: bytes crossing each cut per step with rotary tables and masks made in
  each stage against sent, and the stage times (``--time``).
* ``tied`` — a tied embedding and LM head: plan weights, files and measured memory of 2 stages on 2
  workers against 3 on 2 (the table on worker 0 alone), and one table given to two sessions.
"""

from __future__ import annotations

CI_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "partition",
        ("--models", "mlp,resnet_tiny,transformer_tiny", "--max-nodes", "1000", "--max-items", "10000"),
    ),
    ("partition_speed", ("--sizes", "1000", "--ks", "2", "4", "--repeats", "1")),
    ("partition_speed", ("--devices", "--sizes", "1000", "--ks", "2", "4", "--repeats", "1")),
    (
        "order",
        ("sample_models/mlp.onnx", "sample_models/resnet_tiny.onnx", "sample_models/transformer_tiny.onnx"),
    ),
    ("export", ("--bytes", "4000000", "--k", "2")),
    ("scale", ("--nodes", "300", "1000", "--k", "2")),
    ("bigmodel", ("--gb", "0.01", "--k", "1", "2")),
)
"""``(name, arguments)`` of every small run of a deterministic benchmark: sample models and generated
graphs only (nothing to download), each well under a minute on two shared CPUs."""

DETERMINISTIC: tuple[str, ...] = tuple(dict.fromkeys(name for name, _ in CI_RUNS))
"""The benchmarks that run anywhere, CI included (the first list above)."""
