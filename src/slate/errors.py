"""User-facing error types.

Every error that a user can cause with bad input (a file, a flag, a value) is raised as a
subclass of :class:`SlateError`. The CLI catches exactly these and prints their message as one
paragraph with a non-zero exit code, never a traceback.
"""

from __future__ import annotations


class SlateError(Exception):
    """Base class of every error caused by the user's input; its message is shown as is."""


class DataError(SlateError):
    """A data file or dataset is missing, malformed, or unusable for the requested run."""


class TopologyError(SlateError):
    """A mixing matrix is invalid (not square, not doubly stochastic, disconnected, ...)."""


class ConfigError(SlateError):
    """A flag or configuration value is out of range or inconsistent with the others."""


class TrainingDiverged(SlateError):
    """A loss or parameter became non-finite during training."""


class RunInterrupted(SlateError):
    """The run was stopped by SIGINT or SIGTERM after writing a checkpoint (exit code 130)."""
