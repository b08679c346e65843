"""The one door: a function per subcommand, each taking its model or folder and one frozen options object,
and returning a typed result (whose ``to_json()`` is what the command's ``--json`` prints).

===================  ========================  =============================================
function             options                   returns
===================  ========================  =============================================
``profile``          :class:`ProfileOptions`   :class:`~onnxpipe.cost.profile.Profile`
``plan``             :class:`PlanOptions`      :class:`PlanResult`
``split``            :class:`SplitOptions`     :class:`SplitResult`
``verify``           :class:`VerifyOptions`    :class:`~onnxpipe.verification.verify.VerifyReport`
``inspect``          :class:`InspectOptions`   :class:`FolderInspection` or :class:`ModelInspection`
``run``              :class:`RunOptions`       :class:`~onnxpipe.runtime.report.model.RunReport`
``generate``         :class:`GenerateOptions`  :class:`GenerateResult`
``links``            :class:`LinkOptions`      :class:`~onnxpipe.runtime.report.links.LinkReport`
``export_triton``    :class:`TritonOptions`    :class:`~onnxpipe.export.triton.TritonRepository`
===================  ========================  =============================================

::

    split("model.onnx", SplitOptions(out="stages/", plan=PlanRequest(3)))
    report = run("stages/", RunOptions(compare=True))

Every options object checks itself once, when it is made, so that none exists unchecked; an error
names the option to change as its field (``force``, ``SplitOptions.force``; :mod:`onnxpipe.core.options`).
A long request takes a ``listener`` (:class:`~onnxpipe.core.events.Listener`) that is told each step,
the lines before the work and the warnings; without one it is silent.  The options and the choices they
take are imported at once (they are light, :mod:`onnxpipe.api.options`); the functions and results on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxpipe.api import options as _options
from onnxpipe.api.options import *  # noqa: F403 (the options and their choices, listed once there)
from onnxpipe.core.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "profile": "onnxpipe.api.plans",
    "plan": "onnxpipe.api.plans",
    "split": "onnxpipe.api.splitting",
    "verify": "onnxpipe.api.splitting",
    "inspect": "onnxpipe.api.inspecting",
    "run": "onnxpipe.api.running",
    "generate": "onnxpipe.api.generating",
    "links": "onnxpipe.api.linking",
    "LinkReport": "onnxpipe.runtime.report.links",
    "format_links": "onnxpipe.runtime.report.links",
    "export_triton": "onnxpipe.export.triton",
    "written_stages": "onnxpipe.api.seq2seq",
    "FolderInspection": "onnxpipe.api.results",
    "GenerateResult": "onnxpipe.api.results",
    "Generation": "onnxpipe.runtime.generation.result",
    "GenerationCluster": "onnxpipe.runtime.report.cluster",
    "ModelInspection": "onnxpipe.api.results",
    "PlanResult": "onnxpipe.api.results",
    "SplitResult": "onnxpipe.api.results",
    "verify_json": "onnxpipe.api.results",
    "run_json": "onnxpipe.api.results",
    "format_report": "onnxpipe.runtime.report.text",
    "Manifest": "onnxpipe.manifest",
    "ModelView": "onnxpipe.ir.model",
    "Plan": "onnxpipe.planning.types",
    "Profile": "onnxpipe.cost.profile",
    "RunReport": "onnxpipe.runtime.report.model",
    "TritonRepository": "onnxpipe.export.triton",
    "VerifyReport": "onnxpipe.verification.verify",
    "DecoderInfo": "onnxpipe.ir.decoder",
    "ModelSummary": "onnxpipe.ir.load",
    "worker_groups": "onnxpipe.schedule.timeline",
}

__all__ = sorted([*_EXPORTS, *_options.__all__])

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

if TYPE_CHECKING:
    from onnxpipe.api.generating import generate as generate
    from onnxpipe.api.inspecting import inspect as inspect
    from onnxpipe.api.linking import links as links
    from onnxpipe.api.plans import plan as plan
    from onnxpipe.api.plans import profile as profile
    from onnxpipe.api.results import FolderInspection as FolderInspection
    from onnxpipe.api.results import GenerateResult as GenerateResult
    from onnxpipe.api.results import ModelInspection as ModelInspection
    from onnxpipe.api.results import PlanResult as PlanResult
    from onnxpipe.api.results import SplitResult as SplitResult
    from onnxpipe.api.results import run_json as run_json
    from onnxpipe.api.results import verify_json as verify_json
    from onnxpipe.api.running import run as run
    from onnxpipe.api.seq2seq import written_stages as written_stages
    from onnxpipe.api.splitting import split as split
    from onnxpipe.api.splitting import verify as verify
    from onnxpipe.cost.profile import Profile as Profile
    from onnxpipe.export.triton import TritonRepository as TritonRepository
    from onnxpipe.export.triton import export_triton as export_triton
    from onnxpipe.ir.decoder import DecoderInfo as DecoderInfo
    from onnxpipe.ir.load import ModelSummary as ModelSummary
    from onnxpipe.ir.model import ModelView as ModelView
    from onnxpipe.manifest import Manifest as Manifest
    from onnxpipe.planning.types import Plan as Plan
    from onnxpipe.runtime.generation.result import Generation as Generation
    from onnxpipe.runtime.report.cluster import GenerationCluster as GenerationCluster
    from onnxpipe.runtime.report.links import LinkReport as LinkReport
    from onnxpipe.runtime.report.links import format_links as format_links
    from onnxpipe.runtime.report.model import RunReport as RunReport
    from onnxpipe.runtime.report.text import format_report as format_report
    from onnxpipe.schedule.timeline import worker_groups as worker_groups
    from onnxpipe.verification.verify import VerifyReport as VerifyReport
