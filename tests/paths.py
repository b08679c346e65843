"""Where the tests find the repository's files, whichever lane (``unit``, ``integration``, ``e2e``) they
are in."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_MODELS = REPO_ROOT / "sample_models"
SEQ2SEQ = SAMPLE_MODELS / "seq2seq"
"""The committed encoder-decoder folders of ``tools/export_seq2seq.py`` (Whisper, TorchScript Whisper, T5)."""
EXAMPLES = REPO_ROOT / "examples"
DEVICES = EXAMPLES / "devices"
DATA = Path(__file__).resolve().parent / "data"
