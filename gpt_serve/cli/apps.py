"""The applications' subcommands (`train`, `ladder`, `export`, `demo`, `space`): each registers itself as an entry
point of the `gpt_serve.commands` group (see pyproject.toml), found here without being loaded."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

COMMANDS_GROUP = "gpt_serve.commands"
# What `gpt-serve --help` says of the applications' subcommands (loading one just for its help would import it).
COMMAND_HELP = {
    "train": "train a model (see `gpt-serve train --help`)",
    "ladder": "train the lesson's ladder stages and write the table",
    "export": "export a model folder to ONNX and validate it",
    "demo": "launch the Gradio web demo",
    "space": "write a folder that runs the demo as a Hugging Face Space",
}


def app_commands() -> dict[str, EntryPoint]:
    """The applications' subcommands installed with this package: name -> entry point (not loaded)."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


def add_parsers(sub, apps) -> None:
    """A subparser per application, for `gpt-serve --help` only: `main` hands the application its arguments
    before parsing (its own parser reads them)."""
    for name in apps:
        sub.add_parser(name, help=COMMAND_HELP.get(name, f"see `gpt-serve {name} --help`"), add_help=False)
