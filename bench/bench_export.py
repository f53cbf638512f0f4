"""CPU of one offline HTML export (``vit.app.export.view_html``), warm, in this process (issue 112): the median of
5 rounds of 4 exports, for a ViT-B/16 view at 224 px (its 12 heads and a prediction) and for a small view, with
Streamlit's Plotly template the process's default, as inside the app. Run from the repository root::

    python bench/bench_export.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import plotly.io as pio  # noqa: E402
import streamlit.elements.lib.streamlit_plotly_theme  # noqa: E402, F401  (registers Streamlit's template)
from PIL import Image  # noqa: E402

from vit.app.export import View, view_html  # noqa: E402
from vit.core.inference import Prediction  # noqa: E402


def views() -> dict[str, View]:
    rng = np.random.default_rng(0)
    p = np.full(5, 0.2)
    prediction = Prediction([(f"class {i}", 0.2) for i in range(5)], p, np.log(p), None, 0)
    noise = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
    small = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    return {"ViT-B/16 224 px, 12 heads, prediction": View("b16", noise, rng.random((14, 14)), "caption",
                                                          heads=rng.random((12, 14, 14)), prediction=prediction),
            "small (40x30 px, 3x4 map, 2 heads)": View("s", small, rng.random((3, 4)), "caption",
                                                      heads=rng.random((2, 3, 4)))}


def main() -> None:
    pio.templates.default = "streamlit"
    for name, view in views().items():
        view_html(view)  # warm: imports, Plotly's JavaScript, the template
        rounds = []
        for _ in range(5):
            start = time.process_time()
            for _ in range(4):
                view_html(view)
            rounds.append((time.process_time() - start) / 4)
        print(f"{name}: {1000 * statistics.median(rounds):.0f} ms of CPU per export (median of 5 rounds of 4)")


if __name__ == "__main__":
    main()
