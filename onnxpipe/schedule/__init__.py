"""Pipeline schedules on plain numbers: the timeline of a schedule (:mod:`.timeline`) and its simulation
(:mod:`.simulate`) for streaming inference and the GPipe and 1F1B training schedules.  Imports ``core``
only: nothing here knows a model or a device.
"""
