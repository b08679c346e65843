"""The ``onnxpipe`` command: thin argument parsing over :mod:`onnxpipe.api`; the only place that prints.

Exit codes (documented in docs/cli.md): 0 success; 1 verification found a mismatch; 2 usage error;
3 model cannot be loaded; 4 profiling failed or profile of another model; 5 no valid partition;
6 export failed; 7 manifest invalid or stage files changed; 8 a stage failed while running.
argparse's own errors (a missing or unknown option, a bad value) are usage errors too: one line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar, overload

from onnxpipe import api
from onnxpipe.argtypes import bandwidth, count, fraction, positive_int, positive_number
from onnxpipe.calibrate.timing import CALIBRATION_MODES, DEFAULT_CALIBRATION_MODE
from onnxpipe.core.errors import OnnxpipeError, UsageError
from onnxpipe.cost.profile import Profile
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.model import ModelView, load_model
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.manifest import load_manifest
from onnxpipe.plan.draw import draw_plan
from onnxpipe.plan.planner import DEFAULT_TIME_SLACK
from onnxpipe.plan.request import SCHEDULE_CHOICES, ScheduleRequest
from onnxpipe.runtime.cli import add_run_arguments, run_command
from onnxpipe.tables import format_manifest_table, format_model_table, format_plan_table
from onnxpipe.verification.verify import VerifyReport, verify

_N = TypeVar("_N")


class _CommandParser(argparse.ArgumentParser):
    """A parser whose own errors are one line, like every other onnxpipe error.

    argparse prints its whole usage block before the error, which buries the one line that matters; the
    project's rule is one line naming what is wrong and what to do.  The usage stays one ``--help`` away
    (the line says so), and the exit code stays argparse's 2, the usage-error code of docs/cli.md.
    """

    def error(self, message: str) -> NoReturn:
        what = " ".join(message.split())  # one line, whatever a type function put in its message
        self.exit(2, f"{self.prog}: error: {what}; see '{self.prog} --help'\n")


class _SubcommandParser(_CommandParser):
    """A subcommand's parser, which also refuses arguments it does not know itself.

    argparse hands a subcommand's unknown arguments up to the top-level parser, whose error would read
    ``onnxpipe: error: unrecognized arguments`` and point at the top-level help, which does not list the
    subcommand's options; refused here, the line names the subcommand and its ``--help``.
    """

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def _stages(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def _add_measure_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="intra-op threads to profile with, which the stages run with (default 1; with --devices each "
        "device's threads)",
    )
    g.add_argument("--runs", type=positive_int, default=30, help="timed runs to take the median of")
    g.add_argument("--warmup", type=count, default=3, help="untimed warm-up runs")
    _add_shape_arg(g)


def _add_shape_arg(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="concrete shape of a model input with dynamic dims (repeatable)",
    )


def _add_planning_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planning")
    g.add_argument(
        "--stages", "-k", type=_stages, required=True, metavar="K|auto", help="number of stages, or auto"
    )
    g.add_argument("--profile", type=Path, help="reuse a profile saved by 'onnxpipe profile'")
    g.add_argument(
        "--cost", choices=api.COST_SOURCES, default="profile", help="measured (default) or static costs"
    )
    g.add_argument(
        "--bandwidth",
        type=bandwidth,
        default=math.inf,
        help="link bandwidth in bytes/s; bytes a stage receives count as transfer time (default: free)",
    )
    g.add_argument(
        "--workers",
        type=positive_int,
        metavar="W",
        help="deal the K stages out to W identical workers in turn (stage s on worker s %% W), so that "
        "each worker gets about 1/W of the time and of the weights (inference; K a multiple of W)",
    )
    g.add_argument(
        "--time-slack",
        type=fraction,
        metavar="F",
        help=f"with --workers: accept a split up to F slower than the fastest (default {DEFAULT_TIME_SLACK}, "
        "i.e. 1%%) if it balances the workers' weights better",
    )
    g.add_argument("--devices", type=Path, help="cluster file: devices in pipeline order and their links")
    g.add_argument(
        "--order", choices=("fixed", "free"), default="fixed", help="keep the devices' order, or search it"
    )
    g.add_argument(
        "--schedule",
        choices=SCHEDULE_CHOICES,
        default="stream",
        help="stream (inference), gpipe or 1f1b (training), auto (best training schedule)",
    )
    g.add_argument("--microbatches", type=positive_int, help="micro-batches M per batch (default 8)")
    g.add_argument("--batch", type=positive_int, help="samples per training iteration (default: M)")
    g.add_argument(
        "--backward-ratio",
        type=positive_number,
        default=2.0,
        help="backward time over forward time (training)",
    )


def _schedule_request(args: argparse.Namespace) -> ScheduleRequest:
    return ScheduleRequest(
        kind=args.schedule,
        microbatches=args.microbatches,
        batch=args.batch,
        backward_ratio=args.backward_ratio,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _CommandParser(
        prog="onnxpipe",
        description="Split an ONNX model into a balanced pipeline of stage models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser
    )

    p = sub.add_parser("profile", help="measure every node's time with onnxruntime and save it")
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--cost", choices=api.COST_SOURCES, default="profile", help="measure, or static FLOPs")
    p.add_argument("--force", action="store_true", help="overwrite an existing profile file")
    _add_measure_args(p)

    s = sub.add_parser("split", help="partition the model into K balanced stages and export them")
    s.add_argument("model", type=Path)
    s.add_argument("--out", type=Path, required=True, help="folder to write stages and manifest.json into")
    _add_planning_args(s)
    s.add_argument(
        "--external-data",
        choices=("auto", "always", "never"),
        default="auto",
        help="store stage weights in separate files",
    )
    s.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    s.add_argument("--no-verify", action="store_true", help="skip comparing the stages with the model")
    s.add_argument(
        "--calibrate",
        type=positive_int,
        nargs="?",
        const=2,
        default=0,
        metavar="ROUNDS",
        help="time the stages, correct the costs and split again (default 2 rounds when given)",
    )
    s.add_argument(
        "--calibrate-in",
        choices=CALIBRATION_MODES,
        default=DEFAULT_CALIBRATION_MODE,
        help="time each stage alone (default), or the stages running together as a pinned thread "
        "pipeline; auto: as a pipeline when there is a physical core for every stage thread",
    )
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_measure_args(s)

    pl = sub.add_parser("plan", help="plan stages for a cluster and print (and draw) the plan")
    pl.add_argument("model", type=Path)
    _add_planning_args(pl)
    pl.add_argument("--plot", type=Path, help="draw the schedule and the stage loads (.png or .svg)")
    _add_measure_args(pl)

    v = sub.add_parser("verify", help="check that the chained stages reproduce the model's outputs")
    v.add_argument("dir", type=Path)
    v.add_argument("--model", type=Path, help="the source model (default: the path in the manifest)")
    v.add_argument("--rtol", type=float, default=1e-4)
    v.add_argument("--atol", type=float, default=1e-5)
    v.add_argument("--seed", type=int, default=0)
    _add_shape_arg(v)

    r = sub.add_parser("run", help="run a split folder as a pipeline and measure it")
    add_run_arguments(r)

    i = sub.add_parser("inspect", help="print a table of a split folder's stages, or of a model")
    i.add_argument("target", type=Path, help="a folder written by 'onnxpipe split', or an .onnx model")
    return parser


def _version() -> str:
    from onnxpipe import __version__

    return __version__


def _print_report(report: VerifyReport) -> None:
    for o in report.outputs:
        status = "ok" if o.ok else "MISMATCH"
        print(f"  {o.name}: {status} (max abs diff {o.max_abs_diff:.3g}, max rel diff {o.max_rel_diff:.3g})")
    verdict = "match" if report.ok else "DO NOT match"
    print(
        f"verify: {len(report.outputs)} output(s) {verdict} the original "
        f"(tolerance: |a-b| <= {report.atol:g} + {report.rtol:g}*max|a|)"
    )


def _cmd_profile(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise UsageError(f"{args.out}: exists; choose another --out or pass --force")
    view = load_model(args.model)
    check_runtime_opsets(view)
    prof = _profile(view, args)
    prof.save(args.out)
    print(
        f"profiled {len(prof.node_seconds)} nodes of {args.model.name}: "
        f"{prof.total_seconds * 1e3:.3f} ms per run ({prof.source}, {prof.threads} thread(s)); "
        f"saved {args.out}"
    )
    for note in prof.unattributed[:10]:
        print(f"  note: {note}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    return 0


def _profile(view: ModelView, args: argparse.Namespace, saved: Path | None = None) -> Profile:
    """The profile the measurement options ask for (``saved``: a profile file to reuse instead)."""
    return api.get_profile(
        view,
        cost=args.cost,
        profile=saved,
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        shapes=parse_shape_overrides(args.shape),
        progress=sys.stderr.isatty(),
    )


def _cmd_plan(args: argparse.Namespace) -> int:
    view = load_model(args.model)
    prof = _profile(view, args, saved=args.profile)
    plan = api.plan(
        view,
        prof,
        args.stages,
        devices=args.devices,
        bandwidth_bytes_per_s=args.bandwidth,
        order=args.order,
        schedule=_schedule_request(args),
        workers=args.workers,
        time_slack=args.time_slack,
    )
    print(format_plan_table(plan))
    for note in plan.notes:
        print(f"  note: {note}")
    if args.plot is not None:
        path = draw_plan(plan, args.plot, title=args.model.name)
        print(f"drew {path}")
    return 0


def _cmd_split(args: argparse.Namespace) -> int:
    result = api.split(
        args.model,
        args.stages,
        args.out,
        devices=args.devices,
        order=args.order,
        schedule=_schedule_request(args),
        profile=args.profile,
        cost=args.cost,
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        bandwidth_bytes_per_s=args.bandwidth,
        shapes=parse_shape_overrides(args.shape),
        force=args.force,
        run_verify=not args.no_verify,
        calibrate=args.calibrate,
        calibrate_in=args.calibrate_in,
        external_data=args.external_data,
        progress=not args.quiet and sys.stderr.isatty(),
        workers=args.workers,
        time_slack=args.time_slack,
    )
    plan = result.plan
    print(format_manifest_table(result.manifest))
    print(
        f"wrote {plan.k} stages to {args.out}/ (bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
        f"{plan.ratio_to_lower_bound:.3f}x the lower bound)"
    )
    for note in plan.notes:
        print(f"  note: {note}")
    if result.report is not None:
        _print_report(result.report)
        return 0 if result.report.ok else 1
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    report = verify(
        args.dir,
        model_path=args.model,
        shapes=parse_shape_overrides(args.shape),
        seed=args.seed,
        rtol=args.rtol,
        atol=args.atol,
    )
    _print_report(report)
    return 0 if report.ok else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    target: Path = args.target
    if target.is_dir():
        print(format_manifest_table(load_manifest(target, check_files=False)))
    else:
        print(format_model_table(load_model(target)))
    return 0


COMMANDS = {
    "run": run_command,
    "profile": _cmd_profile,
    "plan": _cmd_plan,
    "split": _cmd_split,
    "verify": _cmd_verify,
    "inspect": _cmd_inspect,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (errors print one line to stderr).

    argparse's usage errors, ``--help`` and ``--version`` end in :class:`SystemExit` (code 2, 0, 0), as
    argparse does, before any command runs: a usage error writes nothing.
    """
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except OnnxpipeError as e:
        print(f"onnxpipe {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"onnxpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`onnxpipe plan ... | head`): what was written stands; point stdout at
        # /dev/null so that the interpreter's final flush does not fail again, and exit as SIGPIPE would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
