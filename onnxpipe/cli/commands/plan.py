"""The work of ``onnxpipe plan`` (parser: :mod:`onnxpipe.cli.plan`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.cli.commands.common import plan_request, profile_options
from onnxpipe.cli.tables import (
    format_plan_table,
)
from onnxpipe.ir.decoder_kinds import Phase
from onnxpipe.ir.load import load_model
from onnxpipe.plan.draw import draw_plan


def run(args: argparse.Namespace) -> int:
    request = plan_request(args)
    view = load_model(args.model)
    options = profile_options(args, saved=args.profile, progress=sys.stderr.isatty())
    phases = api.decoder_profiles(view, request, options)  # a decoder's phases; else one profile
    prof = phases.get(Phase.DECODE) or phases.get(Phase.PREFILL) or api.get_profile(view, options)
    plan = api.plan(view, prof, request, phase_profiles=phases)
    print(format_plan_table(plan))
    for note in plan.notes:
        print(f"  note: {note}")
    if args.plot is not None:
        path = draw_plan(plan, args.plot, title=args.model.name)
        print(f"drew {path}")
    return 0
