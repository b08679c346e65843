"""The work of ``onnxpipe generate`` (parser: :mod:`onnxpipe.cli.generate`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from onnxpipe.cli.commands.jsonout import document
from onnxpipe.cli.commands.preamble import Say
from onnxpipe.core.errors import UsageError
from onnxpipe.manifest.write import num
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generate import Generation
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.sampling import Sampling


def run(args: argparse.Namespace) -> int:
    say = Say(json_output=args.json)
    config = LocalConfig(mode=args.local_mode)
    prompts = [list(p) for p in args.prompt_ids]
    eos = tuple(args.eos_token_id)
    sampling = _sampling(args)

    def through(pipe: Pipeline) -> Generation:
        with pipe:
            return pipe.generate(
                prompts, args.max_new_tokens, eos_token_ids=eos, in_flight=args.in_flight, sampling=sampling
            )

    pipe = Pipeline.from_manifest(args.dir, config, threads=args.threads, generation=True)
    k = len(pipe.lanes[0])
    plan = pipe.manifest.plan if pipe.manifest is not None else None
    workers = (plan.workers if plan is not None else None) or k  # interleaved: fewer workers than stages
    say.step(f"generating {len(prompts)} sequence(s) through {k} stage(s) ({config.mode})")
    split = through(pipe)
    runs: dict[str, Generation] = {"pipeline": split}
    if args.compare:
        say.step("generating with the unsplit model (one worker, its whole cache)")
        runs["unsplit"] = through(
            Pipeline.generating_replicas(args.dir, 1, config, threads=args.threads, model=args.model)
        )
        if workers > 1:
            say.step(f"generating with {workers} replicas of the unsplit model")
            runs["replicas"] = through(
                Pipeline.generating_replicas(
                    args.dir, workers, config, threads=args.threads, model=args.model
                )
            )
    same = all(g.tokens == split.tokens for g in runs.values())
    if args.json:
        sequences = [list(t) for t in split.tokens]
        drawn = None if sampling is None else dataclasses.asdict(sampling)
        print(document("generate", sequences=sequences, runs=_runs_obj(runs), same=same, sampling=drawn))
    else:
        for i, (prompt, tokens) in enumerate(zip(prompts, split.tokens, strict=True)):
            shown = " ".join(str(t) for t in tokens)
            print(f"sequence {i}: {len(prompt)} prompt token(s) -> {len(tokens)} new: {shown}")
        on = f" on {workers} workers" if workers != k else ""
        labels = {
            "pipeline": f"{k}-stage pipeline{on}",
            "unsplit": "unsplit model",
            "replicas": f"{workers} replicas",
        }
        for name, g in runs.items():
            rate = f"{g.tokens_per_second:.1f} tokens/s"
            line = f"{labels[name]}: {g.new_tokens} tokens in {g.seconds:.3f} s, {rate}"
            if name != "pipeline" and g.tokens_per_second > 0:
                line += f" (the pipeline makes {split.tokens_per_second / g.tokens_per_second:.2f}x as many)"
            print(line)
        if args.compare:
            print(
                "tokens: the same as the unsplit model's"
                if same
                else "tokens: DIFFERENT from the unsplit model's: the split does not compute what it does"
                if sampling is None
                else "tokens: DIFFERENT from the unsplit model's: logits that differ within rounding can "
                "change a draw and every token after it; compare greedy tokens (leave out --do-sample)"
            )
    say.done("generated")
    return 0 if same else 1


def _sampling(args: argparse.Namespace) -> Sampling | None:
    """The sampling asked for, or None (greedy); a sampling knob without ``--do-sample`` is refused."""
    knobs = {
        "--temperature": args.temperature,
        "--top-k": args.top_k,
        "--top-p": args.top_p,
        "--seed": args.seed,
    }
    if not args.do_sample:
        given = [name for name, value in knobs.items() if value is not None]
        if given:
            raise UsageError(
                f"{given[0]} is for sampling: add --do-sample, or leave it out for greedy tokens"
            )
        return None
    return Sampling(
        temperature=1.0 if args.temperature is None else args.temperature,
        top_k=args.top_k or 0,
        top_p=1.0 if args.top_p is None else args.top_p,
        seed=args.seed or 0,
    )


def _runs_obj(runs: dict[str, Generation]) -> dict[str, Any]:
    return {
        name: {
            "new_tokens": g.new_tokens,
            "seconds": num(g.seconds),
            "tokens_per_second": num(g.tokens_per_second),
            "steps": g.steps,
            "same_tokens": g.tokens == runs["pipeline"].tokens,
        }
        for name, g in runs.items()
    }
