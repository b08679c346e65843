"""Calibration: time the exported stages on this machine, correct the profile by what was measured, and
partition again until the cut settles.

:mod:`.timing` times a plan's stages (alone, or as a pinned pipeline) and the whole model;
:mod:`.loop` runs the rounds.  It sits above export and the runtime, since it exports and runs stages;
the correction itself is :func:`onnxpipe.cost.profile.corrected`, plain arithmetic on a profile.
"""
