"""The machines a pipeline runs on: devices in pipeline order, the links between them, and each one's costs.

Plain numbers for the planner (speeds, memory, bandwidths, latencies): :mod:`.model` describes a
cluster, :mod:`.devicesfile` reads one from JSON, :mod:`.costs` gives every node a cost on every
device.  Imports ``core`` only.
"""
