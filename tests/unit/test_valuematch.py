"""Tests of onnxpipe.cost.valuematch's NCHWc read-back: blocked tensors of the optimized graph matched to the
original NCHW values whatever block width the machine's onnxruntime uses (8 with AVX2, 16 with AVX-512)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpipe.cost.anchors import value_candidates
from onnxpipe.cost.sketch import Print, Sketcher
from onnxpipe.cost.valuematch import _unblocked_prints


def _to_nchwc(nchw: np.ndarray, block: int) -> np.ndarray:
    """What onnxruntime's ReorderInput makes: channels padded with zeros to a multiple of ``block``, then
    ``[N, C/block, H, W, block]`` stored as ``[N, Cpadded, H, W]``."""
    n, c, h, w = nchw.shape
    padded = -(-c // block) * block
    full = np.zeros((n, padded, h, w), dtype=nchw.dtype)
    full[:, :c] = nchw
    return np.ascontiguousarray(np.moveaxis(full.reshape(n, padded // block, block, h, w), 2, -1)).reshape(
        n, padded, h, w
    )


class _Originals:
    """The original graph's prints, looked up as valuematch does."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.sketcher = Sketcher()
        self.prints: dict[str, Print] = {}
        for name, arr in tensors.items():
            p = self.sketcher.sketch(arr)
            assert p is not None
            self.prints[name] = p
        self.by_size: dict[int, list[tuple[float, str]]] = {}
        for name, p in self.prints.items():
            self.by_size.setdefault(p.size, []).append((p.norm, name))
        for lst in self.by_size.values():
            lst.sort()

    def wanted(self, size: int, norm: float) -> bool:
        return any(abs(n - norm) <= 1e-3 * norm for n, _ in self.by_size.get(size, []))

    def matches(self, p: Print) -> bool:
        return bool(value_candidates([p], self.prints, self.by_size, set(), set()))

    def read_back(self, arr: np.ndarray, blocks: list[int]) -> list[str]:
        prints = _unblocked_prints(arr, blocks, self.by_size, self.wanted, self.matches, self.sketcher)
        return value_candidates(prints, self.prints, self.by_size, set(), set())


@pytest.mark.parametrize("machine_block", [8, 16])
@pytest.mark.parametrize("channels", [64, 20])
def test_blocked_values_read_back_at_the_machine_block_width(machine_block: int, channels: int) -> None:
    """A wrong width only permutes the elements, keeping size and norm: it must not be taken for the
    machine's (it was, on AVX2, and ResNet-50 became a single fused region)."""
    rng = np.random.default_rng(channels)
    value = rng.standard_normal((1, channels, 7, 7)).astype(np.float32)
    originals = _Originals({"conv_out": value, "other": rng.standard_normal((1, channels, 7, 7))})
    blocks = [16, 8, 4] if machine_block == 8 else [8, 16, 4]  # the other width tried first
    assert originals.read_back(_to_nchwc(value, machine_block), blocks) == ["conv_out"]
    assert blocks[0] == machine_block
    # once learnt, the width is tried first for the next tensor
    second = rng.standard_normal((1, channels, 7, 7)).astype(np.float32)
    originals = _Originals({"next": second})
    assert originals.read_back(_to_nchwc(second, machine_block), blocks) == ["next"]
    assert blocks[0] == machine_block


def test_a_blocked_value_no_original_holds_gives_no_prints_and_keeps_the_order() -> None:
    """A fused intermediate (Conv before its fused Relu) matches nothing under any width."""
    rng = np.random.default_rng(1)
    original = rng.standard_normal((1, 32, 5, 5)).astype(np.float32)
    originals = _Originals({"relu_out": np.maximum(original, 0)})
    blocks = [8, 16, 4]
    assert originals.read_back(_to_nchwc(original, 8), blocks) == []
    assert blocks == [8, 16, 4]
