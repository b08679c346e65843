"""A decoder layer's KV cache tensors, by name: one record for the graph that has them and the manifest.

Kept on the ground floor because both sides need the same record: :mod:`onnxpipe.ir.decoder` finds the
pairs in the graph, and the manifest (``plan.decoder.io.kv[]``) keeps them for a generation loop, which
must not need onnx to read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVPair:
    """One layer's cache tensors: past key and value (stage inputs), present key and value (outputs of
    the stage holding the layer).

    A model that keeps key and value in one tensor per layer (``past.N``) has it as ``past_key`` and
    ``present_key``, with no value tensors.  ``cross``: an encoder-decoder layer's cross-attention cache
    (made once per sequence from the encoder's output, never grown by a token), its second pair.
    """

    layer: int
    past_key: str
    past_value: str | None
    present_key: str
    present_value: str | None
    cross: bool = False

    @property
    def pasts(self) -> tuple[str, ...]:
        return (self.past_key,) + ((self.past_value,) if self.past_value else ())

    @property
    def presents(self) -> tuple[str, ...]:
        return (self.present_key,) + ((self.present_value,) if self.present_value else ())
