"""The package's version, where the facade and the CLI both read it without loading anything else."""

__version__ = "0.1.0"
