"""The `opsynth` command line: one module per command (its `register(subparsers)` and `run(args)`), and one place
that turns exceptions into one-line, actionable messages (exit 2 for usage errors, 1 for failures, 130 when
interrupted, no traceback without --debug).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import logging
import os
import signal
import sys
import threading

from opsynth.commands import bench, catalog, compare, generate, publish, reference, score, similarity, validate
from opsynth.errors import OpsynthError, UsageError

COMMANDS = (generate, validate, score, similarity, publish, bench, catalog, compare, reference)  # in --help's order
NUMERIC_VALUE_OPTIONS = frozenset({"--runtime-window-ms", "--seed", "--num-samples", "--timeout-s", "--workers",
                                   "--similarity-threshold", "--jaccard-threshold", "--sample", "--n"})  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help (exit 2), and no abbreviated flags:
    with Beam's options passing through, `--num-sample` must be an error, not a guess."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class _Version(argparse.Action):
    """`--version`: opsynth's, its operator catalog's (a hash of its entries), torch's, Beam's and Python's."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from opsynth.commands.version import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opsynth", description="Synthesize KernelBench-style tasks for CUDA-kernel agents.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action=_Version, help="print the versions of opsynth, its catalog, torch and Beam")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def _negative_values_attached(argv: list[str]) -> list[str]:
    """`--opt -1,5` as `--opt=-1,5` for the options whose values may start with a minus: argparse would read
    the value as an option and say the option lacks its argument, where the value itself is what is wrong."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] in NUMERIC_VALUE_OPTIONS and token[:1] == "-" and token[1:2] in "0123456789.":
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def run(argv: list[str]) -> int:
    """Parse and run one command; raises the errors `main` reports."""
    args, extra = build_parser().parse_known_args(_negative_values_attached(argv))
    if args.command != "generate" and extra:
        raise UsageError(f"unknown option {extra[0]} (see `opsynth {args.command} --help`)")
    args.beam_args = extra  # generate passes the options it does not define to Beam
    return args.run(args)


def _quiet_optional_beam_clients(record: logging.LogRecord) -> bool:
    # `import apache_beam` warns that its Google Cloud clients are absent; opsynth does not use them.
    return "apitools not found" not in record.getMessage()


def _traceback_if(debug: bool) -> None:
    """With --debug, the traceback of the error being handled; the exit code stays what it is without."""
    if debug:
        import traceback

        traceback.print_exc()


INTERRUPTED = "opsynth: interrupted; run the same command again to resume"
# What stops a command as Ctrl-C does, where it has its default handler: Ctrl-C itself, and SIGTERM (a scheduler's
# or `timeout`'s stop), which would otherwise end the process at once, its run's session recorded as of its last
# tick. A signal the caller ignores or handles (a background job's SIGINT) is left as it is.
INTERRUPTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class _Interrupt:
    """An interrupt, noted as it comes: Beam turns a KeyboardInterrupt raised inside a stage into a RuntimeError and
    logs its traceback, so `main` tells an interrupt by this, not by the exception that reaches it."""

    seen = 0  # the signal that interrupted this call, 0 for none

    @classmethod
    def handle(cls, signum, frame) -> None:
        cls.seen = signum
        logging.disable(logging.CRITICAL)  # the stages' tracebacks of the interrupt are not news
        raise KeyboardInterrupt


def _interrupted() -> int:
    """The message, and the shell's exit status for a command stopped by the signal (130 for Ctrl-C)."""
    print(INTERRUPTED, file=sys.stderr)
    return 128 + (_Interrupt.seen or signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    logging.getLogger().addFilter(_quiet_optional_beam_clients)
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # accepted before or after the subcommand
    watched = [sig for sig, default in INTERRUPTS.items() if signal.getsignal(sig) is default]
    _Interrupt.seen = 0  # an interrupt of an earlier call in this process is not this one's
    for sig in watched:
        signal.signal(sig, _Interrupt.handle)
    logging_disabled = logging.root.manager.disable
    try:
        return _main(argv, debug)
    finally:
        for sig in watched:
            signal.signal(sig, INTERRUPTS[sig])
        logging.disable(logging_disabled)


def entry() -> None:
    """The `opsynth` program: `main`, then the process's end. A command interrupted, or failed, while a thread of
    its run is inside torch (a round's CPU stages prepared beside the execution) would be aborted by torch's C++
    teardown as the process ends ("terminate called without an active exception", exit status 134, after the
    command's last line): such a process runs its exit handlers and flushes its streams, then ends without that
    teardown, with the command's status. A command that succeeded ends as any program does, its threads done."""
    code = main()
    if code != 0 and any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        atexit._run_exitfuncs()  # what a normal exit runs first (the run's temporary folders, its worker pools)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # the reader went away, or the stream is closed
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _main(argv: list[str], debug: bool) -> int:
    try:
        return run(argv)
    except UsageError as e:
        _traceback_if(debug)
        print(f"opsynth: error: {e}", file=sys.stderr)
        return 2
    except OpsynthError as e:
        if _Interrupt.seen:
            return _interrupted()
        _traceback_if(debug)
        _last_word(f"opsynth: error: {e}")
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at devnull so the exit flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as e:
        if _Interrupt.seen:
            return _interrupted()
        _traceback_if(debug)
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            _last_word("opsynth: error: no space left on device; free some, then run the same command again "
                       "(generate resumes where it stopped)")  # fmt: skip
            return 1
        _last_word(f"opsynth: error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
        return 1


def _last_word(line: str) -> None:
    """The one-line error, last: what the run's threads still log as they stop (a round's CPU stages prepared
    beside its execution, finding the worker pools closed) follows from it and is not news, as with Ctrl-C."""
    logging.disable(logging.CRITICAL)
    print(line, file=sys.stderr)


if __name__ == "__main__":
    entry()
