"""What the commands (``python -m vit.predict`` …) share before their heavy imports: the one-line usage errors,
the parser, argument types and the run wrapper. It imports neither torch nor any wing, so ``--help`` and a usage
error answer before torch loads (each command imports the machinery it runs only after parsing)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

# px (--size, the explorer's input sizes): ViT-B/16 has 65,537 tokens there; maps are computed in chunks
# (vit.explain.chunked)
MAX_INPUT_SIDE = 4096


class UsageError(ValueError):
    """Invalid arguments or an unusable checkpoint: one line on stderr, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error over several lines; we want one
        raise UsageError(message)


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def input_side(text: str) -> int:
    """argparse type: an input side in pixels, 1 to MAX_INPUT_SIDE."""
    value = positive_int(text)
    if value > MAX_INPUT_SIDE:
        raise argparse.ArgumentTypeError(f"at most {MAX_INPUT_SIDE} px, got {value}")
    return value


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
            argv: list[str] | None) -> int:
    """Run a CLI's ``run(args)`` so any failure is one line on stderr: usage 2, failure 1, ^C 130. The arguments
    are parsed before ``run`` imports what it needs, so ``--help`` and usage errors answer at once."""
    try:
        return run(parser.parse_args(argv))
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a CLI shows one line, never a traceback
        from vit.inference import NonFiniteOutput  # loaded by then: only run() raises it

        if isinstance(e, NonFiniteOutput):  # the model's fault, not the command line's
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 1
        print(f"{prog}: failed: {one_line(e)}", file=sys.stderr)
        return 1


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, for errors nobody anticipated."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
