"""Placeholder: command group 'gate' is being written (replace this module; keep register(app))."""

import typer


def register(app: typer.Typer) -> None:
    return None
