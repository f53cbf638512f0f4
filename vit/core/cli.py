"""What the commands (``python -m vit.predict`` …) share before their heavy imports: the one-line usage errors,
the parser, argument types and the run wrapper. It imports neither torch nor any wing, so ``--help`` and a usage
error answer before torch loads (each command imports the machinery it runs only after parsing)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

# px (--size, the explorer's input sizes): ViT-B/16 has 65,537 tokens there; maps are computed in chunks
# (vit.explain.methods.chunked)
MAX_INPUT_SIDE = 4096


class UsageError(ValueError):
    """Invalid arguments or an unusable checkpoint: one line on stderr, exit status 2."""


class ModelError(ValueError):
    """A failure that is the model's, not the command line's (``vit.core.inference.NonFiniteOutput``): one line on
    stderr, exit status 1. Defined here so the commands' wrapper needs no import of what raises it."""


class OneLineParser(argparse.ArgumentParser):
    """Every command's parser: its errors are one line (argparse prints usage + error over several), and a misspelt
    option or choice gets the closest one (Python 3.11's argparse has no ``suggest_on_error``). Every command, and
    each of ``vit.sae``'s subcommands, answers ``--version`` with the project's version."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from vit.core.version import project_version  # pyproject.toml or the installed metadata: no torch

        self.add_argument("--version", action="version", version=f"%(prog)s {project_version()}",
                          help="print the version and exit")

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + did_you_mean(message, self))


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option ``parser`` and its subcommands' parsers take (``--size``, ``-h``, ...)."""
    options = []
    for action in parser._actions:
        options += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options += option_strings(sub)
    return list(dict.fromkeys(options))


def did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    """'; did you mean --size?' for argparse's ``message`` about an option ``parser`` does not have (or a choice
    not offered), naming the closest it has (difflib), or '' when none is close."""
    if message.startswith("unrecognized arguments: "):
        given = [word.split("=", 1)[0] for word in message.removeprefix("unrecognized arguments: ").split()
                 if word.startswith("-")]
        known = option_strings(parser)
    else:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice is None:
            return ""
        given, known = [choice.group(1)], re.findall(r"'([^']*)'", choice.group(2))
    close = [match[0] for word in given if (match := difflib.get_close_matches(word, known, n=1, cutoff=0.6))]
    return f"; did you mean {' / '.join(dict.fromkeys(close))}?" if close else ""


def command_name(module: str) -> str:
    """The command as the user typed it, for usage lines: the console script's name (``vit-predict``) when run as
    one, else ``python -m vit.predict`` (run as a module, or called in-process)."""
    typed = os.path.basename(sys.argv[0]).removesuffix(".exe") if sys.argv and sys.argv[0] else ""
    return typed if typed == "vit-" + module.rsplit(".", 1)[-1] else f"python -m {module}"


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from ``low`` to ``high``, so a count that sizes the work is refused as the
    command line is read (a usage error, status 2), not once the work has begun."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low:,} to {high:,}, got {text!r}")
        return value
    return parse


def input_side(text: str) -> int:
    """argparse type: an input side in pixels, 1 to MAX_INPUT_SIDE."""
    value = positive_int(text)
    if value > MAX_INPUT_SIDE:
        raise argparse.ArgumentTypeError(f"at most {MAX_INPUT_SIDE} px, got {value}")
    return value


def check_folder(path: str | None, flag: str, give: str) -> None:
    """UsageError ``FLAG PATH is not a folder; give GIVE`` unless ``path`` (None: not given) is a folder."""
    if path is not None and not Path(path).is_dir():
        raise UsageError(f"{flag} {path} is not a folder; give {give}")


def check_out_folder(path: str | None, flag: str, names: Sequence[str], give: str) -> None:
    """Before the work: UsageError (one line) unless ``path`` (None: not given) is a folder, or can be made one,
    where this process can write the files ``names`` (none of them a folder). It is made, and a temporary file
    created in it and removed: only a real write tells (root may write anywhere ``os.access`` is asked, and /proc
    refuses even root), so a run never scores for an hour to fail on its ``--out`` (``/dev/null``, a file, /proc).
    ``give`` says what to give instead."""
    import tempfile

    if path is None:
        return
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {path} is not a folder; give {give}")
    taken = [name for name in names if (folder / name).is_dir() and not (folder / name).is_symlink()]
    if taken:
        raise UsageError(f"{flag} {path} holds a folder named {taken[0]}, where the report's file goes; give {give}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path} cannot be written ({e.strerror or type(e).__name__}); give {give}") from None


def add_size_arguments(parser: argparse.ArgumentParser, keep_aspect: bool) -> None:
    """``--size N`` (and ``--keep-aspect``): the input size the model sees, shared by predict and evaluate."""
    parser.add_argument("--size", type=input_side, metavar="N",
                        help="run the model on an N-px square instead of its training size (rounded to whole "
                             f"patches, position embeddings interpolated; at most {MAX_INPUT_SIDE})")
    if keep_aspect:
        parser.add_argument("--keep-aspect", action="store_true",
                            help="with --size: the long side at N px and the short side in proportion "
                                 "(without --size: the training size as the long side)")


def run_cli(prog: str, parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
            argv: list[str] | None, check: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Run a CLI's ``run(args)`` so any failure is one line on stderr: usage 2, failure 1, ^C 130. The arguments
    are parsed, and ``check(args)`` (the files and folders they name exist: UsageError) run, before ``run`` imports
    what it needs, so ``--help``, usage errors and a mistyped path answer at once; then torch gets as many threads
    as cores are free (``vit.core.threads``)."""
    try:
        args = parser.parse_args(argv)
        if check is not None:
            check(args)
        use_free_cores()
        return run(args)
    except UsageError as e:
        return usage_error(prog, e)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except ModelError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a CLI shows one line, never a traceback
        print(f"{prog}: failed: {one_line(e)}", file=sys.stderr)
        return 1


def use_free_cores() -> None:
    """torch's threads from the cores free now (``vit.core.threads``), called after parsing (``--help`` loads no torch);
    a ``VIT_THREADS`` that is not a count is a usage error."""
    from vit.core import threads

    try:
        threads.use_free_cores()
    except ValueError as e:  # VIT_THREADS set to something else than a count
        raise UsageError(str(e)) from None


def usage_error(prog: str, error: Exception | str) -> int:
    """Print ``PROG: error: MESSAGE`` (one line) and return the usage status, 2; a run the app launched also
    records it as its end (``vit.core.runfiles.record_run_end``)."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    from vit.core.runfiles import record_run_end  # no torch: the module is plain files and JSON

    record_run_end(str(error), 2)
    return 2


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, for errors nobody anticipated."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def finish(code: int | None) -> NoReturn:
    """End a command's process with ``code`` as Python would (other threads joined, every atexit hook run, the
    standard streams flushed), less the interpreter's teardown: its last garbage collections walk every object
    still alive (1.3 s with torch and torchvision loaded), and with triton loaded (the CUDA torch wheels bring it)
    nanobind's leak check then prints ~30 lines of noise under the command's own last line. Only a command's
    ``__main__`` and console entry call this; ``main(argv)`` returns its status to in-process callers."""
    # What the interpreter's exit does first, in its order: threading's own exit hooks (a thread pool's workers
    # are told to end), then every non-daemon thread joined; joining first would wait for ever on those workers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (``| head``) has nothing left to flush to
            stream.flush()
    os._exit(code if isinstance(code, int) else 1 if code else 0)


def run_command(entry: Callable[[], int | None]) -> NoReturn:
    """A command's ``__main__`` and console entry: ``entry()``'s status through ``finish``. A reader that closed
    the pipe early (``vit-predict --help | head``) ends it quietly, as Python's documentation advises, rather than
    in a BrokenPipeError traceback."""
    try:
        code = entry()
    except SystemExit as e:  # argparse's --help, click (streamlit's command line)
        code = e.code if isinstance(e.code, int) or e.code is None else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # later writes, the final flush included, go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    finish(code)
