"""How a link's transfer time counts against a stage: the two link models, named so that a plan says
which it used.

``serial``: a stage receives its inputs, then computes; its time is compute + transfer in (one core
does both, or the link blocks it).  ``overlap``: links move the next micro-batch while the stage
computes the current one; its time is the larger of the two.  Plans without a devices file used to add
(serial) and plans with one to overlap, with nothing saying so; the same 1 Gbit/s link then gave two
cuts.  Both stay (a CPU pipeline whose workers copy their own inputs is serial; devices with their own
network engines overlap), chosen by ``--link-model`` and recorded in the plan and the manifest.
"""

from __future__ import annotations

from onnxpipe.core.choices import LinkModel

DEFAULT_LINK_MODEL = LinkModel.SERIAL
"""Without a devices file: the stages are this machine's workers, which receive their own inputs."""
DEVICES_LINK_MODEL = LinkModel.OVERLAP
"""With a devices file (or a training schedule): links run beside compute."""
