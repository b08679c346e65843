"""Real transformer architectures exported to ONNX by torch, with random weights (nothing is downloaded).

    python tools/export_transformers.py --out DIR      # write every model below into DIR

- ``gpt2_tiny``: ``GPT2LMHeadModel`` (4 layers, 128 wide, 4 heads, vocab 1000), ``input_ids`` [batch, seq]
  -> ``logits`` [batch, seq, vocab], no past key values.
- ``gpt2_small``: the same at GPT-2 small's size (12 layers, 768 wide, 12 heads, vocab 50257, 1024
  positions; about 500 MB): benchmarks only, exported on first use into the cache, never committed.
- ``bert_tiny``: ``BertModel`` (4 layers, 128 wide, 4 heads), ``input_ids`` and ``attention_mask``
  [batch, seq] -> ``last_hidden_state`` [batch, seq, 128] and ``pooler_output`` [batch, 128].
- ``bert_mini``: the same 256 wide (feed-forward 1024), the size of Google's BERT-Mini without its
  30k-word vocabulary (benchmarks only; the tests use the tiny models).
- ``minilm_l6``: ``BertModel`` at MiniLM-L6-H384's size (6 layers, 384 wide, 12 heads, feed-forward
  1536, the 30522-word vocabulary; about 90 MB): exported on first use into the cache and left out of
  :func:`export_all`; the model issue 31 was seen on (its mask and shape arithmetic are BERT's).
- ``gpt2_tiny_mask``: ``gpt2_tiny`` that also takes ``attention_mask`` [batch, seq], as exporters for
  serving give it: the mask's ``Shape`` feeds the causal mask's arithmetic.

Each comes from two exporters: the TorchScript one (``dynamo=False``, opset 17, one self-contained file) and
the ``torch.export`` one (``dynamo=True``, the exporter's default opset, ``external_data=True``: the large
weights live in ``<file>.onnx.data`` next to the model, so copy or move both files together).

Exports are cached in the corpus cache (``tools/corpus.py``: ``$ONNXPIPE_CORPUS_CACHE`` or
``<repo>/.cache/corpus``) under ``transformers/<name>-<key>/``, where the key hashes the configuration and the
versions of torch, transformers, onnxscript and onnx. A cache hit imports neither torch nor transformers.

Two things the exporters need with transformers 5 (found the hard way):
- the model is called with an explicit all-ones ``attention_mask`` when the ONNX model has none as input:
  without one, transformers' mask code checks ``position_ids`` for packed sequences with ``torch.diff``,
  which the TorchScript exporter cannot translate (``aten::diff``);
- the dynamo exporter takes ``dynamic_shapes`` with ``torch.export.Dim`` objects (``dynamic_axes`` is only
  for the TorchScript exporter).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    from tools.corpus import build_once, cache_dir
except ModuleNotFoundError:  # run as a script: python tools/export_transformers.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.corpus import build_once, cache_dir

if TYPE_CHECKING:
    import torch

EXPORT_REVISION = 1  # bump to invalidate every cached export after changing how models are built
TORCHSCRIPT_OPSET = 17
SEED = 0
BENCHMARK_ONLY = ("gpt2_small", "minilm_l6")
"""Too big to copy around with the others (:func:`export_all` leaves them out): the benchmarks and tests that
need them export them into the cache."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    config: dict[str, Any]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # output dimensions that follow the inputs' batch (0) and sequence (1) dimensions
    output_axes: dict[str, dict[int, str]] = field(default_factory=dict)

    @property
    def max_seq(self) -> int:
        return int(self.config.get("n_positions") or self.config["max_position_embeddings"])


_GPT2_OUT = {"logits": {0: "batch", 1: "seq"}}
_BERT_OUT = {"last_hidden_state": {0: "batch", 1: "seq"}, "pooler_output": {0: "batch"}}


def _gpt2_spec(name: str, inputs: tuple[str, ...], **config: Any) -> ModelSpec:
    """A GPT-2 of ``config`` (no cache: one pass over the tokens) giving ``logits`` from ``inputs``."""
    return ModelSpec(name, {**config, "use_cache": False}, inputs, ("logits",), _GPT2_OUT)


def _bert_spec(name: str, **config: Any) -> ModelSpec:
    """A BERT of ``config`` in Hugging Face's layout: tokens and a mask in, both outputs out."""
    return ModelSpec(
        name, config, ("input_ids", "attention_mask"), ("last_hidden_state", "pooler_output"), _BERT_OUT
    )


_TINY_GPT2 = {"vocab_size": 1000, "n_positions": 128, "n_embd": 128, "n_layer": 4, "n_head": 4}

SPECS: dict[str, ModelSpec] = {
    "gpt2_tiny": _gpt2_spec("gpt2_tiny", ("input_ids",), **_TINY_GPT2, bos_token_id=0, eos_token_id=0),
    "gpt2_small": _gpt2_spec(
        "gpt2_small",
        ("input_ids",),
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        bos_token_id=50256,
        eos_token_id=50256,
    ),
    "bert_tiny": _bert_spec(
        "bert_tiny",
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
    ),
    "bert_mini": _bert_spec(
        "bert_mini",
        vocab_size=1000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=128,
    ),
    "minilm_l6": _bert_spec(
        "minilm_l6",
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    ),
    "gpt2_tiny_mask": _gpt2_spec(
        "gpt2_tiny_mask", ("input_ids", "attention_mask"), **_TINY_GPT2, bos_token_id=0, eos_token_id=0
    ),
}


# ------------------------------------------------------------------------------------------ torch side


def build_torch_model(name: str) -> torch.nn.Module:
    """The eval-mode torch module that is exported as ``name``: same weights on every call (seeded)."""
    import torch

    spec = SPECS[name]
    torch.manual_seed(SEED)
    if name.startswith("gpt2_"):
        return _gpt2(spec).eval()  # eval() reaches the wrapped model too
    if name in ("bert_tiny", "bert_mini", "minilm_l6"):
        return _bert(spec).eval()
    raise ValueError(f"unknown model {name!r}; there are {', '.join(SPECS)}")


def _gpt2(spec: ModelSpec) -> torch.nn.Module:
    """GPT-2's logits; from ``input_ids`` alone (an all-ones mask made inside) or with ``attention_mask``."""
    import torch
    import transformers

    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(**spec.config))

    class Gpt2Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = lm

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)  # see the module docstring: avoids aten::diff
            return self.logits(input_ids, mask)

        def logits(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.model(input_ids=input_ids, attention_mask=mask, use_cache=False)[0]
            return out

    class Gpt2MaskedLogits(Gpt2Logits):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return self.logits(input_ids, attention_mask)

    return Gpt2MaskedLogits() if "attention_mask" in spec.input_names else Gpt2Logits()


def _bert(spec: ModelSpec) -> torch.nn.Module:
    """BERT's last hidden state and pooled output."""
    import torch
    import transformers

    bert = transformers.BertModel(transformers.BertConfig(**spec.config))

    class BertOutputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bert

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]

    return BertOutputs()


def example_inputs(name: str, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Random int64 feeds for ``name``; BERT's last row is padded (mask zero) over its last quarter."""
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, spec.config["vocab_size"], (batch, seq), dtype=np.int64)}
    if "attention_mask" in spec.input_names:
        mask = np.ones((batch, seq), dtype=np.int64)
        if batch > 1 and seq > 3:
            mask[-1, seq - seq // 4 :] = 0
        feeds["attention_mask"] = mask
    return feeds


def torch_outputs(
    name: str, feeds: dict[str, np.ndarray], model: torch.nn.Module | None = None
) -> list[np.ndarray]:
    """What the torch model computes for ``feeds`` (the reference an export must match)."""
    import torch

    model = model if model is not None else build_torch_model(name)
    args = tuple(torch.from_numpy(feeds[n]) for n in SPECS[name].input_names)
    with torch.no_grad():
        out = model(*args)
    outs = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in outs]


def export(name: str, path: Path, dynamo: bool) -> Path:
    """Export ``name`` to ``path`` (and ``path``.data when ``dynamo``) without caching; return ``path``."""
    import torch

    spec = SPECS[name]
    model = build_torch_model(name)
    feeds = example_inputs(name)
    args = tuple(torch.from_numpy(feeds[n]) for n in spec.input_names)
    # "torchvision is not installed" notices from the dynamo exporter's op registry
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings and the TorchScript exporter's deprecation notice
        if dynamo:
            batch = torch.export.Dim("batch")
            seq = torch.export.Dim("seq", max=spec.max_seq)
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=True,
                external_data=True,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                dynamic_shapes={n: {0: batch, 1: seq} for n in spec.input_names},
                verbose=False,
            )
        else:
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=False,
                opset_version=TORCHSCRIPT_OPSET,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in spec.input_names}, **spec.output_axes},
            )
    return path


# ------------------------------------------------------------------------------------------------ cache


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def cache_key(name: str, dynamo: bool) -> str:
    """Hash of everything that shapes the exported file."""
    parts = {
        "revision": EXPORT_REVISION,
        "name": name,
        "config": SPECS[name].config,
        "dynamo": dynamo,
        "opset": None if dynamo else TORCHSCRIPT_OPSET,
        "versions": {d: _version(d) for d in ("torch", "transformers", "onnx", "onnxscript")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def file_stem(name: str, dynamo: bool) -> str:
    return f"{name}_dynamo" if dynamo else name


def cached_export(name: str, dynamo: bool) -> Path:
    """The cached export of ``name``, made now if missing; concurrent callers are safe."""
    stem = file_stem(name, dynamo)

    def make(tmp: Path) -> Path:
        export(name, tmp / f"{stem}.onnx", dynamo)
        return tmp

    final = cache_dir() / "transformers" / f"{stem}-{cache_key(name, dynamo)}"
    return build_once(final, f"{stem}.onnx", make) / f"{stem}.onnx"


def gpt2_tiny(dynamo: bool = False) -> Path:
    """A 4-layer GPT-2 LM: ``input_ids`` [batch, seq] -> ``logits`` [batch, seq, 1000]."""
    return cached_export("gpt2_tiny", dynamo)


def gpt2_small(dynamo: bool = False) -> Path:
    """GPT-2 small's architecture with random weights: ``input_ids`` [batch, seq] -> ``logits``
    [batch, seq, 50257] (benchmarks only: about 500 MB, exported into the cache on first use)."""
    return cached_export("gpt2_small", dynamo)


def bert_tiny(dynamo: bool = False) -> Path:
    """A 4-layer BERT: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``, ``pooler_output``."""
    return cached_export("bert_tiny", dynamo)


def bert_mini(dynamo: bool = False) -> Path:
    """A 4-layer, 256-wide BERT, same inputs and outputs as :func:`bert_tiny`."""
    return cached_export("bert_mini", dynamo)


def minilm_l6(dynamo: bool = False) -> Path:
    """MiniLM-L6-H384's architecture with random weights, same inputs and outputs as :func:`bert_tiny`
    (about 90 MB: exported into the cache on first use, left out of :func:`export_all`)."""
    return cached_export("minilm_l6", dynamo)


def gpt2_tiny_mask(dynamo: bool = False) -> Path:
    """:func:`gpt2_tiny` with an ``attention_mask`` input: ``input_ids``, ``attention_mask`` -> ``logits``."""
    return cached_export("gpt2_tiny_mask", dynamo)


def model_files(path: Path) -> list[Path]:
    """``path`` and its external-data file, if it has one."""
    data = path.with_name(path.name + ".data")
    return [path, data] if data.is_file() else [path]


def export_all(out: Path) -> list[Path]:
    """Copy every export (from the cache, exporting what is missing) into ``out``; return the models."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (n for n in SPECS if n not in BENCHMARK_ONLY):
        for dynamo in (False, True):
            src = cached_export(name, dynamo)
            for f in model_files(src):
                shutil.copyfile(f, out / f.name)  # the .data file keeps its name: the model refers to it
            written.append(out / src.name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export tiny GPT-2 and BERT models to ONNX.")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the models into")
    args = parser.parse_args(argv)
    for path in export_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
