"""The patch embedding whose kernel is its stride: the convolution module (the old path) next to ``patchify`` and one
matrix product (``ViT.embed`` now), and for Qwen2.5-VL transformers' ``Qwen2_5_VisionPatchEmbed`` (a Conv3d over the
processor's flattened patches, two identical frames each), on the same weights.

Forward (no gradients) and forward + backward (gradients to the pixels and the kernel, as a gradient map through the
stem takes them). Calls alternate so background load slows every path alike; medians of ``--repeats``, each path's
time as a ratio of the old one's, and the largest difference from the old path's output. Run from the repository
root::

    python -m bench.bench_patch_embed --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# name, pixels (B, C, H, W) or a clip's (B, C, frames, H, W), kernel, width
CASES = (("Qwen2.5-VL 7B stem, 1,036 px (5,476 patches)", (1, 3, 1036, 1036), (14, 14), 1280),
         ("ViT-B/16, 224 px, batch 32", (32, 3, 224, 224), (16, 16), 768),
         ("VideoMAE-B tubelets, 16 frames of 224 px", (1, 3, 16, 224, 224), (2, 16, 16), 768))


def qwen_theirs(pixels: torch.Tensor, weight: torch.Tensor):
    """transformers' stem and its input: the processor's (N, C*2*14*14) rows (merge units' patches, two frames)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    stem = modeling_qwen2_5_vl.Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3,
                                                        embed_dim=weight.shape[0])
    with torch.no_grad():  # our 2D kernel is the sum of its two frames': put it in the first, zeros in the second
        stem.proj.weight.zero_()
        stem.proj.weight[:, :, 0] = weight
    _, C, H, W = pixels.shape
    gh, gw = H // 14, W // 14
    p = pixels.reshape(C, gh // 2, 2, 14, gw // 2, 2, 14).permute(1, 4, 2, 5, 0, 3, 6)
    rows = p.unsqueeze(5).expand(-1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, -1).contiguous()
    return stem, rows


def timed(fn, backward: bool) -> float:
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = fn()
        if backward:
            out.sum().backward()
    return time.perf_counter() - start


def run_case(name: str, shape: tuple[int, ...], kernel: tuple[int, ...], width: int, repeats: int) -> list[str]:
    """The table's two rows (forward, forward + backward) for one stem."""
    from vit.model.vision_transformer import patchify

    rows_out = []
    torch.manual_seed(0)
    conv = (torch.nn.Conv3d if len(kernel) == 3 else torch.nn.Conv2d)(shape[1], width, kernel, kernel)
    pixels = torch.randn(shape)
    inputs = [pixels]
    paths = {"old": lambda: conv(pixels).flatten(2).transpose(1, 2),
             "now": lambda: F.linear(patchify(pixels, kernel), conv.weight.flatten(1), conv.bias)}
    if name.startswith("Qwen"):
        stem, rows = qwen_theirs(pixels, conv.weight.detach())
        paths["theirs"] = lambda: stem(rows)
        inputs.append(rows)
    with torch.no_grad():
        diff = (paths["now"]() - paths["old"]()).abs().max().item()
    for backward in (False, True):
        for leaf in inputs:
            leaf.requires_grad_(backward)
        times = {k: [] for k in paths}
        for path in paths.values():  # warm-up
            timed(path, backward)
        for _ in range(repeats):
            for k, path in paths.items():
                times[k].append(timed(path, backward))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        theirs = f"{med['theirs']:,.1f} ms" if "theirs" in med else "-"
        rows_out.append(f"| {name} | {'forward + backward' if backward else 'forward'} | {med['old']:,.1f} ms | "
                        f"{med['now']:,.1f} ms | {med['now'] / med['old']:.2f}x | {theirs} | {diff:.1e} |")
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), medians of {args.repeats}")
    print("| stem | pass | conv module (old) | patchify + linear (now) | now / old | transformers | max diff |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        for row in run_case(*case, args.repeats):
            print(row, flush=True)


if __name__ == "__main__":
    main()
