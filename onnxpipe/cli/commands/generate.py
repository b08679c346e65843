"""The work of ``onnxpipe generate`` (parser and table: :mod:`onnxpipe.cli.generate`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.cli.generate import TABLE
from onnxpipe.cli.say import Say


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
    parts = [f"up to {g.batch} a step"]
    first = g.time_to_first_token()
    if first is not None:
        parts.append(f"first token {first * 1e3:.1f} ms (median)")
    p50, p90 = g.time_per_token(0.5), g.time_per_token(0.9)
    if p50 is not None and p90 is not None:
        parts.append(f"per token {p50 * 1e3:.2f} ms p50, {p90 * 1e3:.2f} ms p90")
    if g.busy_shares:
        parts.append("busy " + " ".join(f"{b:.0%}" for b in g.busy_shares))
    return "; ".join(parts)
