"""Errors raised by MARP for bad input.

Every error names the offending input field (``field``) so the services can turn
it into an INVALID_ARGUMENT that points at the exact field of the request. The
message says what is wrong and, where useful, how to fix it.
"""

from __future__ import annotations

from typing import Any


class MarpError(ValueError):
    """Base class: bad input to MARP. ``field`` is e.g. "recipe.seq_len" or "layout.tp".

    Two call forms, the text always starting with the field:
    ``MarpError("recipe.seq_len", "must be > 0.", "use ...")`` (field, problem, optional fix),
    and ``MarpError("recipe.seq_len: must be > 0.", field="recipe.seq_len")`` (a ready message).
    """

    def __init__(self, *args: str, field: str | None = None, fix: str | None = None) -> None:
        if field is not None:
            if len(args) != 1:
                raise TypeError("MarpError(message, field=...) takes exactly one message")
            message = args[0]
            problem = message.removeprefix(f"{field}:").strip()
            text = message if message.startswith(field) else f"{field}: {message}"
            if fix:
                text += f" To fix: {fix}"
        else:
            if not 2 <= len(args) <= 3 or (len(args) == 3 and fix is not None):
                raise TypeError("MarpError(field, problem[, fix]) or MarpError(message, field=...)")
            field, problem = args[0], args[1]
            fix = args[2] if len(args) == 3 else fix
            text = f"{field}: {problem}"
            if fix:
                text += f" To fix: {fix}"
        self.field: str = field
        self.problem: str = problem
        self.fix: str | None = fix
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        # ValueError pickles through self.args (the formatted text), which would not
        # match this constructor; Celery and multiprocessing pickle exceptions.
        return (_rebuild, (type(self), self.field, self.problem, self.fix, str(self)))


def _rebuild(cls: type[MarpError], field: str, problem: str, fix: str | None, text: str) -> MarpError:
    err = cls.__new__(cls)
    ValueError.__init__(err, text)
    err.field, err.problem, err.fix = field, problem, fix
    return err


class UnknownModelError(MarpError):
    """The model reference is neither a catalog name, nor a config file, nor inline JSON."""


class ModelConfigError(MarpError):
    """A model config (HF config.json or Frenzy's neutral spec) is malformed or unsupported."""


class UnknownGpuError(MarpError):
    """The GPU type is not in the catalog."""


class InvalidRecipeError(MarpError):
    """A training recipe field is out of range or inconsistent."""


class UnsupportedPrecisionError(InvalidRecipeError):
    """The GPU cannot run the recipe's precision (no bf16 tensor cores before Ampere)."""


class InvalidLayoutError(MarpError):
    """A parallel layout is malformed or does not fit the model / recipe."""


__all__ = [
    "InvalidLayoutError",
    "InvalidRecipeError",
    "MarpError",
    "ModelConfigError",
    "UnknownGpuError",
    "UnknownModelError",
    "UnsupportedPrecisionError",
]
