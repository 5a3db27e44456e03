"""The Typer CLI: one thin module per command group, each calling one library function."""
