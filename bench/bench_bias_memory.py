"""The explorer's memory bound on a model with a relative position bias: the working memory of
``image_analysis.analyse`` (the forward that keeps the hidden states) and of one query's row in every layer, next to
``analysis_memory``.

A random HF ``BeitModel`` built by transformers at a high token count, narrow (width ``2 x heads``: the bias, ``heads x
T²`` whole, is what matters, not the MLP) with its bias per layer or shared; each measurement in a fresh process,
working memory being the peak resident set from the image on (VmHWM reset through /proc/self/clear_refs once the
model is open) minus the resident set then (``bench_highres``'s measure). Run from the repository root::

    python -m bench.bench_bias_memory --grid 64 --heads 12 --bias shared per-layer

Measured 2026-11-24 (one thread, two cores shared with other work, load 5-7), 12 heads, the estimate with the
320 MB layer cache (which neither step fills here) and, now, the bias chunk; "before" is the tree at dfa2dbd, whose
forward formed the shared table whole (once per forward, and again for each layer's rows) and held each chunk's int64
index and the previous chunk's mask besides the chunk, and whose estimate had no bias term:

    | bias      | tokens | whole bias | engine | analyse | a row in every layer | estimate |
    | shared    |  4,097 |     768 MB | before |  933 MB |               897 MB |   386 MB |
    | shared    |  4,097 |     768 MB | now    |  169 MB |                 1 MB |   455 MB |
    | per layer |  4,097 |     768 MB | before |  223 MB |                 0 MB |   386 MB |
    | per layer |  4,097 |     768 MB | now    |  180 MB |                 1 MB |   455 MB |
    | shared    | 16,130 |  11,910 MB | now    |  222 MB |                 1 MB |   460 MB |

(16,130 tokens: 127 x 127 patches, under the 16,384-token gate; "before" would form the 11.9 GB bias there.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too
from bench.bench_highres import reset_peak, status_mb  # noqa: E402

PATCH = 16


def measure(grid: int, heads: int, bias: str) -> dict:
    """One BEiT's analysis in this process: working memory of ``analyse`` and of a row in every layer, MB."""
    import transformers
    from PIL import Image

    from vit.costs import fits
    from vit.explain.views import image_analysis
    from vit.sources.open import open_source

    config = transformers.BeitConfig(image_size=grid * PATCH, patch_size=PATCH, hidden_size=2 * heads,
                                     intermediate_size=4 * heads, num_hidden_layers=2, num_attention_heads=heads,
                                     use_mean_pooling=True, use_relative_position_bias=bias == "per-layer",
                                     use_shared_relative_position_bias=bias == "shared")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        transformers.BeitModel(config).save_pretrained(Path(tmp) / "beit")
        checkpoint = open_source(Path(tmp) / "beit")
    c = checkpoint.model.config
    tokens = 1 + grid * grid
    image = Image.new("RGB", (grid * PATCH, grid * PATCH))
    reset_peak()
    base = status_mb("VmRSS")
    analysis = image_analysis.analyse(checkpoint, image)
    analyse_mb = status_mb("VmHWM") - base
    reset_peak()
    base = status_mb("VmRSS")
    analysis.attentions.rows(tokens // 2)
    rows_mb = status_mb("VmHWM") - base
    estimate = fits.analysis_memory(c.num_layers, c.num_heads, c.hidden_size, tokens,
                                        logit_bias=fits.has_logit_bias(c))
    return {"analyse_mb": analyse_mb, "rows_mb": rows_mb, "estimate_mb": estimate / 2**20,
            "whole_bias_mb": heads * tokens ** 2 * 4 / 2**20, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=int, default=64, help="patches a side (16 px each)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--bias", nargs="+", choices=["shared", "per-layer"], default=["shared", "per-layer"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args.grid, args.heads, args.one)))
        return
    print("| bias | tokens | whole bias (MB) | analyse (MB) | a row in every layer (MB) | estimate (MB) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for bias in args.bias:
        done = subprocess.run([sys.executable, "-m", "bench.bench_bias_memory", "--grid", str(args.grid), "--heads",
                               str(args.heads), "--threads", str(args.threads), "--one", bias],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {bias} | {r['tokens']:,} | {r['whole_bias_mb']:,.0f} | {r['analyse_mb']:,.0f} | "
              f"{r['rows_mb']:,.0f} | {r['estimate_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
