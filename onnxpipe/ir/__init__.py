"""The model as the rest of onnxpipe sees it: a typed, read-only view of the graph, and questions on it.

:mod:`.model` loads a model (external weights stay on disk) into a :class:`~.model.ModelView`;
:mod:`.graph` orders its nodes and says what crosses a cut; :mod:`.shapes` turns symbolic dims into
sizes (the one rule every step uses) and :mod:`.static` settles every tensor's shape at those sizes
(ONNX's inference, then onnxruntime's symbolic one, :mod:`.symbolic`), or freezes them into the model;
:mod:`.feeds` makes seeded random inputs; :mod:`.shapevalues` finds the tensors a stage makes itself
rather than receives, and those that provably hold one value; :mod:`.external` reads weights kept in
external files.  Imports ``core`` only.
"""
