"""The ``onnxpipe`` command: it parses, maps flags to options through one table per subcommand, calls
:mod:`onnxpipe.api`, and prints; the only place that prints, and the only one that names a flag.

Exit codes (documented in docs/cli.md): 0 success; 1 verification found a mismatch; 2 usage error;
3 model cannot be loaded; 4 profiling failed or profile of another model; 5 no valid partition;
6 export failed; 7 manifest invalid or stage files changed; 8 a stage failed while running.
argparse's own errors (a missing or unknown option, a bad value) are usage errors too: one line, exit 2;
an unknown option is named, with the closest one, before any missing required one.
A library error names the option to change as its field (:mod:`onnxpipe.core.options`); it is printed
with that option worded as its flag.

Each subcommand has its table of flags in :mod:`onnxpipe.cli.parsers` (argparse, the door's light options
and core only), and its work, a function ``name(args) -> int`` (the exit code) below: its call of the door
and what it prints.  The door's functions and results load onnx, onnxruntime and numpy on first use
(:mod:`onnxpipe.api` is a lazy facade): ``--help``, ``--version`` and usage errors answer without loading
them (a test checks that they stay unloaded).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from onnxpipe import api
from onnxpipe.cli import parsers
from onnxpipe.cli.arguments import CommandParser
from onnxpipe.cli.say import COMMAND_START, Say, process_start, reading
from onnxpipe.cli.tables import (
    format_decoder,
    format_manifest_table,
    format_model_table,
    format_plan_table,
    format_stage_counts,
    format_verify_report,
)
from onnxpipe.core.errors import OnnxpipeError
from onnxpipe.core.text import counted
from onnxpipe.core.version import __version__


def profile(args: argparse.Namespace) -> int:
    reading(args.model, quiet=args.quiet)
    say = Say("profile", quiet=args.quiet)
    prof = api.profile(args.model, parsers.PROFILE.options(args), listener=say)
    on = "" if prof.on_reference else f" on {prof.runtime}"
    print(
        f"profiled {len(prof.node_seconds)} nodes of {args.model.name}{on}: "
        f"{prof.total_seconds * 1e3:.3f} ms per run ({prof.source}, {prof.threads} thread(s)); "
        f"saved {args.out}"
    )
    if prof.inputs:
        shown = ", ".join(f"{r.file} ({counted(r.samples, 'sample')})" for r in prof.inputs)
        print(f"  inputs: {shown}")
    for note in prof.unattributed[:10]:
        print(f"  note: {say.text(note)}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    say.done("profiled")
    return 0


def split(args: argparse.Namespace) -> int:
    reading(args.model, quiet=args.quiet)
    say = Say("split", json_output=args.json, quiet=args.quiet)
    result = api.split(args.model, parsers.SPLIT.options(args), listener=say)
    if args.json:
        print(result.to_json())
    else:
        plan = result.plan
        print("\n".join([*format_stage_counts(plan), format_manifest_table(result.manifest)]))
        print(
            f"wrote {api.written_stages(result)} to {args.out}/ "
            f"(bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
            f"{plan.ratio_to_lower_bound:.3f}x the lower bound)"
        )
        for note in result.manifest.plan.notes:
            print(f"  note: {say.text(note)}")
        if result.report is not None:
            print(format_verify_report(result.report))
    say.done("split")
    return 0 if result.ok else 1


def plan(args: argparse.Namespace) -> int:
    reading(args.model, quiet=args.quiet)
    say = Say("plan", json_output=args.json, quiet=args.quiet)
    result = api.plan(args.model, parsers.PLAN.options(args), listener=say)
    plan = result.plan
    if args.json:
        print(result.to_json())
    else:
        print("\n".join([*format_stage_counts(plan), format_plan_table(plan)]))
        for note in plan.notes:
            print(f"  note: {say.text(note)}")
    if result.drawn is not None:
        say.line(f"drew {result.drawn}")
    say.done("planned")
    return 0


def verify(args: argparse.Namespace) -> int:
    reading(args.dir)
    say = Say("verify", json_output=args.json)  # made first: its total time counts the verification
    report = api.verify(args.dir, parsers.VERIFY.options(args))
    print(api.verify_json(report) if args.json else format_verify_report(report))
    if report.record_note is not None:
        say.line(f"note: {report.record_note}")
    elif report.recorded_in is not None:
        say.line(f"recorded in {report.recorded_in}: verification {'passed' if report.ok else 'failed'}")
    say.done("verified")
    return 0 if report.ok else 1


def run(args: argparse.Namespace) -> int:
    """Run ``args.dir`` as a pipeline and print what it delivered; 1 when ``--compare`` finds a mismatch."""
    say = Say("run", json_output=args.json)
    options = parsers.RUN.options(args)
    report = api.run(args.dir, options, listener=say)
    print(api.run_json(report) if args.json else say.text(api.format_report(report)))
    for path in (options.report, options.outputs):
        if path is not None:
            say.line(f"wrote {path}")
    say.done("ran")
    return 1 if report.outputs_match is False else 0


def generate(args: argparse.Namespace) -> int:
    say = Say("generate", json_output=args.json)
    options = parsers.GENERATE.options(args)
    streamed = not args.json and len(options.prompts) == 1

    def stream(index: int, text: str) -> None:  # the one sequence's answer, printed as it is made
        print(text, end="", flush=True)

    result = api.generate(args.dir, options, listener=say, on_text=stream if streamed else None)
    if streamed:
        print(flush=True)
    if args.json:
        print(result.to_json())
    else:
        _print(result, options.compare, streamed=streamed)
    say.done("generated")
    return 0 if result.same else 1


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
    for i, (stage, node) in enumerate(zip(cluster.stages, cluster.nodes, strict=True)):
        share = f", {cluster.stage_shares[i]:.0%} of a step running" if i < len(cluster.stage_shares) else ""
        lines.append(f"stage {stage}: node {node.short}{share}")
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


def links(args: argparse.Namespace) -> int:
    say = Say("links", json_output=args.json)
    report = api.links(args.devices, parsers.LINKS.options(args), listener=say)
    print(report.to_json() if args.json else say.text(api.format_links(report)))
    if report.written is not None:
        say.line(f"wrote {report.written}")
    say.done("measured")
    return 0


def inspect(args: argparse.Namespace) -> int:
    found = api.inspect(args.target, parsers.INSPECT.options(args))
    if args.json:
        print(found.to_json())
    elif isinstance(found, api.FolderInspection):
        for problem in found.file_problems:  # first: what the table's verification line stands on
            print(f"error: {problem}: verify and run refuse this folder; re-run onnxpipe split")
        print(format_manifest_table(found.manifest, files_changed=bool(found.file_problems)))
        if found.checked and found.ok:
            print(f"files: the {found.manifest.k} stage file(s) are those the split wrote (sha256 checked)")
    else:
        print(format_model_table(found.view, found.summary))
        facts = found.facts.describe() if found.facts is not None else None
        decoder = format_decoder(found.view, found.decoder, facts)
        if decoder:
            print(decoder)
    return 0 if not isinstance(found, api.FolderInspection) or found.ok else 1


def export_triton(args: argparse.Namespace) -> int:
    repo = api.export_triton(args.dir, parsers.EXPORT_TRITON.options(args))
    stages = len(repo.models) - 1
    print(
        f"wrote a Triton repository to {repo.path}/: ensemble {repo.ensemble!r} over {stages} stage "
        f"model(s), max_batch_size {repo.models[0].max_batch_size}"
    )
    checked = (
        "parsed with tritonclient's ModelConfig and"
        if repo.parsed
        else "(tritonclient not installed: not parsed)"
    )
    print(f"  configs {checked} data flow checked; no server was started")
    for note in repo.notes:
        print(f"  note: {note}")
    return 0


WORK: dict[str, Callable[[argparse.Namespace], int]] = {
    work.__name__.replace("_", "-"): work
    for work in (profile, split, plan, verify, run, generate, links, inspect, export_triton)
}
"""Subcommand name -> its work.  A command given a model or a split folder says so first
(:func:`onnxpipe.cli.say.reading`), before the door loads onnx and onnxruntime (seconds on a loaded
machine)."""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="onnxpipe",
        description="Split an ONNX model into a balanced pipeline of stage models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in parsers.SUBCOMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (errors print one line to stderr).

    argparse's usage errors, ``--help`` and ``--version`` end in :class:`SystemExit` (code 2, 0, 0), as
    argparse does, before any command runs: a usage error writes nothing.  The time a command prints
    counts from the process's start when ``argv`` is None (the console script), else from this call.
    """
    started = COMMAND_START.set(process_start() if argv is None else time.perf_counter())
    try:
        return _main(argv)
    finally:
        COMMAND_START.reset(started)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return WORK[args.command](args)
    except OnnxpipeError as e:
        print(f"onnxpipe {args.command}: error: {parsers.worded(str(e), args.command)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # a library's interrupt may say what it left: "during ...: ..."
        print(f"onnxpipe {args.command}: interrupted{f' {e}' if str(e) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`onnxpipe plan ... | head`): what was written stands; point stdout at
        # /dev/null so that the interpreter's final flush does not fail again, and exit as SIGPIPE would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
