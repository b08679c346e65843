"""Generation as a layer over the pipeline: a decoder's split driven step by step through its IO contract.

:mod:`.feeds` builds a step's feeds role by role, :mod:`.scheduler` schedules and batches the steps,
:mod:`.result` holds what a generation made, and :mod:`.generator` reads the split's contract (what each
model input and output is) and ties them to a pipeline (:class:`.generator.Generator`).
"""
