"""The errors the CLI turns into one-line messages: usage errors exit 2, run failures exit 1."""


class OpsynthError(Exception):
    """A failure of the run itself (exit status 1)."""


class UsageError(OpsynthError):
    """The command line or its inputs are wrong; the message says how to fix it (exit status 2)."""
