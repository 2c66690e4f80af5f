"""Small validators shared by the frozen dataclasses of MARP.

They keep the ``__post_init__`` methods short and make every failure name its
field in the same words, so a service can point the user at the exact input.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from marp.errors import MarpError


def check_int(
    value: Any, field: str, error: type[MarpError], minimum: int = 1, fix: str | None = None
) -> int:
    """An int (not a bool: ``True`` is an int in Python) that is >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(field, f"must be an integer, got {value!r} ({type(value).__name__}).", fix)
    if value < minimum:
        raise error(field, f"must be >= {minimum}, got {value}.", fix)
    return value


def check_bool(value: Any, field: str, error: type[MarpError]) -> bool:
    if not isinstance(value, bool):
        raise error(field, f"must be true or false, got {value!r} ({type(value).__name__}).")
    return value


def check_choice(value: Any, field: str, error: type[MarpError], choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise error(field, f"must be one of {', '.join(map(repr, options))}, got {value!r}.")
    return value


def check_number(
    value: Any, field: str, error: type[MarpError], low: float, high: float, high_open: bool = True
) -> float:
    """A real number in [low, high) (or [low, high] when ``high_open`` is False)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(field, f"must be a number, got {value!r} ({type(value).__name__}).")
    too_high = value >= high if high_open else value > high
    if value < low or too_high or value != value:  # value != value catches NaN
        bracket = ")" if high_open else "]"
        raise error(field, f"must be in [{low}, {high}{bracket}, got {value}.")
    return float(value)
