"""``bench/bench_vlm_answer.py`` on a tiny Qwen2.5-VL: each side answers in its own process and fills its row, the
two answers are the same tokens, and the ratios are written (the figures themselves are measured in bench/, on
published models' widths, not here). Each side's process is forked from one that imported transformers and the
family's modeling module once (``measure``): 14 s of CPU for the test, 20.6 s with a fresh interpreter per side
(bench/results/cpu-2026-11-29/vlm-bench-one-import.txt). One family only; the others' --tiny runs were checked by
hand (bench/results/cpu-2026-11-27/vlm-answer-families.txt)."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # a process that imports transformers, and a side's answer in each of two forks

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_vlm_answer.py"


# Two sides' processes, each answering twice (forked after the imports since issue 112; with a fresh interpreter
# each, 43 s of CPU and 107 s of wall beside four busy processes here, past the suite's 300 s in a gate at load 13-14)
@pytest.mark.timeout(900)
def test_the_bench_fills_both_sides_rows_and_the_ratios(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_vlm_answer", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclass looks its module up there
    spec.loader.exec_module(bench)
    out = tmp_path / "vlm-answer.txt"
    assert bench.main(["--family", "qwen2_5_vl", "--tiny", "--layers", "2", "--vision-layers", "2", "--sizes", "56",
                       "--new-tokens", "2", "--rounds", "1", "--folder", str(tmp_path / "model"), "--out",
                       str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines == capsys.readouterr().out.splitlines()[-len(lines):]  # written as printed
    assert lines[0].startswith("# python -m bench.bench_vlm_answer --family qwen2_5_vl --tiny")
    assert "2 language-model and 2 tower layers" in lines[2]
    [theirs] = [line for line in lines if "| transformers, eager, output_attentions |" in line]
    [ours] = [line for line in lines if "| vit.ask_vlm |" in line]
    for row in (theirs, ours):
        assert row.startswith("| 56 px, 4x4 patches, ") and "2 answer tokens |" in row  # the same answer: no DIFFER
    [ratios] = [line for line in lines if line.startswith("| 56 px |")]
    assert len([float(cell) for cell in ratios.strip("| ").split(" | ")[1:]]) == 5
