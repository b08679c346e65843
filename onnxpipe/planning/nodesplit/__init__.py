"""Cutting one node that holds a plan back into parts over consecutive stages (``split_nodes="auto"``).

A contiguous pipeline can never beat its largest node; GPT-2's LM head or an early Conv of a CNN can be a
quarter of the whole time.  Such a node is cut into ``p`` ordinary ONNX nodes that each compute a slice of
its output, so that the planner can put them in consecutive stages.  The feature reads top to bottom:

* :mod:`.find`: which nodes can be cut, by which kinds of cut, with which nodes carried along, and the
  weights' values, which the cut slices;
* :mod:`.cut`: the model with one node cut into parts and a join, and what the parts and the join cost
  (timed side by side, or by their share);
* :mod:`.plan`: the plan that may cut a node, solved by :mod:`onnxpipe.partition.splitting` on plain
  numbers and kept only when it beats the best contiguous plan.

It lives in the planning room because planning is its only user and the lowest room that sees all it
needs: the model (``ir``), the costs (``cost``), the partitioner (``partition``) and the planner.
``docs/node-splitting.md`` describes it for users.
"""
