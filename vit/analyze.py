"""Attention over a whole dataset: ``python -m vit.analyze CHECKPOINT --data DIR [--limit N] [--out DIR]``.

For every image of ``DIR`` (one subfolder per class, as for ``vit.evaluate``; ``--limit N``
takes N images after a seeded shuffle): the mean attention distance and entropy of every
head by layer (the ViT paper's Fig. 7), averaged over the images; per true class, the mean
CLS attention of the last layer (heads averaged) and the mean CLS rollout map; the confusion
matrix; and the most confident mistakes. ``--mechanism`` adds, per true class, the mean direct logit
attribution of every head, the logit change when each head alone is zeroed (averaged over images), the
high-norm token rate per layer and position (``--norm-threshold``), massive activations per layer and attention
sinks per head (``vit.explain.mechanism``). Writes ``analysis.json``, PNG plots and one
self-contained ``report.html`` into ``--out`` (default ``analysis/<checkpoint name>``) and
prints the JSON's path. A progress bar is drawn on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vit.explain.dataset import analyze_files, write_outputs

PROG = "vit.analyze"



def build_parser() -> argparse.ArgumentParser:
    from vit.predict import OneLineParser, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=f"python -m {PROG}", description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint written by vit.train")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder with one subfolder of images per class")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="analyse N images (seeded shuffle)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default analysis/<checkpoint name>)")
    p.add_argument("--top-mistakes", type=positive_int, default=20, help="how many mistakes to list (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--seed", type=int, default=0, help="for the --limit shuffle (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    p.add_argument("--mechanism", action="store_true",
                   help="also head attribution, ablation, high-norm tokens, massive activations and sinks (slower)")
    p.add_argument("--norm-threshold", type=float, default=None, metavar="T",
                   help="with --mechanism: a token norm over T is high (default: twice the median patch norm)")
    return p



def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.explain.dataset import sample_files
    from vit.predict import UsageError, open_checkpoint, resolve_device

    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device))
    files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    bar = tqdm(total=len(files), unit="img", desc="analysing", file=sys.stderr, dynamic_ncols=True)
    try:
        analysis = analyze_files(checkpoint, files, args.batch_size, args.top_mistakes,
                                 progress=lambda done, total: bar.update(1))
    except ValueError as e:
        raise UsageError(str(e)) from None
    finally:
        bar.close()
    if args.mechanism:
        from vit.explain.dataset import analyze_mechanism

        bar = tqdm(total=len(files), unit="img", desc="mechanism", file=sys.stderr, dynamic_ncols=True)
        try:
            analysis.mechanism = analyze_mechanism(checkpoint, files, args.norm_threshold,
                                                   progress=lambda done, total: bar.update(1))
        except ValueError as e:  # MechanismError: a model option the analyses do not support
            raise UsageError(f"--mechanism: {e}") from None
        finally:
            bar.close()
    for error in analysis.skipped:
        print(f"{PROG}: skipped: {error}", file=sys.stderr)
    out = Path(args.out) if args.out else Path("analysis") / Path(args.checkpoint).stem
    written = write_outputs(analysis, out, {"checkpoint": str(args.checkpoint), "data": str(args.data)})
    print(json.dumps({"count": analysis.count, "accuracy": analysis.accuracy, "out": str(out),
                      "files": [p.name for p in written]}, indent=2))
    return 1 if analysis.skipped else 0



def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
