"""The ``bert-multi`` command line: one module per subcommand, each with its arguments beside what it
does (``add_parser``, ``run``); ``main`` dispatches and turns the project's own errors into one line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..backend.channel import RemoteBug
from ..backend.registry import share_the_process
from ..cache import CACHE_VARIABLE, cache_root, turn_off
from ..display import printable_output
from ..ending import end_process
from ..errors import (
    BackendContractError,
    CannotRunHere,
    InputError,
    UsageError,
    UserCodeError,
    WeightsError,
    WorkerFailed,
)
from . import (
    backends,
    bench,
    compare,
    conform,
    convert,
    demo,
    fixtures,
    gpu_check,
    inspect,
    kernels,
    lessons,
    pretrain,
    verify,
)

# In the order `bert-multi --help` lists them.
COMMANDS = (
    conform,
    compare,
    verify,
    inspect,
    convert,
    demo,
    pretrain,
    fixtures,
    bench,
    gpu_check,
    lessons,
    kernels,
    backends,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-multi", description="d2l's BERT in several frameworks, checked against a float64 NumPy oracle."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        own = command.add_parser(sub)
        own.set_defaults(func=command.run)
        own.add_argument(
            "--no-cache",
            action="store_true",
            help=f"run without the cache of compiled code and lessons' outputs (default: kept in "
            f"{cache_root() or 'none'}; "
            f"{CACHE_VARIABLE} names another directory, or none)",
        )
    return parser


# The project's own errors: each says what is wrong and what was expected, in one line (a user's code's
# exception with the frames of their code, which is where to look).
EXPECTED = (UsageError, InputError, WeightsError, CannotRunHere, BackendContractError, WorkerFailed, UserCodeError)


def command() -> NoReturn:
    """The ``bert-multi`` command (``main``, then the process ends without the frameworks' teardown)."""
    end_process(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` asks for; its exit status. The project's own errors, and an ``OSError`` on a
    path (one the user gave, or one written for them), are one line on standard error and status 2; so is
    anything else, a bug of bert_multi's, its traceback written to a file the line names (never status 1,
    which says a model does not conform)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a command run again elsewhere is run as given
    if args.no_cache:
        turn_off()  # for this process and every one it starts
    share_the_process()  # a command may run several frameworks, on one GPU
    with printable_output():  # names from files reach the terminal as text, never as its commands
        return _run(args)


# What a full disk or a file-size limit raises when written to.
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except RemoteBug as error:  # what is a bug in this process is one in a worker
        print(f"bert-multi: error: {bug_report(error, args.argv)}", file=sys.stderr)
        return 2
    except EXPECTED as error:
        print(f"bert-multi: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`bert-multi lessons 5 | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:
        if error.errno in FULL and not error.filename:  # standard output on a full disk: the machine's, no bug
            with contextlib.suppress(OSError, ValueError):  # nothing more to write there (a real file only)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            print(f"bert-multi: error: {error.strerror}: the output could not be written", file=sys.stderr)
            return 2
        # One on a path the user gave, or one written for them, is theirs to fix; any other is a bug's.
        print(f"bert-multi: error: {error if error.filename else bug_report(error, args.argv)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bert-multi: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - a bug of bert_multi's is said as one, not as a verdict
        print(f"bert-multi: error: {bug_report(error, args.argv)}", file=sys.stderr)
        return 2


def bug_report(error: BaseException, argv: Sequence[str]) -> str:
    """One line saying that ``error`` is a bug of bert_multi's, naming the file its traceback is written
    to, with the command and versions, for a report to the project."""
    said = (str(error).splitlines() or [""])[0][:200]
    with tempfile.NamedTemporaryFile("w", prefix="bert_multi-bug-", suffix=".txt", delete=False) as file:
        file.write(f"bert-multi {' '.join(argv)}\nbert_multi {__version__}, Python {sys.version.split()[0]}\n\n")
        file.write("".join(traceback.format_exception(error)))
        if isinstance(error, RemoteBug):
            file.write(f"\nin the worker:\n{error.remote_traceback}")
    return (
        f"an internal error, a bug in bert_multi and not in your model or files: {type(error).__name__}: {said} "
        f"(its traceback is in {file.name}: please report it with the command you ran)"
    )
