"""Make a decoder with ONNX Runtime GenAI's own model builder, offline: the format GenAI users have.

    python tools/make_genai_builder_model.py OUT_DIR [--family qwen2] [--precision int4] [--tied]

writes ``OUT_DIR/model.onnx`` (+ ``model.onnx.data``), ``genai_config.json`` and the tokenizer files, as
``python -m onnxruntime_genai.models.builder -p PRECISION -e cpu`` makes them from a Hugging Face model
folder.  The folder it builds from is made here, with no hub: a random-weight model of the family
(:data:`FAMILIES`: Llama, Qwen2, Phi-3, Mistral, Gemma) with grouped-query attention (initializer range
0.3: at transformers' 0.02, and for Gemma, Qwen2 and Phi-3 at the 0.08 of ``tools/export_decoders.py``,
greedy decoding repeats one token, and a test that a split decodes the same tokens proves little) and a
word-level tokenizer of ``<s> </s> <unk> w3 .. w159`` with a chat template.

What the builder writes, and what a splitter must read through:

- ``fp32``: ``GroupQueryAttention`` (which needs a head size that is a multiple of 16 on the CPU) with a
  packed q/k/v projection and ``RotaryEmbedding`` inside it, ``SkipSimplifiedLayerNormalization`` and
  ``SimplifiedLayerNormalization`` in the default domain, external weights, a cache shared between past and
  present (``past_present_share_buffer``) and a head size named ``kv_cache_dim`` in the past tensors;
- ``int4``: the same with every projection a ``MatMulNBits`` and, with tied embeddings, the embedding a
  ``GatherBlockQuantized`` of the LM head's own 4-bit table (``shared_embeddings``);
- ``fp16``: fp16 weights and cache (the builder makes it for GPUs; onnxruntime's CPU provider runs most of
  it, not GroupQueryAttention in fp16 on every build).

:func:`builder_model` caches each build in the corpus cache (``tools/corpus.py``) under
``genai_builder/<family>-<precision>[-tied]-<key>/``, keyed by the configuration and the versions of the
builder, torch and transformers: the tests build each once per machine, not once per session.

Needs ``torch``, ``transformers`` and ``onnxruntime-genai`` (the test extra).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

try:
    from tools.corpus import build_once, cache_dir
except ModuleNotFoundError:  # run as a script: python tools/make_genai_builder_model.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.corpus import build_once, cache_dir

BUILD_REVISION = 1  # bump to invalidate every cached build after changing how models are made
VOCAB = 160
SEED = 0
PRECISIONS = ("fp32", "int4", "fp16")
SPECIAL = ("<s>", "</s>", "<unk>")
"""The special tokens, ids 0, 1 and 2 (bos, eos, unk): no word starts with one (a special token is matched
anywhere in the text, so ``w1`` would take ``w17`` apart)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}w4{% else %}w5{% endif %} "
    "{{ message['content'] }} w3 {% endfor %}{% if add_generation_prompt %}w5 {% endif %}"
)
"""A chat template in the tokenizer's words (``w4`` opens a user's turn, ``w5`` the assistant's, ``w3``
ends one), so that a chat renders to known ids."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""The tokenizer files put beside the built model: the Hugging Face folder's own, a word-level tokenizer of
``SPECIAL`` and ``w3 .. w159`` split at whitespace.  (The builder re-saves the tokenizer through
transformers, which turns a Qwen2's into a byte-level BPE without merges: no word of it survives.)"""

BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "initializer_range": 0.3,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
"""Head size 16: the smallest GroupQueryAttention runs on the CPU.  No projection is as wide as the
vocabulary (q/k/v together 128, the MLP 192, Phi-3's gate and up together 384): the builder takes the first
``Linear`` with ``vocab_size`` outputs for the LM head, and one of 128 would make logits of layer 0."""


@dataclass(frozen=True)
class Family:
    """A model family as transformers makes it: its architecture and what its config adds to :data:`BASE`."""

    architecture: str
    config_class: str
    extra: tuple[tuple[str, Any], ...] = ()


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", "LlamaConfig"),
    "qwen2": Family("Qwen2ForCausalLM", "Qwen2Config", (("max_position_embeddings", 512),)),
    "phi3": Family(
        "Phi3ForCausalLM",
        "Phi3Config",
        (("original_max_position_embeddings", 1024), ("pad_token_id", 1), ("rope_scaling", None)),
    ),
    "mistral": Family("MistralForCausalLM", "MistralConfig", (("sliding_window", None),)),
    "gemma": Family("GemmaForCausalLM", "GemmaConfig", (("head_dim", 16), ("tie_word_embeddings", True))),
}


def config_of(family: str, tied: bool) -> dict[str, Any]:
    """The Hugging Face config of ``family`` (tied embeddings when asked, or when the family ties them)."""
    config = dict(BASE) | dict(FAMILIES[family].extra)
    if tied:
        config["tie_word_embeddings"] = True
    return config


def make_hf_folder(folder: Path, family: str = "llama", tied: bool = False) -> None:
    """A Hugging Face model folder (weights, config, tokenizer with a chat template) of ``family``."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    spec = FAMILIES[family]
    torch.manual_seed(SEED)
    config = getattr(transformers, spec.config_class)(**config_of(family, tied))
    getattr(transformers, spec.architecture)(config).save_pretrained(folder)
    vocab = {t: i for i, t in enumerate(SPECIAL)} | {f"w{i}": i for i in range(len(SPECIAL), VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL[2]))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    bos, eos, unk = SPECIAL
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=eos
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)


def build(
    out: Path, family: str = "llama", precision: str = "fp32", tied: bool = False, extra: tuple[str, ...] = ()
) -> None:
    """The builder's CPU model of ``family`` at ``precision`` in ``out`` (``extra``: more of its
    ``--extra_options``, ``key=value``)."""
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        make_hf_folder(hf, family, tied)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        command = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf),
            "-m",
            str(hf),
            "-o",
            str(out),
            "-p",
            precision,
            "-e",
            "cpu",
            "-c",
            str(Path(tmp) / "cache"),
        ]
        shared = tied or config_of(family, tied)["tie_word_embeddings"]
        options = [*(["shared_embeddings=true"] if shared else []), *extra]
        if options:
            command += ["--extra_options", *options]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"the builder failed on {family} {precision}: {tail[0]}")
        for name in TOKENIZER_FILES:
            if (hf / name).is_file():
                shutil.copyfile(hf / name, out / name)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def cache_key(family: str, precision: str, tied: bool) -> str:
    parts = {
        "revision": BUILD_REVISION,
        "family": family,
        "precision": precision,
        "config": config_of(family, tied),
        "chat": CHAT_TEMPLATE,
        "special": SPECIAL,
        "versions": {d: _version(d) for d in ("onnxruntime-genai", "torch", "transformers", "onnx")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def builder_model(family: str = "llama", precision: str = "fp32", tied: bool = False) -> Path:
    """The cached build's folder (``model.onnx``, ``genai_config.json``, tokenizer files), made now if
    missing; concurrent callers are safe (:func:`tools.corpus.build_once`)."""
    name = f"{family}-{precision}" + ("-tied" if tied else "")

    def make(tmp: Path) -> Path:
        build(tmp / "model", family, precision, tied)
        return tmp / "model"

    final = cache_dir() / "genai_builder" / f"{name}-{cache_key(family, precision, tied)}"
    return build_once(final, "model.onnx", make)


def exclude_embeds_build(out: Path, family: str = "llama") -> Path:
    """``out`` holding the builder's fp32 text model of ``family`` with ``exclude_embeds=true`` (it takes
    ``inputs_embeds``, as a vision-language model's text part) and its embedding model
    ``embedding.onnx`` (token ids in, ``inputs_embeds`` out: a Gather on the same weights' table), named
    in ``genai_config.json`` as ``model.embedding`` is in GenAI's vision-language configs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    build(out, family, "fp32", extra=("exclude_embeds=true",))
    with tempfile.TemporaryDirectory() as tmp:
        make_hf_folder(Path(tmp), family)  # the same seeded weights the build was made of
        table = load_file(str(Path(tmp) / "model.safetensors"))["model.embed_tokens.weight"]
    gather = helper.make_node("Gather", ["embed_tokens", "input_ids"], ["inputs_embeds"], name="/model/embed")
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    embeds = helper.make_tensor_value_info(
        "inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", table.shape[1]]
    )
    graph = helper.make_graph(
        [gather], "embedding", [ids], [embeds], [numpy_helper.from_array(table, "embed_tokens")]
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(out / "embedding.onnx")
    )
    config = json.loads((out / "genai_config.json").read_text())
    section = {"filename": "embedding.onnx", "inputs": {"input_ids": "input_ids"}}
    config["model"]["embedding"] = {**section, "outputs": {"inputs_embeds": "inputs_embeds"}}
    (out / "genai_config.json").write_text(json.dumps(config, indent=4))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--tied", action="store_true", help="tie the LM head to the embedding")
    args = parser.parse_args()
    build(args.out, args.family, args.precision, args.tied)
    print(f"wrote {args.out}/model.onnx and genai_config.json")


if __name__ == "__main__":
    main()
