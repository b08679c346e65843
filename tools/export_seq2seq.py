"""A Whisper-shaped encoder-decoder, exported to ONNX by torch's dynamo exporter in the folder layout
optimum writes for it, with random weights (no download); or by the TorchScript exporter optimum itself
uses (``dynamo=False``), whose decoders read the cross cache's batch off the decoder's own hidden states.

    python tools/export_seq2seq.py --out DIR      # write the tiny Whisper folder into DIR/whisper_tiny
    python tools/export_seq2seq.py --out DIR --torchscript   # into DIR/whisper_tiny_torchscript
    python tools/export_seq2seq.py --out DIR --t5   # the tiny T5 folder (:func:`export_t5`) into DIR/t5_tiny

The three are committed in ``sample_models/seq2seq/`` (``--out sample_models/seq2seq``, each line once), so
that the tests export nothing; the same seed makes the same files.

The folder holds, with optimum's file and tensor names:

- ``encoder_model.onnx``: ``input_features`` [batch, mel bins, frames] -> ``last_hidden_state``
  [batch, frames / 2, d_model];
- ``decoder_model.onnx`` (the first step): ``input_ids`` [batch, seq], ``encoder_hidden_states`` ->
  ``logits``, ``present.N.decoder.key/value`` (the self-attention cache) and ``present.N.encoder.key/value``
  (the cross-attention cache, made from the encoder's output);
- ``decoder_with_past_model.onnx`` (the later steps): ``input_ids``, ``past_key_values.N.decoder.key/value``,
  ``past_key_values.N.encoder.key/value`` -> ``logits``, ``present.N.decoder.key/value``;
- ``config.json`` and ``generation_config.json`` (``decoder_start_token_id``, ``eos_token_id``);
- ``decoder_model_merged.onnx`` (:func:`merged`), the two decoders under one ``If`` on ``use_cache_branch``
  as optimum merges them, the with-past branch giving the cross-attention outputs it does not make as
  empty tensors; :func:`merged_only` copies the folder with that file in place of the two decoders.

Like optimum's Whisper export, the decoders take no attention mask: positions follow the cache's length.

:func:`export_t5` (``--t5``) writes a tiny random-weight T5 in optimum's T5 (and Marian) layout: the
encoder takes ``input_ids`` and ``attention_mask``, both decoders ``encoder_attention_mask`` after
``input_ids``; the start token is the pad id 0, the end id 1; :func:`t5_greedy` is its plain loop.
The sizes are tiny (d_model 32, 2 encoder and 3 decoder layers, 8 mel bins, 32 frames) so that the
committed files stay a few hundred KB each and tests take seconds.  :func:`cached_export` (the
benchmarks') caches an export in the corpus cache under ``seq2seq/<name>-<key>/`` (the TorchScript one's
name ending ``_torchscript``), keyed by the configuration and the versions of torch, transformers, onnx and
onnxscript.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    from tools.corpus import build_once, cache_dir
    from tools.export_decoders import INIT_RANGE, SEED, _version, merge_decoders, strip_metadata
except ModuleNotFoundError:  # run as a script: python tools/export_seq2seq.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.corpus import build_once, cache_dir
    from tools.export_decoders import INIT_RANGE, SEED, _version, merge_decoders, strip_metadata

EXPORT_REVISION = 3  # bump to invalidate every cached export after changing how the folder is built
NAME = "whisper_tiny"
CONFIG: dict[str, Any] = {
    "vocab_size": 96,
    "num_mel_bins": 8,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_source_positions": 16,
    "max_target_positions": 64,
    "decoder_start_token_id": 90,
    "eos_token_id": 91,
    "bos_token_id": 91,
    "pad_token_id": 91,
    "suppress_tokens": [],
    "begin_suppress_tokens": [],
    "init_std": INIT_RANGE,
}
FRAMES = 2 * int(CONFIG["max_source_positions"])
"""The encoder's input length: Whisper's two strided convolutions halve it to ``max_source_positions``."""
ENCODER, DECODER, WITH_PAST = "encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"
MERGED = "decoder_model_merged.onnx"


def _whisper() -> Any:
    import torch
    import transformers

    torch.manual_seed(SEED)
    model = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**CONFIG, attn_implementation="eager")
    )
    return model.eval()


def features(batch: int = 1, seed: int = 0) -> np.ndarray:
    """Random encoder inputs, ``input_features`` [batch, mel bins, frames]."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, int(CONFIG["num_mel_bins"]), FRAMES)).astype(np.float32)


def _cache(rest: Sequence[Any], n: int, past: bool) -> Any:
    """The with-past decoder's flat pasts (``rest``: per layer self key, value, cross key, value) as
    transformers' cache of ``n`` layers; an empty one for the first step."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    selfs, cross = DynamicCache(), DynamicCache()
    if past:
        for i in range(n):
            selfs.update(rest[4 * i], rest[4 * i + 1], i)
            cross.update(rest[4 * i + 2], rest[4 * i + 3], i)
    return EncoderDecoderCache(selfs, cross)


def _presents(cache: Any, n: int, past: bool) -> list[Any]:
    """The presents in optimum's order: per layer the self key and value, and at the first step (no
    ``past``) the cross key and value the step made."""
    flat: list[Any] = []
    for i in range(n):
        layers = [cache.self_attention_cache.layers[i]]
        if not past:
            layers.append(cache.cross_attention_cache.layers[i])
        flat += [t for layer in layers for t in (layer.keys, layer.values)]
    return flat


def _modules() -> tuple[Any, Any, Any]:
    """The encoder, the first-step decoder and the with-past decoder as flat-tensor modules."""
    import torch

    whisper = _whisper()
    n = int(CONFIG["decoder_layers"])

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = whisper.model.encoder

        def forward(self, input_features: torch.Tensor) -> Any:
            return self.encoder(input_features=input_features).last_hidden_state

    class Decoder(torch.nn.Module):
        def __init__(self, past: bool) -> None:
            super().__init__()
            self.whisper = whisper
            self.past = past

        def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> Any:
            cache = _cache(rest, n, self.past)
            # with a past the cross cache is reused: the encoder's output is only checked for presence
            encoded = torch.zeros(input_ids.shape[0], 1, int(CONFIG["d_model"])) if self.past else rest[0]
            out = self.whisper.model.decoder(
                input_ids=input_ids, encoder_hidden_states=encoded, cache=cache, use_cache=True
            )
            return (self.whisper.proj_out(out.last_hidden_state), *_presents(cache, n, self.past))

    return Encoder().eval(), Decoder(False).eval(), Decoder(True).eval()


def _names(past: bool, n: int = int(CONFIG["decoder_layers"])) -> tuple[list[str], list[str]]:
    """The input and output names of the first-step (``past=False``) or the with-past decoder of ``n``
    layers."""
    kinds = [("decoder", "key"), ("decoder", "value"), ("encoder", "key"), ("encoder", "value")]
    present = [f"present.{i}.{a}.{k}" for i in range(n) for a, k in kinds if not past or a == "decoder"]
    if not past:
        return ["input_ids", "encoder_hidden_states"], ["logits", *present]
    return ["input_ids", *(f"past_key_values.{i}.{a}.{k}" for i in range(n) for a, k in kinds)], [
        "logits",
        *present,
    ]


def _axes(name: str) -> dict[int, str]:
    """The dynamic dims of tensor ``name`` for the TorchScript exporter, named as optimum names them."""
    if name in ("input_features", "last_hidden_state"):
        return {0: "batch"}
    if name in ("input_ids", "logits"):
        return {0: "batch", 1: "sequence_length"}
    if name == "encoder_hidden_states" or ".encoder." in name:
        return {0: "batch", 1 if name == "encoder_hidden_states" else 2: "encoder_sequence_length"}
    return {0: "batch", 2: "past_sequence_length" if name.startswith("past") else "total_sequence_length"}


def _export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    names: tuple[list[str], list[str]],
    shapes: Any,
    dynamo: bool,
) -> None:
    """Export ``module`` to ``path`` by the dynamo exporter (``shapes`` its dynamic shapes), or by the
    TorchScript one optimum uses (its dynamic axes by :func:`_axes`), keeping only the nodes' module
    scopes."""
    import onnx
    import torch

    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    tmp = path.with_suffix(".raw.onnx")
    how: dict[str, Any] = (
        {"dynamo": True, "external_data": False, "dynamic_shapes": shapes}
        if dynamo
        else {
            "dynamo": False,
            "opset_version": 17,
            "dynamic_axes": {t: _axes(t) for t in [*names[0], *names[1]]},
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(tmp), input_names=names[0], output_names=names[1], verbose=False, **how
        )
    proto = onnx.load(str(tmp))
    tmp.unlink()
    strip_metadata(proto)
    onnx.save(proto, str(path))


def export(out: Path, dynamo: bool = True) -> Path:
    """Write the Whisper-shaped folder into ``out`` (made if missing) without caching; return ``out``.
    ``dynamo=False`` exports by the TorchScript exporter, as optimum does: its decoders take the cross
    cache's batch from ``Shape`` of the decoder's own hidden states, not of the encoder's output."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    encoder, first, with_past = _modules()
    n, heads = int(CONFIG["decoder_layers"]), int(CONFIG["decoder_attention_heads"])
    head = int(CONFIG["d_model"]) // heads
    batch, seq, past = (
        torch.export.Dim("batch"),
        torch.export.Dim("sequence_length"),
        torch.export.Dim("past"),
    )
    feats = torch.from_numpy(features(2))
    _export(
        encoder, (feats,), out / ENCODER, (["input_features"], ["last_hidden_state"]), ({0: batch},), dynamo
    )
    with torch.no_grad():
        encoded = encoder(feats)
    ids = torch.tensor([[int(CONFIG["decoder_start_token_id"]), 3, 5]] * 2)
    encoder_length = torch.export.Dim("encoder_sequence_length")
    _export(
        first,
        (ids, encoded),
        out / DECODER,
        _names(False),
        ({0: batch, 1: seq}, ({0: batch, 1: encoder_length},)),
        dynamo,
    )
    rng = np.random.default_rng(1)
    frames = encoded.shape[1]
    cache = []
    for _ in range(n):
        for length in (3, 3, frames, frames):
            cache.append(torch.from_numpy(rng.standard_normal((2, heads, length, head)).astype(np.float32)))
    kv_shapes = tuple({0: batch, 2: past} if j % 4 < 2 else {0: batch} for j in range(4 * n))
    _export(
        with_past,
        (ids[:, :1], *cache),
        out / WITH_PAST,
        _names(True),
        ({0: batch, 1: seq}, kv_shapes),
        dynamo,
    )
    config = {**_whisper().config.to_dict(), "architectures": ["WhisperForConditionalGeneration"]}
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    generation = {
        "decoder_start_token_id": CONFIG["decoder_start_token_id"],
        "eos_token_id": CONFIG["eos_token_id"],
        "pad_token_id": CONFIG["pad_token_id"],
        "max_length": CONFIG["max_target_positions"],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    merged(out)
    return out


def merged(folder: Path) -> Path:
    """Write ``decoder_model_merged.onnx`` into ``folder`` from its two decoders: the with-past decoder's
    outputs in the no-past one's order, each it does not make (the cross-attention cache) an empty
    float tensor, then :func:`~tools.export_decoders.merge_decoders`."""
    import onnx
    from onnx import helper

    first, later = onnx.load(str(folder / DECODER)), onnx.load(str(folder / WITH_PAST))
    made = {o.name: o for o in later.graph.output}
    outputs = []
    for o in first.graph.output:
        if o.name not in made:
            empty = helper.make_tensor(f"{o.name}_empty", onnx.TensorProto.FLOAT, [0], [])
            later.graph.node.append(helper.make_node("Constant", [], [o.name], value=empty))
        outputs.append(made.get(o.name, o))
    del later.graph.output[:]
    later.graph.output.extend(outputs)
    onnx.save(merge_decoders(first, later), str(folder / MERGED))
    return folder / MERGED


def merged_only(folder: Path, out: Path) -> Path:
    """A copy of ``folder`` in ``out`` with ``decoder_model_merged.onnx`` in place of the two decoders."""
    out.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name not in (DECODER, WITH_PAST):
            shutil.copy(path, out / path.name)
    return out


def folder_name(dynamo: bool) -> str:
    """The folder's name: :data:`NAME`, ending ``_torchscript`` for the TorchScript export."""
    return NAME if dynamo else f"{NAME}_torchscript"


def cache_key(config: dict[str, Any] = CONFIG) -> str:
    parts = {
        "revision": EXPORT_REVISION,
        "config": config,
        "versions": {d: _version(d) for d in ("torch", "transformers", "onnx", "onnxscript")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def cached_export(dynamo: bool = True) -> Path:
    """The cached Whisper-shaped folder (exported by TorchScript with ``dynamo=False``, in a folder of
    its own), made now if missing; concurrent callers are safe."""
    return _cached(folder_name(dynamo), cache_key(), lambda out: export(out, dynamo))


def _cached(name: str, key: str, make: Callable[[Path], Path]) -> Path:
    """``seq2seq/<name>-<key>`` in the corpus cache, written by ``make`` where missing (concurrent callers
    are safe: :func:`tools.corpus.build_once`)."""
    return build_once(cache_dir() / "seq2seq" / f"{name}-{key}", "generation_config.json", make)


def greedy(folder: Path, feats: np.ndarray, max_new_tokens: int = 16) -> list[list[int]]:
    """A plain onnxruntime greedy loop over the folder's unsplit files, each row of ``feats`` alone:
    the tokens a split must reproduce (the start token first, then the new ones up to an end id)."""
    import onnxruntime as ort

    config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    start, eos = int(config["decoder_start_token_id"]), int(config["eos_token_id"])
    enc, first, later = (ort.InferenceSession(str(folder / f)) for f in (ENCODER, DECODER, WITH_PAST))
    made: list[list[int]] = []
    for row in feats:
        (encoded,) = enc.run(None, {"input_features": row[None]})
        names = [o.name for o in first.get_outputs()]
        feeds = {"input_ids": np.array([[start]]), "encoder_hidden_states": encoded}
        outs = dict(zip(names, first.run(None, feeds), strict=True))
        tokens: list[int] = []
        while len(tokens) < max_new_tokens:
            token = int(np.argmax(outs["logits"][0, -1]))
            tokens.append(token)
            if token == eos:
                break
            feeds = {"input_ids": np.array([[token]])}
            feeds |= {n.replace("present", "past_key_values"): v for n, v in outs.items() if n != "logits"}
            step = dict(zip([o.name for o in later.get_outputs()], later.run(None, feeds), strict=True))
            outs |= step
        made.append(tokens)
    return made


# ------------------------------------------------------------------------------ a T5-shaped folder

T5_NAME = "t5_tiny"
T5_CONFIG: dict[str, Any] = {
    "vocab_size": 64,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "initializer_factor": 10.0,  # T5's own scale (1.0) repeats one token from the first step on
}
"""A tiny T5: like optimum's T5 (and Marian) exports, its encoder takes ``input_ids`` and
``attention_mask``, its decoders ``encoder_attention_mask`` besides (the encoder's mask, every step)."""


def _t5() -> Any:
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.T5Config(**T5_CONFIG, attn_implementation="eager")
    return transformers.T5ForConditionalGeneration(config).eval()


def source_ids(batch: int = 1, length: int = 7, seed: int = 0) -> np.ndarray:
    """Random encoder token ids [batch, length], none of them the pad or end id."""
    rng = np.random.default_rng(seed)
    return rng.integers(2, int(T5_CONFIG["vocab_size"]), (batch, length)).astype(np.int64)


def _t5_modules() -> tuple[Any, Any, Any]:
    """The T5 encoder, first-step decoder and with-past decoder as flat-tensor modules."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    t5 = _t5()
    n = int(T5_CONFIG["num_decoder_layers"])

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = t5.encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Decoder(torch.nn.Module):
        def __init__(self, past: bool) -> None:
            super().__init__()
            self.t5 = t5
            self.past = past

        def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, *rest: torch.Tensor) -> Any:
            cache = _cache(rest, n, self.past)
            d_model = int(T5_CONFIG["d_model"])
            encoded = torch.zeros(mask.shape[0], mask.shape[1], d_model) if self.past else rest[0]
            out = self.t5(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
                attention_mask=mask,
                decoder_input_ids=input_ids,
                cache=cache,
                use_cache=True,
            )
            return (out.logits, *_presents(cache, n, self.past))

    return Encoder().eval(), Decoder(False).eval(), Decoder(True).eval()


def export_t5(out: Path) -> Path:
    """Write the T5-shaped folder into ``out`` (made if missing) without caching; return ``out``."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    encoder, first, with_past = _t5_modules()
    n, heads, head = (int(T5_CONFIG[k]) for k in ("num_decoder_layers", "num_heads", "d_kv"))
    batch, seq, past, frames = (torch.export.Dim(d) for d in ("batch", "seq", "past", "frames"))
    ids = torch.from_numpy(source_ids(2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    _export(
        encoder,
        (ids, mask),
        out / ENCODER,
        (["input_ids", "attention_mask"], ["last_hidden_state"]),
        ({0: batch, 1: frames}, {0: batch, 1: frames}),
        True,
    )
    with torch.no_grad():
        encoded = encoder(ids, mask)
    start = torch.tensor([[0, 3, 5]] * 2)
    names = _names(False, n)
    _export(
        first,
        (start, mask, encoded),
        out / DECODER,
        ([names[0][0], "encoder_attention_mask", *names[0][1:]], names[1]),
        ({0: batch, 1: seq}, {0: batch, 1: frames}, ({0: batch, 1: frames},)),
        True,
    )
    rng = np.random.default_rng(1)
    cache = [
        torch.from_numpy(rng.standard_normal((2, heads, length, head)).astype(np.float32))
        for _ in range(n)
        for length in (3, 3, 7, 7)
    ]
    names = _names(True, n)
    kv_shapes = tuple({0: batch, 2: past} if j % 4 < 2 else {0: batch, 2: frames} for j in range(4 * n))
    _export(
        with_past,
        (start[:, :1], mask, *cache),
        out / WITH_PAST,
        ([names[0][0], "encoder_attention_mask", *names[0][1:]], names[1]),
        ({0: batch, 1: seq}, {0: batch, 1: frames}, kv_shapes),
        True,
    )
    config = {**_t5().config.to_dict(), "architectures": ["T5ForConditionalGeneration"]}
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    generation = {k: T5_CONFIG[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    return out


def t5_greedy(
    folder: Path, ids: np.ndarray, mask: np.ndarray | None, max_new_tokens: int = 16
) -> list[list[int]]:
    """A plain onnxruntime greedy loop over the T5 folder's unsplit files, each row alone (its mask
    ones where ``mask`` is ``None``): the new tokens up to the end id."""
    import onnxruntime as ort

    enc, first, later = (ort.InferenceSession(str(folder / f)) for f in (ENCODER, DECODER, WITH_PAST))
    made: list[list[int]] = []
    for i, row in enumerate(ids):
        row_mask = np.ones_like(row[None]) if mask is None else mask[i : i + 1]
        (encoded,) = enc.run(None, {"input_ids": row[None], "attention_mask": row_mask})
        feeds = {"input_ids": np.array([[int(T5_CONFIG["decoder_start_token_id"])]])}
        feeds |= {"encoder_attention_mask": row_mask, "encoder_hidden_states": encoded}
        outs = dict(zip([o.name for o in first.get_outputs()], first.run(None, feeds), strict=True))
        tokens: list[int] = []
        while len(tokens) < max_new_tokens:
            tokens.append(int(np.argmax(outs["logits"][0, -1])))
            if tokens[-1] == int(T5_CONFIG["eos_token_id"]):
                break
            feeds = {"input_ids": np.array([[tokens[-1]]]), "encoder_attention_mask": row_mask}
            feeds |= {n.replace("present", "past_key_values"): v for n, v in outs.items() if n != "logits"}
            outs |= dict(zip([o.name for o in later.get_outputs()], later.run(None, feeds), strict=True))
        made.append(tokens)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model folder into")
    parser.add_argument("--torchscript", action="store_true", help="export by TorchScript, as optimum does")
    parser.add_argument("--t5", action="store_true", help="write the tiny T5 folder (DIR/t5_tiny) instead")
    args = parser.parse_args(argv)
    if args.t5:
        print(export_t5(args.out / T5_NAME))
        return 0
    print(export(args.out / folder_name(not args.torchscript), dynamo=not args.torchscript))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
