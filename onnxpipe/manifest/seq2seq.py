"""``seq2seq.json``: what the split of an encoder-decoder folder records beside its two splits.

An encoder-decoder folder (:mod:`onnxpipe.ir.seq2seq`) is split as two chains of stages: the encoder's
(``encoder/``, run once per sequence) and its one-graph decoder's (``decoder/``, run per token, each
worker keeping its layers' self- and cross-attention caches), each a split folder with its own manifest.
This record joins them for ``generate``: which folder is which, the encoder's inputs and the output the
decoder takes, and the tokens each sequence starts and ends with.  The folder also holds the decoder's
step graph (:data:`STEP_FILE`, the model the decoder's split was made from: a second copy of the decoder's
weights, kept so that the decoder's manifest names an existing source) and the config, generation and
tokenizer files copied from the source folder (:attr:`Seq2SeqRecord.files`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.codec import Codec
from onnxpipe.core.errors import ManifestError
from onnxpipe.core.jsonread import Document

SEQ2SEQ_FILE = "seq2seq.json"
STEP_FILE = "decoder_step_model.onnx"
"""The decoder's one step graph (:func:`onnxpipe.ir.seq2seq.step_decoder`), its weights in
``decoder_step_model.onnx.data`` beside it where they pass protobuf's 2 GB."""


@dataclass(frozen=True)
class Seq2SeqRecord:
    """The two splits of an encoder-decoder and what generating through them needs."""

    encoder: str
    """The encoder's split folder, inside the record's folder."""
    decoder: str
    """The one-graph decoder's split folder."""
    encoder_inputs: tuple[str, ...]
    """What ``generate --inputs`` must hold (Whisper's ``input_features``)."""
    encoder_output: str
    """The encoder output the decoder takes as its ``encoder_output`` role."""
    start_ids: tuple[int, ...]
    """The tokens each sequence starts with (``decoder_start_token_id``, then any forced ones)."""
    eos_ids: tuple[int, ...]
    balance: str
    """How the stages were dealt between the encoder and the decoder, in words."""
    source: str
    """The folder split (``generate --compare`` runs its unsplit files)."""
    files: tuple[str, ...] = ()
    """The config, generation and tokenizer files the split copied from :attr:`source`."""

    def written(self) -> frozenset[str]:
        """The names the split wrote into the record's folder (what ``--force`` may replace there)."""
        return frozenset(
            {SEQ2SEQ_FILE, STEP_FILE, f"{STEP_FILE}.data", self.encoder, self.decoder, *self.files}
        )


def write_seq2seq(folder: Path, record: Seq2SeqRecord) -> None:
    text = json.dumps(Codec().encode(Seq2SeqRecord, record), indent=2)
    (folder / SEQ2SEQ_FILE).write_text(text + "\n", encoding="utf-8")


def read_seq2seq(folder: Path) -> Seq2SeqRecord | None:
    """The record of the split in ``folder``, ``None`` where it is no encoder-decoder's."""
    path = folder / SEQ2SEQ_FILE
    if not path.is_file():
        return None
    doc = Document(str(path), ManifestError, "re-run onnxpipe split on the encoder-decoder folder")
    read = doc.read(doc.load(path))
    record: Seq2SeqRecord = Codec().decode(Seq2SeqRecord, read)
    return record
