"""The work of ``onnxpipe plan`` (parser: :mod:`onnxpipe.cli.plan`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.commands.common import plan_request, profile_options
from onnxpipe.cli.commands.early import check_plot
from onnxpipe.cli.commands.jsonout import document, plan_obj
from onnxpipe.cli.commands.preamble import BusyWatch, Say, plan_preamble
from onnxpipe.cli.tables import (
    format_plan_table,
    format_stage_counts,
)
from onnxpipe.core.choices import Phase
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.planning.draw import draw_plan


def run(args: argparse.Namespace) -> int:
    say = Say(json_output=args.json)
    if args.plot is not None:
        check_plot(args.plot)
    request = plan_request(args)
    parse_shape_overrides(args.shape)  # refused before the model is loaded
    view = load_model(args.model)
    request.check()
    request.check_stage_count(len(view.compute_nodes), view.label)
    measured = args.profile is None and args.cost == "profile"
    if measured:
        check_runtime_opsets(view)  # before the preamble: a refusal prints nothing else
    plan_preamble(say, view, args, request)
    watch = BusyWatch(say, "profiling") if measured else None
    options = profile_options(args, saved=args.profile, progress=not args.quiet)
    phases = api.decoder_profiles(view, request, options)  # a decoder's phases; else one profile
    prof = phases.get(Phase.DECODE) or phases.get(Phase.PREFILL) or api.get_profile(view, options)
    if watch is not None:
        watch.check()
    plan = api.plan(view, prof, request, phase_profiles=phases)
    if args.json:
        print(document("plan", plan=plan_obj(plan)))
    else:
        tried = format_stage_counts(plan)
        if tried is not None:
            print(tried)
        print(format_plan_table(plan))
        for note in plan.notes:
            print(f"  note: {note}")
    if args.plot is not None:
        path = draw_plan(plan, args.plot, title=args.model.name)
        say.line(f"drew {path}")
    say.done("planned")
    return 0
