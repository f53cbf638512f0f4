"""How fast the explorer answers, server side: ``python bench/bench_app.py [--repeats 5]``.

For the shipped default checkpoint and a randomly initialised ViT-B/16 (12 layers x 12 heads,
197 tokens) it times, through the same ``vit`` functions the explorer page calls:

- upload -> maps ready: decode the upload, one forward pass with attentions and per-head
  statistics, the default map (last layer, CLS, mean over heads), the display image, the
  overlay, the patch picker, the prediction chart and the heads grid of one layer;
- a layer/head change: the new map, overlay, patch picker, prediction chart and heads grid
  (the forward pass is cached by the page, so it is not redone);
- a rollout change and a class-specific map (one backward pass, cached per class by the page);
- with ``--apptest``, a whole page rerun after a layer change through Streamlit's AppTest.

Targets on 2 CPU cores: upload -> maps under 1 s for the default checkpoint, a layer/head
change under 200 ms. Each figure is the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vit import catalog, explorer  # noqa: E402
from vit.checkpoint import Checkpoint, Preprocessing, load_checkpoint  # noqa: E402
from vit.images import open_image  # noqa: E402
from vit.model import ViT, ViTConfig, count_parameters  # noqa: E402
from vit.overlay import overlay  # noqa: E402

OVERLAY = dict(opacity=0.6, colormap="inferno", mode="bilinear")


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def photo_png(width: int = 640, height: int = 480, seed: int = 0) -> bytes:
    """A smooth, photo-like test image (noise compresses and decodes unlike photos)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 32, width // 32, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def draw(checkpoint: Checkpoint, analysis: explorer.Analysis, image: Image.Image, shown: Image.Image,
         small: Image.Image, settings: explorer.MapSettings, relevance=None) -> None:
    """What the page draws after a change: map, overlay, picker, prediction chart and one layer's heads."""
    map2d = explorer.attention_map(analysis, settings, relevance)
    outline = explorer.patch_of(settings.query, analysis.num_prefix_tokens)
    overlay(shown, map2d, OVERLAY["opacity"], OVERLAY["colormap"], OVERLAY["mode"], outline_patch=outline)
    explorer.patch_picker_figure(shown, analysis.grid, settings.query, analysis.num_prefix_tokens).to_json()
    explorer.predictions_figure(analysis.prediction).to_json()
    maps = explorer.head_maps(analysis, settings.query, layer=settings.layer)
    explorer.small_multiples(small, maps, OVERLAY["opacity"], OVERLAY["colormap"], OVERLAY["mode"], outline)


def upload_to_maps(checkpoint: Checkpoint, data: bytes) -> None:
    image = open_image(data, name="upload.png")
    analysis = explorer.analyse(checkpoint, image)
    shown, small = explorer.display_image(image), explorer.display_image(image, min_side=96, max_side=144)
    draw(checkpoint, analysis, image, shown, small, explorer.MapSettings())


def bench(name: str, checkpoint: Checkpoint, data: bytes, repeats: int) -> dict[str, float]:
    image = open_image(data, name="upload.png")
    analysis = explorer.analyse(checkpoint, image)  # warm-up (first-call allocations)
    shown, small = explorer.display_image(image), explorer.display_image(image, min_side=96, max_side=144)
    L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
    changes = [explorer.MapSettings(layer=i % L, head=(None if i % 2 else i % H), query=(i * 7) % T)
               for i in range(max(repeats, 4))]
    count = iter(range(10**9))

    def change() -> None:
        draw(checkpoint, analysis, image, shown, small, changes[next(count) % len(changes)])

    rollout = explorer.MapSettings(kind="rollout", discard_ratio=0.5)
    other_class = (analysis.prediction.class_index + 1) % len(checkpoint.class_names)

    def class_map() -> None:
        relevance = explorer.class_relevance(checkpoint, image, other_class)
        explorer.attention_map(analysis, explorer.MapSettings(kind="class", class_index=other_class), relevance)

    results = {
        "upload -> maps ready": median_ms(lambda: upload_to_maps(checkpoint, data), repeats),
        "layer/head/query change": median_ms(change, repeats * 2),
        "rollout change": median_ms(lambda: draw(checkpoint, analysis, image, shown, small, rollout), repeats),
        "class-specific map (backward pass)": median_ms(class_map, repeats),
    }
    print(f"\n{name}: {L} layers x {H} heads, {T} tokens, {count_parameters(checkpoint.model) / 1e6:.2f} M params, "
          f"image {image.width}x{image.height}")
    for what, ms in results.items():
        print(f"  {what:<38} {ms:8.1f} ms")
    return results


def bench_apptest(repeats: int) -> None:
    """A whole page rerun after a layer change (Streamlit overhead included), on the default checkpoint."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    if at.exception or at.error:
        print("  AppTest: the page did not load:", [e.value for e in at.exception] + [e.value for e in at.error])
        return
    def layer_slider():
        return next(w for w in at.sidebar.select_slider if w.label == "Layer")

    last = int(layer_slider().options[-1])
    times = []
    for i in range(repeats):
        layer_slider().set_value(1 if i % 2 == 0 else last)
        start = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - start)
    print(f"  {'page rerun after a layer change':<38} {statistics.median(times) * 1000:8.1f} ms (AppTest)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is printed)")
    parser.add_argument("--apptest", action="store_true", help="also time whole page reruns through AppTest")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")

    default = catalog.default_checkpoints_dir() / catalog.DEFAULT_CHECKPOINT
    samples = sorted((catalog.default_checkpoints_dir() / "samples" / default.stem).glob("*.png"))
    if default.is_file():
        data = samples[0].read_bytes() if samples else photo_png()
        bench(f"default checkpoint ({default.name})", load_checkpoint(default), data, args.repeats)
        if args.apptest:
            bench_apptest(args.repeats)
    else:
        print(f"\n{default} is missing; skipping the default checkpoint")

    torch.manual_seed(0)
    config = ViTConfig.from_preset("vit-base-16")
    model = ViT(config).eval()
    base = Checkpoint(model=model, class_names=[f"class {i}" for i in range(config.num_classes)],
                      preprocessing=Preprocessing.default_for(config))
    bench("random ViT-B/16", base, photo_png(640, 480), args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
