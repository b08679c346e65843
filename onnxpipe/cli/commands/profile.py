"""The work of ``onnxpipe profile`` (parser: :mod:`onnxpipe.cli.profile`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.commands.common import profile_options
from onnxpipe.cli.commands.early import check_output_file
from onnxpipe.cli.commands.preamble import BusyWatch, Say, before_work
from onnxpipe.core.choices import Runtime, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.runtimes import DEFAULT_OPENVINO_DEVICE, EngineConfig
from onnxpipe.cost.profile import DEFAULT_RUNTIME
from onnxpipe.cost.runtime_profile import profile_on_runtime
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import parse_shape_overrides


def run(args: argparse.Namespace) -> int:
    say = Say()
    if args.out.exists() and not args.force:
        raise UsageError(f"{args.out}: exists; choose another --out or pass --force")
    check_output_file(args.out, "--out")
    overrides = parse_shape_overrides(args.shape)
    view = load_model(args.model)
    check_runtime_opsets(view)
    measured = args.cost == "profile"
    before_work(say, view, overrides, stages=None, threads=args.threads or 1)
    options = profile_options(args, progress=not args.quiet)
    watch = BusyWatch(say, "profiling") if measured else None
    if args.runtime != Runtime.ONNXRUNTIME.value or args.openvino_device != DEFAULT_OPENVINO_DEVICE:
        if args.cost != "profile":
            raise UsageError(f"--runtime {args.runtime} measures; leave out --cost {args.cost}")
        if args.runtime != Runtime.OPENVINO.value and args.openvino_device != DEFAULT_OPENVINO_DEVICE:
            raise UsageError(f"--openvino-device is for --runtime openvino, not {args.runtime}")
        config = EngineConfig(
            runtime=choice(Runtime, args.runtime, "runtime"),
            threads=args.threads or 1,
            openvino_device=args.openvino_device,
        )
        prof = profile_on_runtime(view, config, runs=args.runs, warmup=args.warmup, shapes=options.shapes)
    else:
        prof = api.get_profile(view, options)
    if watch is not None:
        watch.check()
    try:
        prof.save(args.out)
    except OSError as e:
        raise UsageError(f"{args.out}: cannot be written ({e.strerror or e}); choose another --out") from e
    on = "" if prof.runtime == DEFAULT_RUNTIME else f" on {prof.runtime}"
    print(
        f"profiled {len(prof.node_seconds)} nodes of {args.model.name}{on}: "
        f"{prof.total_seconds * 1e3:.3f} ms per run ({prof.source}, {prof.threads} thread(s)); "
        f"saved {args.out}"
    )
    if prof.inputs:
        shown = ", ".join(
            f"{r.file} ({r.samples} sample{'s' if r.samples != 1 else ''})" for r in prof.inputs
        )
        print(f"  inputs: {shown}")
    for note in prof.unattributed[:10]:
        print(f"  note: {note}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    say.done("profiled")
    return 0
