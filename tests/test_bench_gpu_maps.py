"""``bench/bench_gpu_maps.py`` in its CPU mode on a small model: a row per method and batch, ours against the
authors' code on the same weights (the figures themselves are measured on a GPU, not here)."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_gpu_maps.py"


def test_the_maps_bench_fills_a_row_per_method_and_ours_agree_with_the_authors(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu_maps", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "maps.md"
    assert bench.main(["--device", "cpu", "--models", "cifar-s", "--sizes", "32", "--batches", "1,2",
                       "--repeats", "1", "--analyze-images", "0", "--out", str(out)]) == 0
    cells = json.loads(out.with_suffix(".json").read_text())["cells"]
    assert [(c["batch"], c["method"]) for c in cells] == [(b, m) for b in (1, 2) for m in bench.METHODS]
    assert all(c["maps_per_s"] > 0 and "note" not in c for c in cells)
    authors = [c for c in cells if c["method"] in bench.AUTHORS]
    assert all(c["agree"] is True and c["speedup"] > 0 for c in authors), [c["agree_detail"] for c in authors]
    table = out.read_text()
    assert sum(line.startswith("| cifar-s | 32 |") for line in table.splitlines()) == len(cells)
