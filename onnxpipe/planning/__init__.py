"""From costs to a plan: which nodes each stage holds, on which device, under which schedule.

:mod:`.types` holds the result (:class:`~.types.Plan`, :class:`~.types.StageSpec`); :mod:`.sequences`
turns the model and its profile into the plain numbers :mod:`onnxpipe.partition` solves on (and keeps
onnxruntime's fused groups whole while that costs little);
:mod:`.stages` turns the solved bounds back into named stages; :mod:`.planner` plans identical workers
(one stage each, or interleaved), :mod:`.cluster` plans a cluster of devices and what a stage must hold
on each (with :mod:`.orders` for device orders and stage counts and :mod:`.request` for the schedule
asked for); :mod:`.nodesplit` may cut the one node that holds a plan back into parts over consecutive stages
(finding, cutting, timing the parts and planning with them, top to bottom); :mod:`.draw` draws a plan.
Imports ``core``, ``ir``, ``cost``, ``partition``, ``schedule``, ``cluster``.
"""
