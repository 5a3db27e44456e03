"""`flashbench` entry point: builds the Typer app and renders FlashbenchError as one line + exit code."""

from __future__ import annotations

import sys

import typer

from flashbench.errors import EXIT_INTERRUPTED, EXIT_USAGE, FlashbenchError

app = typer.Typer(
    name="flashbench",
    help="Benchmark attention kernels on NVIDIA GPUs and explain the results against a roofline model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Benchmark attention kernels on NVIDIA GPUs and explain the results against a roofline model."""


@app.command("version")
def version() -> None:
    """Print flashbench's version."""
    from flashbench import __version__

    print(__version__)


def _register_commands() -> None:
    # Each command-group module defines register(app). Imported here, not at module import time,
    # so `flashbench --help` stays cheap and no module imports torch before it must.
    from flashbench.cli import gate, listing, memory, merge, report, roofline, sweep

    for module in (sweep, listing, merge, roofline, memory, report, gate):
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code instead of raising (used by tests and __main__)."""
    try:
        result = app(args=argv, prog_name="flashbench", standalone_mode=False)
    except FlashbenchError as exc:
        print(f"flashbench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("flashbench: interrupted; finished rows are on disk (use --resume)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # typer.Exit inside commands
        return int(exc.code or 0)
    except Exception as exc:
        # Click's usage errors (typer vendors click in some versions, so match by shape, not class).
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
                exc.show()  # a bare group (`flashbench list`): its help is the answer
                return exc.exit_code
            print(f"flashbench: error: {_usage_line(exc)}", file=sys.stderr)
            return EXIT_USAGE
        if type(exc).__name__ == "Abort":
            print("flashbench: aborted", file=sys.stderr)
            return EXIT_INTERRUPTED
        raise
    # Without standalone mode, typer returns typer.Exit(code)'s code, and 130 for Ctrl-C, instead of raising.
    if isinstance(result, int) and not isinstance(result, bool):
        if result == EXIT_INTERRUPTED:
            print("flashbench: interrupted; finished rows are on disk (use --resume)", file=sys.stderr)
        return result
    return 0


def _usage_line(exc: Exception) -> str:
    """Click's usage error (its 4-line block: usage, hint, blank, message) as one line naming the help."""
    message = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "flashbench"
    return f"{message} (see `{command} --help`)"


def entry() -> None:
    sys.exit(main())
