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
from vit.overlay import overlay, to_png_bytes  # noqa: E402

OVERLAY = dict(opacity=0.6, colormap="inferno", mode="bilinear")


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and CPU time of ``fn`` in ms (CPU time shows the work when other jobs share the cores)."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def photo_png(width: int = 640, height: int = 480, seed: int = 0) -> bytes:
    """A smooth, photo-like test image (noise compresses and decodes unlike photos)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 32, width // 32, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def draw(checkpoint: Checkpoint, analysis: explorer.Analysis, image: Image.Image, shown: Image.Image,
         shown_uri: str, small: Image.Image, settings: explorer.MapSettings, relevance=None) -> None:
    """What the page draws after a change: map, overlay, picker, prediction chart and one layer's heads, encoded."""
    map2d = explorer.attention_map(analysis, settings, relevance)
    outline = explorer.patch_of(settings.query, analysis.num_prefix_tokens)
    to_png_bytes(overlay(shown, map2d, OVERLAY["opacity"], OVERLAY["colormap"], OVERLAY["mode"],
                         outline_patch=outline))  # st.image sends PNGs
    explorer.patch_picker_figure(shown.size, shown_uri, analysis.grid, settings.query,
                                 analysis.num_prefix_tokens).to_json()
    explorer.predictions_figure(analysis.prediction).to_json()
    maps = explorer.head_maps(analysis, settings.query, layer=settings.layer)
    for cell in explorer.small_multiples(small, maps, OVERLAY["opacity"], OVERLAY["colormap"], OVERLAY["mode"],
                                         outline):
        to_png_bytes(cell)


def display(image: Image.Image) -> tuple[Image.Image, str, Image.Image]:
    """What the page prepares once per image: the display-size image, its data URI, the heads-grid size."""
    shown = explorer.display_image(image)
    return shown, explorer.png_data_uri(shown), explorer.display_image(image, min_side=96, max_side=144)


def upload_to_maps(checkpoint: Checkpoint, data: bytes) -> None:
    image = open_image(data, name="upload.png")
    analysis = explorer.analyse(checkpoint, image)
    draw(checkpoint, analysis, image, *display(image), explorer.MapSettings())


def bench(name: str, checkpoint: Checkpoint, data: bytes, repeats: int) -> None:
    image = open_image(data, name="upload.png")
    analysis = explorer.analyse(checkpoint, image)  # warm-up (first-call allocations)
    shown = display(image)
    L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
    changes = [explorer.MapSettings(layer=i % L, head=(None if i % 2 else i % H), query=(i * 7) % T)
               for i in range(2 * repeats)]
    upcoming = iter(changes * 2)
    rollout = explorer.MapSettings(kind="rollout", discard_ratio=0.5)
    other_class = (analysis.prediction.class_index + 1) % len(checkpoint.class_names)

    def class_map() -> None:
        relevance = explorer.class_relevance(checkpoint, image, other_class)
        explorer.attention_map(analysis, explorer.MapSettings(kind="class", class_index=other_class), relevance)

    results = {
        "upload -> maps ready": timed(lambda: upload_to_maps(checkpoint, data), repeats),
        "layer/head/query change": timed(lambda: draw(checkpoint, analysis, image, *shown, next(upcoming)),
                                         2 * repeats),
        "rollout change": timed(lambda: draw(checkpoint, analysis, image, *shown, rollout), repeats),
        "class-specific map (backward pass)": timed(class_map, repeats),
    }
    print(f"\n{name}: {L} layers x {H} heads, {T} tokens, {count_parameters(checkpoint.model) / 1e6:.2f} M params, "
          f"image {image.width}x{image.height}")
    print(f"  {'':<42} {'wall ms':>9} {'cpu ms':>9}")
    for what, (wall, cpu) in results.items():
        print(f"  {what:<42} {wall:9.1f} {cpu:9.1f}")


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
    flips = iter([1 if i % 2 == 0 else last for i in range(repeats)])

    def rerun() -> None:
        layer_slider().set_value(next(flips))
        at.run()

    wall, cpu = timed(rerun, repeats)
    print(f"  {'page rerun after a layer change (AppTest)':<42} {wall:9.1f} {cpu:9.1f}")


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
