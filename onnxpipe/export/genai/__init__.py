"""``genai_config.json``: the split folder as an ONNX Runtime GenAI ``decoder-pipeline``.

ONNX Runtime GenAI runs a decoder LLM split into several ONNX files when its config says
``"type": "decoder-pipeline"`` and lists the files under ``model.decoder.pipeline``, in order, each with
the tensors it takes and makes.  GenAI itself owns the *managed* tensors (token ids, attention mask,
position ids, each layer's past and present key and value, the logits): it feeds each file those of
them its ``inputs`` name and takes those its ``outputs`` name; every other output goes into a store
from which any later file's input of that name is fed.  So a split folder runs in GenAI as it is when:

* each layer's past and present key and value lie in one stage (GenAI feeds a file the cache of the
  layers it lists; ``--layer-cuts on`` guarantees it, and the stages take only their own layers' past);
* the cache names follow one ``%d`` template per role (``past_key_values.%d.key``...), as GenAI finds
  layer ``i``'s tensors by formatting a template, and key and value are separate tensors;
* the model takes nothing GenAI cannot make (ids, mask, positions and the cache only).

The dims GenAI sizes its buffers with come from the graph (head size and key/value heads from the past
tensors' shapes, the vocabulary from the logits, the hidden size from the embedding table), the
context from the plan's ``--max-context`` (and the model's position table, when it has one); what the
graph cannot tell (token ids, sampling defaults) comes from the user's own config when one is given
(``split --genai-config FILE``: a GenAI ``genai_config.json`` or a Hugging Face ``config.json``), else
from documented defaults.  A config given that contradicts the graph (another layer count, head size,
vocabulary) belongs to another model and is refused.

The data model is typed (:mod:`.config`: :class:`GenAIConfig` and its parts); JSON appears only at the
edges (:func:`onnxpipe.core.model_config.read_source_config` reads, :meth:`GenAIConfig.to_json`
writes).  Top to bottom:
:mod:`.config` the model, :mod:`.graph` what the graph says (and a ``--genai-config`` that contradicts
it), :mod:`.write` the stages as GenAI's pipeline and the whole config put together (written by
:mod:`onnxpipe.export.model_files`).
"""
