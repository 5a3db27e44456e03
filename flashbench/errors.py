"""The one error type the CLI renders as a one-line message, and the documented exit codes."""

from __future__ import annotations

import sys

# Exit codes, documented in README.md ("Exit codes").
EXIT_OK = 0
EXIT_REGRESSION = 1  # gate: a real slowdown or a newly failing case
EXIT_USAGE = 2  # bad input: malformed range, unknown provider/GPU, corrupt results, mismatch
EXIT_NO_GPU = 3  # a command that needs a GPU found none
EXIT_WORKER = 4  # the measuring worker process could not start (the message names the cause)
EXIT_INTERRUPTED = 130  # Ctrl-C; every finished row is already on disk


class FlashbenchError(Exception):
    """A user-facing error: printed as one line, never as a traceback.

    ``exit_code`` defaults to EXIT_USAGE (2); raise with another code where the README documents one.
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """ "1 case", "2 cases" (`nouns` where the plural is not noun + "s"): counts in messages read as English."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def warn(message: str) -> None:
    """A user-facing warning: one line on stderr, `flashbench: warning: ...` (the form errors take)."""
    print(f"flashbench: warning: {message}", file=sys.stderr)
