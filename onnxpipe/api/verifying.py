"""``verify``: the chained stages of a split folder against the model, the result recorded in the folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxpipe.manifest import MANIFEST_NAME
from onnxpipe.verification.options import VerifyOptions
from onnxpipe.verification.verify import VerifyReport, record_verification, verify_folder


def verify(folder: str | Path, options: VerifyOptions | None = None) -> VerifyReport:
    """Run the original model and the chained stages of ``folder`` on the same inputs and compare them.

    With ``options.runtime`` running every stage on one other runtime, the whole model runs there too,
    and :attr:`VerifyReport.on_runtime` holds the stages against it and it against onnxruntime: an output
    passes when its stages match either, and :attr:`VerifyReport.notes` give the runtime's own
    difference.  A mismatch is not an exception: :attr:`VerifyReport.ok` says it.  With
    ``options.record`` (the default) the result is written into the folder's manifest; a folder that
    cannot be written keeps what it said, and :attr:`VerifyReport.record_note` says why.
    """
    opts = options or VerifyOptions()
    report = verify_folder(folder, opts)
    if not opts.record:
        return report
    try:
        record_verification(folder, report)
    except OSError as e:
        note = (
            f"{folder}: the result could not be written into its manifest ({e.strerror or e}); "
            "the folder still reads as it did"
        )
        return dataclasses.replace(report, record_note=note)
    return dataclasses.replace(report, recorded_in=Path(folder) / MANIFEST_NAME)
