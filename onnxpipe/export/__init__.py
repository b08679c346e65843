"""From a plan to a split folder: one valid ONNX file per stage, its weights, and ``manifest.json``.

:mod:`.stages` writes a plan's stages in one pass over the loaded model (:func:`.stages.export_stages`),
each built by :mod:`.build`, its boundary tensors typed by :mod:`.boundary`, its weights copied into its
own file by :mod:`.weightfile`, the folder made atomically by :mod:`.outdir`; :mod:`.checks` refuses
what cannot be exported before anything is written; :mod:`.record` makes the manifest of what was
written (with the boundary contract); :mod:`.genai` writes a decoder's ``genai_config.json`` (ONNX Runtime
GenAI's ``decoder-pipeline``); :mod:`.triton` a Triton repository.  Imports ``core``, ``ir``, ``plan``,
``manifest`` and ``schedule``.
"""
