"""Writing a verification's result into the split folder's manifest (``verification``).

A folder that looks complete but was never compared with the model is the worst kind of wrong: ``split``
verifies its stages in the temporary folder it writes them to and records the result here before that
folder replaces the output folder, so that only a folder never verified (``--no-verify``) is marked
unverified and an interrupted verification (Ctrl-C) replaces nothing; ``onnxpipe verify`` records its
own result the same way, which completes such a folder without ``--force``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxpipe.manifest import MANIFEST_NAME, load_manifest, write_manifest
from onnxpipe.manifest.entries import VerificationRecord
from onnxpipe.verification.verify import VerifyReport


def verification_record(report: VerifyReport) -> VerificationRecord:
    """The manifest's record of ``report``: passed or failed, and how."""
    return VerificationRecord(
        status="passed" if report.ok else "failed",
        rtol=report.rtol,
        atol=report.atol,
        seed=report.seed,
        runs=report.runs,
        input_shapes={k: tuple(int(d) for d in v) for k, v in report.input_shapes.items()},
    )


def record_verification(directory: str | Path, report: VerifyReport) -> None:
    """Write ``report``'s result into ``directory``'s manifest (atomically).  Raises ``OSError`` when the
    folder cannot be written; the caller says what that means for it."""
    d = Path(directory)
    manifest = load_manifest(d, check_files=False)
    write_manifest(d / MANIFEST_NAME, dataclasses.replace(manifest, verification=verification_record(report)))
