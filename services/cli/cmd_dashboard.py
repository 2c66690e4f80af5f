"""``frenzy dashboard``: where the dashboard and REST API are, and how to log in to them.

The address and the token come from where every client command finds them (the credentials
file `frenzy up` writes, FRENZY_API, FRENZY_TOKEN); nothing is asked of the server. The token
is printed only when asked for by name (``--token``), for ``export FRENZY_TOKEN=$(...)``.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import fail

PANEL = "Run jobs"


def dashboard(
    url: Annotated[bool, typer.Option("--url", help="Print only the dashboard's URL (for scripts).")] = False,
    token: Annotated[bool, typer.Option("--token", help="Print only the API token the CLI uses (a secret: "
                                        "for `export FRENZY_TOKEN=$(frenzy dashboard --token)`).")] = False,
) -> None:
    """Show the dashboard's URL and how to log in (the dashboard and the REST API ask for a token).

        frenzy dashboard
        export FRENZY_TOKEN=$(frenzy dashboard --token)
        curl -H "Authorization: Bearer $FRENZY_TOKEN" "$(frenzy dashboard --url)/api/jobs"
    """
    from frenzy.auth.credentials import CredentialsError, credentials_path, read_credentials, resolve_token

    try:
        creds = read_credentials()
        secret = resolve_token()
    except CredentialsError as exc:
        fail(str(exc), 1)
    address = (os.environ.get("FRENZY_API") or creds.api or "").rstrip("/")
    if not address and (url or not token):
        fail(f"no dashboard address: FRENZY_API is unset and {credentials_path()} names none. To fix: start the "
             "stack with `frenzy up` (its API serves the dashboard), or set FRENZY_API=http://HOST:PORT", 1)
    if url or token:
        if token and not secret:
            fail("no API token: FRENZY_TOKEN, FRENZY_TOKEN_FILE and the credentials file give none. To fix: "
                 "ask an operator for one (`frenzy token create --user NAME`)", 1)
        if url:
            typer.echo(address)
        if token:
            typer.echo(secret)
        return
    con = render.console()
    con.print(f"dashboard: [bold]{address}/[/]", highlight=False)
    con.print(f"REST API:  {address}/api/ (OpenAPI: {address}/docs)", highlight=False)
    if secret:
        source = ("FRENZY_TOKEN" if os.environ.get("FRENZY_TOKEN")
                  else "FRENZY_TOKEN_FILE" if os.environ.get("FRENZY_TOKEN_FILE") else str(credentials_path()))
        con.print(f"log in:    paste your API token into the dashboard's token box; the CLI's comes from {source}:\n"
                   "           frenzy dashboard --token            (prints it; it is a secret)\n"
                   "           export FRENZY_TOKEN=$(frenzy dashboard --token)\n"
                   f"           curl -H \"Authorization: Bearer $FRENZY_TOKEN\" {address}/api/jobs", highlight=False)
    else:
        con.print("log in:    the dashboard asks for an API token; ask an operator for one "
                  "(`frenzy token create --user NAME`)", highlight=False)


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(dashboard)
