"""A command's options as one typed object: a frozen dataclass whose fields are typer options.

A service command with forty options (``frenzy agent``) written as a function of forty parameters
is a signature nobody reads and a body that passes them on one by one. Here the options are the
fields of a dataclass, each ``Annotated[type, typer.Option(...)] = default`` as a parameter would
be, and the command is a function of the context and that object::

    @dataclass(frozen=True)
    class Options:
        node: Annotated[str | None, typer.Option(help="Node name.")] = None

    @options_command(Options)
    def command(ctx: typer.Context, opts: Options) -> None: ...

typer sees the fields as the command's parameters, in their order, with their names as flags
(``node`` -> ``--node``), so ``--help``, defaults and environment variables are what the same
parameters on the function would give. Not a ``cmd_*`` module: it registers no command.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

import typer

OptionsT = TypeVar("OptionsT")


def options_command(options: type[OptionsT]) -> Callable[[Callable[[typer.Context, OptionsT], None]], Callable[..., None]]:
    """Turn ``run(ctx, options)`` into a typer command whose parameters are ``options``' fields."""
    hints = get_type_hints(options, include_extras=True)  # the fields' Annotated[..., typer.Option]
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                 default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
               for f in dataclasses.fields(options)]  # type: ignore[arg-type]  # a field without default: a required option

    def wrap(run: Callable[[typer.Context, OptionsT], None]) -> Callable[..., None]:
        def command(ctx: typer.Context, **values: Any) -> None:
            run(ctx, options(**values))

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        command.__name__, command.__qualname__ = run.__name__, run.__qualname__
        command.__module__, command.__doc__ = run.__module__, run.__doc__
        return command

    return wrap
