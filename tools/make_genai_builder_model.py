"""Make a decoder with ONNX Runtime GenAI's own model builder, offline: the format GenAI users have.

    python tools/make_genai_builder_model.py OUT_DIR

writes ``OUT_DIR/model.onnx`` (+ ``model.onnx.data``), ``genai_config.json`` and the tokenizer files, as
``python -m onnxruntime_genai.models.builder`` makes them from a Hugging Face model folder.  The folder it
builds from is made here, with no hub: a random-weight Llama with grouped-query attention (initializer
range 0.08, as ``tools/export_decoders.py``: at 0.02 greedy decoding repeats one token) and a word-level
tokenizer of ``w0 .. w127``.  The builder's CPU model uses onnxruntime's ``GroupQueryAttention`` (which
needs a head size that is a multiple of 16 on the CPU), ``SkipSimplifiedLayerNormalization`` and
``SimplifiedLayerNormalization`` in the default domain, external weights, a cache shared between past and
present (``past_present_share_buffer``) and a head size named ``kv_cache_dim`` in the past tensors.

Needs ``torch``, ``transformers`` and ``onnxruntime-genai`` (the test extra).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB = 128
CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "initializer_range": 0.08,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
SEED = 0


def make_hf_folder(folder: Path) -> None:
    """A Hugging Face model folder (weights, config, tokenizer) of :data:`CONFIG`, random weights."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(SEED)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w2"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="w0", eos_token="w1", unk_token="w2"
    )
    tokenizer.save_pretrained(folder)


def build(out: Path) -> None:
    """The builder's fp32 CPU model of :data:`CONFIG` in ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        make_hf_folder(hf)
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
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(Path(tmp) / "cache"),
        ]
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    build(args.out)
    print(f"wrote {args.out}/model.onnx and genai_config.json")


if __name__ == "__main__":
    main()
