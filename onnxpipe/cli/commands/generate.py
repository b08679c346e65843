"""The work of ``onnxpipe generate`` (parser and table: :mod:`onnxpipe.cli.generate`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.cli.generate import TABLE
from onnxpipe.cli.say import Say
from onnxpipe.core.text import counted


def run(args: argparse.Namespace) -> int:
    say = Say("generate", json_output=args.json)
    options = TABLE.options(args)
    streamed = not args.json and len(options.prompts) == 1
    result = api.generate(args.dir, options, listener=say, on_text=_stream if streamed else None)
    if streamed:
        print(flush=True)
    if args.json:
        print(result.to_json())
    else:
        _print(result, options.compare, streamed=streamed)
    say.done("generated")
    return 0 if result.same else 1


def _stream(index: int, text: str) -> None:
    """One sequence's answer, printed as it is made."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _print(result: api.GenerateResult, compared: bool, *, streamed: bool) -> None:
    for i, (prompt, tokens) in enumerate(zip(result.prompts, result.tokens, strict=True)):
        if result.texts is not None and not streamed:
            print(f"sequence {i}: {result.texts[i]}")
        shown = " ".join(str(t) for t in tokens)
        print(f"sequence {i}: {len(prompt)} prompt token(s) -> {len(tokens)} new: {shown}")
    k, workers = result.stages, result.workers
    on = f" on {workers} workers" if workers != k else ""
    labels = {
        "pipeline": f"{k}-stage pipeline{on}",
        "unsplit": "unsplit model (plain onnxruntime loop)",
        "replicas": f"{workers} replicas",
    }
    split = result.runs["pipeline"]
    for name, g in result.runs.items():
        line = (
            f"{labels[name]}: {g.new_tokens} tokens in {g.seconds:.3f} s, {g.tokens_per_second:.1f} tokens/s"
        )
        if name != "pipeline" and g.tokens_per_second > 0:
            line += f" (the pipeline makes {split.tokens_per_second / g.tokens_per_second:.2f}x as many)"
        print(line)
        print(f"  {_latency(g)}")
    if result.cluster is not None:
        for line in cluster_lines(result.cluster, split.rebuilt):
            print(line)
    if compared:
        print(
            "tokens: the same as the unsplit model's"
            if result.same
            else "tokens: DIFFERENT from the unsplit model's: the split does not compute what it does"
            if result.sampling is None
            else "tokens: DIFFERENT from the unsplit model's: logits that differ within rounding can "
            "change a draw and every token after it; compare greedy tokens (leave out --do-sample)"
        )


def _latency(g: api.Generation) -> str:
    """A run's latency line: its batch, time to first token, time per token, each worker's busy share."""
    parts = [f"up to {counted(g.batch, 'sequence')} a step"]
    first = g.time_to_first_token()
    if first is not None:
        parts.append(f"first token {first * 1e3:.1f} ms (median)")
    p50, p90 = g.time_per_token(0.5), g.time_per_token(0.9)
    if p50 is not None and p90 is not None:
        parts.append(f"per token {p50 * 1e3:.2f} ms p50, {p90 * 1e3:.2f} ms p90")
    if g.busy_shares:
        parts.append("busy " + " ".join(f"{b:.0%}" for b in g.busy_shares))
    return "; ".join(parts)


def cluster_lines(cluster: api.GenerationCluster, rebuilt: int) -> list[str]:
    """Where a generation ran on Ray: each stage's node and share of a step's time, each hop's, each
    lost actor brought back and the sequences rebuilt."""
    lines = []
    for i, n in enumerate(cluster.nodes):
        share = f", {cluster.stage_shares[i]:.0%} of a step running" if i < len(cluster.stage_shares) else ""
        lines.append(f"stage {n.stage}: node {n.host} ({n.address}, node {n.node_id[:8]}){share}")
    if cluster.hops:
        hops = ", ".join(
            f"{h.source} -> {h.target} {h.median_ms:.2f} ms ({h.share:.0%})" for h in cluster.hops
        )
        lines.append(f"hops per step (median, share of a step's time): {hops}")
    for r in cluster.recoveries:
        what = "its node" if r.node_lost else "its actor on"
        lines.append(
            f"recovered: stage {', '.join(map(str, r.stages))} lost {what} {r.lost.short}; running again on "
            f"{r.now.short} {r.seconds:.1f} s later, {r.replayed} step(s) dropped"
        )
    if rebuilt:
        lines.append(f"rebuilt: {rebuilt} sequence cache(s) by a prefill of their tokens so far")
    return lines
