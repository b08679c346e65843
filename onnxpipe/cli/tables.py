"""Plain-text tables the CLI prints: a split (from its manifest), a model, a plan, a verification.

Formatting only: the functions return strings and the subcommands print them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from onnxpipe import api
from onnxpipe.core.dims import dims_text
from onnxpipe.core.text import human_bytes, names_text, table

BYTES_LEGEND = (
    "bytes in: what a stage reads (model inputs, earlier stages' outputs); link in: what crosses the link "
    "from the stage before (what it reads from earlier stages and forwards to later ones), what its "
    "transfer costs"
)
"""What the two byte columns of a stage table mean (their sizes differ for a reason the reader needs)."""


def _columns(*columns: tuple[str, Sequence[str]]) -> str:
    """A table given column by column, each a header and its cells: a column that does not apply is left
    out whole."""
    return table([head for head, _ in columns], list(zip(*(cells for _, cells in columns), strict=True)))


def _layer_range(layers: Sequence[int]) -> str:
    """``3-5`` for the layers 3, 4 and 5; ``-`` for none."""
    return "-" if not layers else (f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}-{layers[-1]}")


def format_manifest_table(manifest: api.Manifest, *, files_changed: bool = False) -> str:
    """Stage, device, nodes, estimated cost, bytes in and out, params, and share of the bottleneck; for a
    decoder, then each stage's KV cache and phases (what split and inspect both show).

    ``files_changed``: the stage files are not those the split wrote, so a verification recorded as
    passed no longer holds, and the line says so instead of ``passed``.

    "bytes in" is what the stage reads from earlier stages and the model; "link in" what crosses the
    link in front of it in a chain, tensors it forwards to later stages included (what transfer costs);
    a line under the table says so (:data:`BYTES_LEGEND`).
    In an interleaved split the device column names the worker, the bottleneck is the busiest worker's
    time (all its stages), and a line per worker sums its time and weights.
    """
    stages = manifest.stages
    # a stage's time as the plan's objective counts it: with a devices file transfers run on their own
    # links and overlap compute (the larger counts), else they add to the stage
    overlapped = manifest.cluster is not None
    compute = [s.estimated_compute_seconds for s in stages]
    transfer = [s.estimated_transfer_seconds for s in stages]
    costs = [max(c, t) if overlapped else c + t for c, t in zip(compute, transfer, strict=True)]
    workers = (
        [manifest.worker_of(i) for i in range(manifest.k)] if manifest.plan.workers is not None else None
    )
    bottleneck, worker_lines = _by_worker(
        workers, costs, [s.param_bytes for s in stages], manifest.plan.worker_param_bytes
    )
    head = _columns(
        ("stage", [f"{s.index}" for s in stages]),
        ("device", [s.device if workers is None else f"worker {workers[s.index]}" for s in stages]),
        ("nodes", [f"{s.node_count}" for s in stages]),
        ("cost ms", [f"{cost * 1e3:.3f}" for cost in costs]),
        ("bytes in", [human_bytes(sum(i.bytes_per_sample for i in s.inputs)) for s in stages]),
        ("link in", [human_bytes(s.link_bytes_in) for s in stages]),
        ("bytes out", [human_bytes(sum(o.bytes_per_sample for o in s.outputs)) for s in stages]),
        ("params", [human_bytes(s.param_bytes) for s in stages]),
        ("of bottleneck", [f"{cost / bottleneck if bottleneck > 0 else 0.0:.0%}" for cost in costs]),
    )
    plan = manifest.plan
    footer = (
        f"{BYTES_LEGEND}\n"
        f"{manifest.source.file}: {plan.k} stages, bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
        f"lower bound {plan.lower_bound_seconds * 1e3:.3f} ms (ratio {plan.ratio_to_lower_bound:.3f}), "
        f"costs: {plan.cost_source}, {plan.threads} thread(s)"
    )
    if plan.link_model is not None:
        footer += f"\nlinks: {plan.link_model.described}"
    if plan.optimized_for is not None:
        alone = sum(s.estimated_compute_seconds + s.estimated_transfer_seconds for s in manifest.stages)
        footer += f"\nobjective: {plan.optimized_for}; one sample alone takes {alone * 1e3:.3f} ms"
    v = manifest.verification
    if v is not None and files_changed:
        footer += (
            f"\nverification: {v.status} for the files the split wrote, which have changed since (the "
            "errors above): it no longer holds"
        )
    elif v is not None:
        footer += "\nverification: " + (
            f"{v.status} (|a-b| <= {v.atol:g} + {v.rtol:g}*max|a|, seed {v.seed}, {v.runs} run(s))"
            if v.verified and v.atol is not None and v.rtol is not None
            else f"{v.status}: the stages were not compared with the model; onnxpipe verify compares them"
        )
    footer += "".join(f"\n{line}" for line in worker_lines)
    return "\n".join(part for part in (head, footer, _decoder_stages(manifest)) if part)


def format_model_table(view: api.ModelView, s: api.ModelSummary) -> str:
    """Per operator type: node count and parameter bytes (each weight at its first reader, so that the
    column sums to the model's weights); then the model's inputs and outputs (dtypes,
    dims with symbols by name), opsets, node counts, weights, control-flow nodes and external data."""
    params: Counter[str] = Counter()
    seen: set[str] = set()  # a weight several nodes read (a tied embedding and LM head) counts once
    for n in view.nodes:
        fresh = [t for t in dict.fromkeys(n.reads) if t in view.weights and t not in seen]
        seen.update(fresh)
        op = f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        params[op] += sum(view.weights[t] for t in fresh)
    rows = [[op, f"{c}", human_bytes(params[op])] for op, c in s.op_counts]
    lines = [table(["op", "nodes", "params"], rows)]
    for kind, tensors in (("input", s.inputs), ("output", s.outputs)):
        lines += [
            f"{kind} {t.name}: {t.dtype} {dims_text(t.shape, '[unknown rank]', cut=32)}" for t in tensors
        ]
    if any(t.shape is None or any(not isinstance(d, int) or d < 0 for d in t.shape) for t in s.inputs):
        lines.append("  dims shown by name or ? are sized by a guess unless --shape NAME=D1,D2,... sets them")
    lines.append(f"opsets: {', '.join(f'{d} {v}' for d, v in s.opsets)}; IR version {s.ir_version}")
    if s.control_flow:
        shown = names_text([f"{name} ({op})" for name, op in s.control_flow], limit=5)
        lines.append(
            f"control flow: {len(s.control_flow)} node(s) with subgraphs, each kept whole in one stage: "
            f"{shown}"
        )
    else:
        lines.append("control flow: none")
    if s.external_data:
        files = ", ".join(f"{f} ({n} tensors)" for f, n in s.external_data)
        lines.append(f"external data: {files}")
    else:
        lines.append("external data: none (weights inside the model file)")
    lines.append(
        f"{s.name}: {s.node_count} nodes ({s.compute_node_count} placed by the partitioner, "
        f"{s.node_count - s.compute_node_count} cheap constants), "
        f"{human_bytes(s.param_bytes)} of weights; inputs: {', '.join(view.inputs) or '-'}; "
        f"outputs: {', '.join(view.outputs) or '-'}"
    )
    return "\n".join(lines)


def format_decoder(view: api.ModelView, dec: api.DecoderInfo | None, model_line: str | None = None) -> str:
    """What ``inspect`` found of a decoder: its cache pairs, its inputs' roles, its dims and config
    (``model_line``), each group's nodes (and the notes loading made); empty for a model that is no
    decoder and loaded without remarks."""
    lines = [f"note: {n}" for n in view.notes]
    if dec is None:
        return "\n".join(lines)
    lines.append(dec.describe())
    lines.append(
        f"inputs: tokens {dec.ids_input}, mask {dec.mask_input or '-'}, "
        f"positions {dec.positions_input or '-'}"
    )
    if model_line:
        lines.append(model_line)
    counts = Counter(dec.node_layer.values())
    rows = []
    for group in sorted(counts):
        if group == -1:
            what = "before the layers (embedding, rotary tables, masks)"
        elif group == dec.layers:
            what = "after the layers (final norm, LM head)"
        else:
            pair = dec.kv[group]
            what = ", ".join(pair.pasts + pair.presents)
        rows.append([str(group) if 0 <= group < dec.layers else "-", f"{counts[group]}", what])
    lines.append(table(["layer", "nodes", "KV cache"], rows))
    if dec.shape_readers:
        lines.append(
            f"{len(dec.shape_readers)} node(s) read another layer's past for its shape only: "
            + ", ".join(f"{n} ({t})" for n, t in dec.shape_readers)
        )
    return "\n".join(lines)


def _decoder_stages(manifest: api.Manifest) -> str:
    """Per stage of a decoder's split: the layers whose KV cache it holds, the cache's bytes, and each
    phase's estimate; empty for other models."""
    dec = manifest.plan.decoder
    if dec is None:
        return ""
    phases = [p for p, _ in manifest.stages[0].estimated_phase_seconds] if manifest.stages else []
    stages = manifest.stages
    stage_table = _columns(
        ("stage", [f"{st.index}" for st in stages]),
        ("KV layers", [_layer_range(st.kv_layers) for st in stages]),
        (f"KV at {dec.max_context} tokens", [human_bytes(st.kv_cache_bytes) for st in stages]),
        *((f"{p} ms", [f"{dict(st.estimated_phase_seconds)[p] * 1e3:.3f}" for st in stages]) for p in phases),
    )
    model = dec.model
    facts = ""
    if model is not None:
        eos = ", ".join(map(str, model.eos_token_ids)) or "none stated"
        files = ", ".join(model.files) or "none"
        facts = (
            f"\nmodel: vocabulary {model.vocab_size or '?'}, context {model.context_length or '?'}, eos {eos}"
            f" ({model.config or 'no config'}); files: {files}"
        )
    return (
        stage_table
        + (
            f"\ndecoder: {dec.layers} layers, "
            f"{'cuts between layers' if dec.layer_cuts else 'cuts anywhere'}, ends {dec.ends}, "
            f"balanced for {dec.phase}"
        )
        + facts
    )


def _by_worker(
    workers: Sequence[int] | None,
    costs: Sequence[float],
    params: Sequence[int],
    worker_params: Sequence[int] | None = None,
) -> tuple[float, list[str]]:
    """The bottleneck the share column is relative to, and a line per worker of an interleaved split
    (its weights ``worker_params[w]`` where given, each tensor once, else its stages' ``params`` summed).

    With a worker per stage (``workers`` None) the bottleneck is the slowest stage and there are no
    lines; where stages share workers it is the busiest worker's time, all its stages together.
    """
    if workers is None:
        return (max(costs) if costs else 0.0), []
    groups = {workers[stages[0]]: stages for stages in api.worker_groups(workers)}
    loads = {w: sum(costs[s] for s in stages) for w, stages in groups.items()}
    bottleneck = max(loads.values(), default=0.0)
    lines = [
        f"worker {w}: stages {', '.join(map(str, stages))}, {loads[w] * 1e3:.3f} ms "
        f"({loads[w] / bottleneck if bottleneck > 0 else 0.0:.0%} of the bottleneck), "
        f"params {human_bytes(worker_params[w] if worker_params else sum(params[s] for s in stages))}"
        for w, stages in sorted(groups.items())
    ]
    return bottleneck, lines


def format_plan_table(plan: api.Plan) -> str:
    """Stage, device, nodes, compute and transfer per micro-batch, parameters, the memory a stage needs
    (parameters and peak activations, against the device's where a devices file gives it), share of
    the bottleneck; then the schedule: kind, micro-batches, simulated batch time, bubble, throughput."""
    stages = plan.stages
    costs = [max(s.compute_seconds, s.transfer_seconds) if plan.cluster else s.cost_seconds for s in stages]
    workers = [s.worker if s.worker is not None else s.index for s in stages] if plan.workers else None
    bottleneck, worker_lines = _by_worker(
        workers, costs, [s.param_bytes for s in stages], plan.worker_param_bytes
    )
    caps = plan.cluster.mem_caps if plan.cluster is not None else None

    def memory(i: int) -> str:
        s = stages[i]
        need = human_bytes(s.param_bytes + s.peak_activation_bytes * plan.microbatch_size)
        return need if caps is None or caps[i] == float("inf") else f"{need} of {human_bytes(caps[i])}"

    kv = [human_bytes(s.kv_cache_bytes) for s in stages]
    stage_table = _columns(
        ("stage", [f"{s.index}" for s in stages]),
        ("device", [s.device if workers is None else f"worker {workers[i]}" for i, s in enumerate(stages)]),
        ("nodes", [f"{len(s.node_names)}" for s in stages]),
        ("compute ms", [f"{s.compute_seconds * 1e3:.3f}" for s in stages]),
        ("transfer ms", [f"{s.transfer_seconds * 1e3:.3f}" for s in stages]),
        ("bytes in", [human_bytes(s.bytes_in) for s in stages]),
        ("link in", [human_bytes(s.link_bytes_in) for s in stages]),
        ("params", [human_bytes(s.param_bytes) for s in stages]),
        ("memory need", [memory(i) for i in range(len(stages))]),
        ("load", [f"{cost / bottleneck:.0%}" if bottleneck > 0 else "-" for cost in costs]),
        *([(f"KV at {plan.decoder.max_context}", kv)] if plan.decoder is not None else []),
    )
    lines = [stage_table, BYTES_LEGEND, *worker_lines]
    lines.append(
        f"bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms per micro-batch, lower bound "
        f"{plan.lower_bound_seconds * 1e3:.3f} ms (ratio {plan.ratio_to_lower_bound:.3f}); costs: "
        f"{plan.cost_source}, {plan.threads} thread(s)"
    )
    if plan.link_model is not None:
        lines.append(f"links: {plan.link_model.described}")
    if plan.optimized_for is not None:
        lines.append(
            f"objective: {plan.optimized_for}; one sample alone through every stage and link takes "
            f"{plan.latency_seconds * 1e3:.3f} ms"
        )
    for rec in plan.device_costs:
        lines.append(f"  {rec.device}: {rec.source}")
    tl = plan.timeline
    if tl is not None:
        lines.append(
            f"schedule {tl.kind}: {tl.microbatches} micro-batches of {plan.microbatch_size} sample(s), "
            f"simulated {tl.makespan * 1e3:.3f} ms, bubble {tl.bubble_fraction:.0%}, "
            f"{tl.steady_state_throughput_per_s:.1f} micro-batches/s in steady state"
        )
    return "\n".join(lines)


def format_stage_counts(plan: api.Plan) -> list[str]:
    """``--stages auto``: a row per stage count tried, its bottleneck and throughput, the chosen marked (a
    table printed before the plan's; none for a count given)."""
    if not plan.stage_counts_tried:
        return []
    rows = []
    for k, seconds in plan.stage_counts_tried:
        fits = seconds != float("inf") and seconds > 0
        rows.append(
            [
                f"{k}",
                f"{seconds * 1e3:.3f}" if fits else "-",
                f"{1 / seconds:.1f}" if fits else "-",
                "<- chosen" if k == plan.k else "",
            ]
        )
    what = "latency ms" if plan.optimized_for == "latency" else "bottleneck ms"
    return [table(["stages", what, "per second", "choice"], rows)]


def _of_type(report: api.VerifyReport) -> str:
    """``, for float16 outputs`` where every output shares a type whose tolerance is its own."""
    types = {o.expected_dtype for o in report.outputs}
    return f", for {next(iter(types))} outputs" if len(types) == 1 and types != {"float32"} else ""


def format_verify_report(report: api.VerifyReport) -> str:
    """A line per output, then the verdict with the tolerance and any notes; first, when a stage ran on
    another runtime than onnxruntime on the CPU, a line saying what ran each stage."""
    lines = [f"  {report.stages_line}"] if report.stages_line is not None else []
    mixed = any((o.rtol, o.atol) != (report.rtol, report.atol) for o in report.outputs)
    for i, o in enumerate(report.outputs):
        own = f", {o.expected_dtype}: |a-b| <= {o.atol:g} + {o.rtol:g}*max|a|" if mixed else ""
        lines.append(f"  {report.output_line(i, own)}")
    shapes = ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in report.input_shapes.items())
    source = f"from {', '.join(report.input_files)}" if report.input_files else f"random, seed {report.seed}"
    lines.append(f"  inputs: {shapes} ({source}, {report.runs} run(s))")
    lines.append(f"verify: {report.verdict} (tolerance: {report.tolerance}{_of_type(report)})")
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)
