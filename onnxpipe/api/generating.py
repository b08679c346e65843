"""``generate``: tokens through a decoder's split, each worker keeping its layers' KV cache; optionally the
same prompts through the unsplit model and K replicas of it, side by side."""

from __future__ import annotations

from pathlib import Path

from onnxpipe.api.results import GenerateResult
from onnxpipe.core.errors import UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.options import opt
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generate import Generation
from onnxpipe.runtime.options import GenerateOptions
from onnxpipe.runtime.pipeline import Pipeline


def generate(
    folder: str | Path, options: GenerateOptions, *, listener: Listener | None = None
) -> GenerateResult:
    """The new tokens of each of ``options.prompt_ids`` through the split in ``folder``; with
    ``options.compare`` also through the unsplit model (one worker, its whole cache) and as many replicas
    of it as the split has workers, whose tokens must be the same (:attr:`GenerateResult.same`)."""
    say = listener or SILENT
    options.check()
    if not options.prompt_ids:
        raise UsageError(f"{opt('prompt_ids')}: give at least one prompt's token ids")
    config = LocalConfig(mode=options.local_mode)
    pipe = Pipeline.from_manifest(folder, config, threads=options.threads, generation=True)
    k = len(pipe.lanes[0])
    plan = pipe.manifest.plan if pipe.manifest is not None else None
    workers = (plan.workers if plan is not None else None) or k  # interleaved: fewer workers than stages
    say.step(f"generating {len(options.prompt_ids)} sequence(s) through {k} stage(s) ({config.mode})")
    runs: dict[str, Generation] = {"pipeline": _through(pipe, options)}
    if options.compare:
        say.step("generating with the unsplit model (one worker, its whole cache)")
        one = Pipeline.generating_replicas(folder, 1, config, threads=options.threads, model=options.model)
        runs["unsplit"] = _through(one, options)
        if workers > 1:
            say.step(f"generating with {workers} replicas of the unsplit model")
            many = Pipeline.generating_replicas(
                folder, workers, config, threads=options.threads, model=options.model
            )
            runs["replicas"] = _through(many, options)
    return GenerateResult(
        prompts=options.prompt_ids, runs=runs, sampling=options.sampling, stages=k, workers=workers
    )


def _through(pipe: Pipeline, options: GenerateOptions) -> Generation:
    with pipe:
        return pipe.generate(
            options.prompt_ids,
            options.max_new_tokens,
            eos_token_ids=options.eos_token_ids,
            in_flight=options.in_flight,
            sampling=options.sampling,
        )
