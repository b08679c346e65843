"""What the parsed arguments become, for the commands that share them: options objects and requests.

Apart from :mod:`onnxpipe.cli.arguments` (the parsers) because building them loads the model code.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cost.source import ProfileOptions
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.request import PlanRequest, ScheduleRequest


def schedule_request(args: argparse.Namespace) -> ScheduleRequest:
    return ScheduleRequest(
        kind=args.schedule,
        microbatches=args.microbatches,
        batch=args.batch,
        backward_ratio=args.backward_ratio,
    )


def profile_options(
    args: argparse.Namespace, *, saved: Path | None = None, progress: bool = False
) -> ProfileOptions:
    """The measurement options as a :class:`ProfileOptions` (``saved``: a profile file to reuse instead)."""
    return ProfileOptions(
        cost=args.cost,
        saved=saved,
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        shapes=parse_shape_overrides(args.shape),
        progress=progress,
        input_files=tuple(args.inputs),
        stacked_files=tuple(args.inputs_stacked),
    )


def plan_request(args: argparse.Namespace) -> PlanRequest:
    """The planning options as a :class:`PlanRequest`, the devices file read (and refused) first."""
    return PlanRequest(
        args.stages,
        devices=load_cluster(args.devices) if args.devices is not None else None,
        bandwidth_bytes_per_s=args.bandwidth,
        order=args.order,
        schedule=schedule_request(args),
        workers=args.workers,
        time_slack=args.time_slack,
        split_nodes=args.split_nodes,
        link_model=args.link_model,
        decoder=DecoderOptions(
            layer_cuts=args.layer_cuts == "on",
            ends=args.ends,
            max_context=args.max_context,
            phase=args.phase,
            prefill_tokens=args.prefill_tokens,
            decode_past=args.decode_past,
        ),
    )
