"""Errors raised while building a Task from user pieces (at construction, never mid-run).

Every one is a `TaskError`, a ValueError (so the command line prints it as one
line and exits 2); the model-kind error is also a TypeError.
"""

from __future__ import annotations

__all__ = ["TaskError", "ModelKindError", "MutableStateError", "LossError", "LabelShapeError", "DataError",
           "FactoryError"]


class TaskError(ValueError):
    """A task cannot be built from what was given; the message says what to change."""


class ModelKindError(TaskError, TypeError):
    """The model is not of the kind expected there (linen vs nnx, class vs instance, not flax)."""


class MutableStateError(TaskError):
    """The model keeps mutable state besides its parameters (BatchNorm statistics, caches)."""


class LossError(TaskError):
    """An unknown loss name, or a loss that does not return a scalar (or per-example values)."""


class LabelShapeError(TaskError):
    """Labels (targets) of the wrong shape or dtype for the loss and the model's outputs."""


class DataError(TaskError):
    """Data arrays that do not fit together (leading lengths, missing fields, empty)."""


class FactoryError(TaskError):
    """A task name that cannot be resolved: no such module or attribute, or a factory
    that does not return a Task."""
