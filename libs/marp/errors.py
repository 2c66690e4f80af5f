"""Errors raised by MARP for bad input.

Every error names the offending input field (``field``) so the services can turn
it into an INVALID_ARGUMENT that points at the exact field of the request. The
message says what is wrong and, where useful, how to fix it.
"""

from __future__ import annotations

from typing import Any


class MarpError(ValueError):
    """Base class: bad input to MARP. ``field`` is e.g. "recipe.seq_len" or "layout.tp"."""

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" To fix: {fix}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        # ValueError pickles through self.args (the formatted text), which would not
        # match this constructor; Celery and multiprocessing pickle exceptions.
        return (type(self), (self.field, self.problem, self.fix))


class UnknownModelError(MarpError):
    """The model reference is neither a catalog name, nor a config file, nor inline JSON."""


class ModelConfigError(MarpError):
    """A model config (HF config.json or Frenzy's neutral spec) is malformed or unsupported."""


class UnknownGpuError(MarpError):
    """The GPU type is not in the catalog."""


class InvalidRecipeError(MarpError):
    """A training recipe field is out of range or inconsistent."""


class InvalidLayoutError(MarpError):
    """A parallel layout is malformed or does not fit the model / recipe."""


__all__ = [
    "InvalidLayoutError",
    "InvalidRecipeError",
    "MarpError",
    "ModelConfigError",
    "UnknownGpuError",
    "UnknownModelError",
]
