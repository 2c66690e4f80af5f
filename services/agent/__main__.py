"""``python -m frenzy.agent``: the node agent without the rest of the CLI."""

import typer

from frenzy.agent.cli import agent_command


def main() -> None:
    typer.run(agent_command)


if __name__ == "__main__":
    main()
