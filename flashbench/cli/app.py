"""`flashbench` entry point: builds the Typer app and renders FlashbenchError as one line + exit code.

One flag convention in every command (README "Flags"):
    switches      bare flags: --resume, --force, --json, --checkpointing, --allow-missing; never `--json true`.
                  Where a preset or config file may turn one on, a --no- form turns it off (--cuda-graph /
                  --no-cuda-graph, --ncu / --no-ncu). Help shows no type for them (typer 0.2x printed <bool>).
    --causal      a choice, the same in sweep and roofline: --causal true|false|both (roofline: one mask per
                  call); a bare --causal means --causal true, so `sweep --causal --out x` is causal-only.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import typer
import typer.main

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
    """Run the CLI; return the exit code instead of raising (used by tests and __main__).

    A reader that goes away (`flashbench sweep ... | head`) costs the command nothing: output to a closed pipe
    is dropped, the sweep goes on measuring and writing rows, and the exit code is the command's own.
    """
    args = implied_values(sys.argv[1:] if argv is None else list(argv))
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ReaderSafe(streams[0]), ReaderSafe(streams[1])  # type: ignore[assignment]
    try:
        code = _run(args)
    finally:
        sys.stdout, sys.stderr = streams
    return code


class ReaderSafe:
    """A text stream whose reader may leave: a write to a closed pipe is dropped, not raised (Python raises
    BrokenPipeError at the next print, which stopped a sweep piped into `head` after a few rows)."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.lost = stream, False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        try:  # the descriptor to /dev/null: the interpreter's last flush of what is buffered stays quiet
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass  # no descriptor (a test's capture): nothing will flush it

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _run(args: list[str]) -> int:
    try:
        result = _command()(args=args, prog_name="flashbench", standalone_mode=False)
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
        code = getattr(exc, "exit_code", None)
        if hasattr(exc, "show") and isinstance(code, int):
            if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
                exc.show()  # a bare group (`flashbench list`): its help is the answer
                return code
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


# Options whose value may be left out, and the value a bare one means.
IMPLIED = {"--causal": "true"}


def implied_values(args: list[str]) -> list[str]:
    """`args` with the value of a bare IMPLIED option filled in: one followed by nothing or by another option."""
    out: list[str] = []
    for j, arg in enumerate(args):
        if arg == "--":  # what follows is positional, never an option
            return out + args[j:]
        out.append(arg)
        if arg in IMPLIED and (j + 1 == len(args) or args[j + 1].startswith("-")):
            out.append(IMPLIED[arg])
    return out


def _command() -> Any:
    """The app as a click command, its flags' type column blanked: a flag takes no value, so typer's <bool>
    beside --resume read as if it took one."""
    command = typer.main.get_command(app)
    _blank_flag_types(command)
    return command


def _blank_flag_types(command: Any) -> None:
    for param in command.get_params(command.context_class(command, info_name=command.name)):
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _blank_flag_types(sub)


def _usage_line(exc: Exception) -> str:
    """Click's usage error (its 4-line block: usage, hint, blank, message) as one line naming the help."""
    message = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "flashbench"
    return f"{message} (see `{command} --help`)"


def entry() -> None:
    sys.exit(main())
