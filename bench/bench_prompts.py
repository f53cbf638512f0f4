"""Asking a CLIP in words: the cost of each step from typed labels to a map, as a ratio to one plain forward
pass of the image tower run side by side (issue 22).

A random open_clip ``ViT-B-16`` (the shape of OpenAI's CLIP ViT-B/16: 224 px, 197 tokens, a 12-layer text
tower) is saved as open_clip saves for the Hub and opened as the explorer opens it. Steps, each the explorer's
own call: opening the text tower (once per model), encoding three new labels (once per label), the zero-shot
scores (one forward), and one label's map by each method. The calls alternate with the baseline so that
background load slows all alike; the table shows medians and the ratio. Run from the repository root::

    python -m bench.bench_prompts --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too
from vit.explain.language import prompts  # noqa: E402
from vit.sources.open import open_source  # noqa: E402
from vit.sources.vlm.text_tower import open_text_tower  # noqa: E402


def save_vit_b16(folder: Path) -> Path:
    import open_clip
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    model = open_clip.create_model("ViT-B-16", pretrained=None)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    save_config_for_hf(model, folder / "open_clip_config.json", model_config=open_clip.get_model_config("ViT-B-16"))
    return folder


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_vit_b16(Path(tmp) / "clip")
        checkpoint = open_source(folder)
        model = checkpoint.model
        x = torch.randn(1, 3, 224, 224)

        def forward():
            with torch.inference_mode():
                model(x)

        forward()
        tower_open = timed(lambda: open_text_tower(checkpoint))
        tower = open_text_tower(checkpoint)
        rows = {"open the text tower (once per model)": [tower_open]}
        labels = ["a dog", "a cat", "a red ball"]
        steps = {"encode 3 new labels": None, "zero-shot scores": None}
        steps.update({f"map: {name}": key for key, name in prompts.PROMPT_METHODS.items()})
        base: list[float] = []
        for r in range(args.repeats):
            new = [f"{label} {r}" for label in labels]  # new text each repeat: the cache would hide the cost
            base.append(timed(forward))
            rows.setdefault("encode 3 new labels", []).append(timed(lambda new=new: tower.encode(new)))
            asked = prompts.ask(tower, labels)
            base.append(timed(forward))
            rows.setdefault("zero-shot scores", []).append(timed(lambda asked=asked: prompts.zero_shot(
                model, x, asked.embeddings, asked.scale, asked.bias, asked.kind)))
            for key, name in prompts.PROMPT_METHODS.items():
                base.append(timed(forward))
                rows.setdefault(f"map: {name}", []).append(timed(lambda key=key, asked=asked: prompts.prompt_map(
                    model, x, asked, 0, key)))
        reference = statistics.median(base)
        print(f"ViT-B/16 CLIP (random), 224 px, {args.threads} threads; baseline: one image-tower forward, "
              f"median {reference * 1e3:.0f} ms")
        print(f"{'step':42s} {'median':>9s} {'x forward':>10s}")
        for name, times in rows.items():
            median = statistics.median(times)
            print(f"{name:42s} {median * 1e3:7.0f} ms {median / reference:9.1f}x")


if __name__ == "__main__":
    main()
