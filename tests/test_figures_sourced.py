"""Every speed or memory figure the README and the docs give names the file under ``bench/results/`` it was read
from (issue 83, item 3): a line with a measured figure (a ratio such as ``1.24x``, a size in MB or GB, a rate in
maps/s or img/s) beside a word of measurement must name ``bench/results/`` within a few lines of it, in its
paragraph, every page under docs/ included. ``UNSOURCED`` counted the lines written before this rule, per page, as a
ratchet; it is empty now: a figure whose file was never kept was taken out, its bench named instead."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the models/ pages too
# A ratio is written 1.24x, 1.24 x or 1.24× (a range 0.84–0.88× too); "16,384 × 16,384" is a product, not one.
FIGURE = re.compile(r"\b\d[\d,]*(\.\d+)? ?[x×](?![\w])(?!\s*\d)"
                    r"|\b\d[\d,]*(\.\d+)? ?(MB|GB|MiB|GiB)\b|\b(maps|img|images|tokens)/s\b")
# "CPU" alone names a device (a setting: "on a CPU about 1 MB"); "CPU s" or "CPU time" is a measurement.
MEASURED = re.compile(r"\b(measured|median|medians|theirs|faster|slower|peak|load|bench\w*|CPU (s|time|seconds)"
                      r"|ratio)\b", re.IGNORECASE)
NEAR = 6  # lines: a figure's sentence and the one or two that name its file
# Lines with a figure and no bench/results file, per page: none (a page that gains one fails).
UNSOURCED: dict[str, int] = {}


def paragraphs(text: str) -> list[str]:
    """The page's blocks between blank lines, fenced code left out (a command's own output is not a claim)."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def unsourced(text: str) -> list[str]:
    """The lines of ``text`` that give a measured figure with no ``bench/results/`` named within ``NEAR`` lines of
    them in their paragraph (the pages run many measurements into one paragraph: the whole would hide them)."""
    found = []
    for paragraph in paragraphs(text):
        lines = paragraph.splitlines()
        for i, line in enumerate(lines):
            if FIGURE.search(line) and MEASURED.search(line) and not any(
                    "bench/results/" in near for near in lines[max(0, i - NEAR):i + NEAR + 1]):
                found.append(line)
    return found


def test_a_measured_figure_without_its_results_file_is_found_and_one_with_it_is_not():
    assert unsourced("EigenCAM through vit.explain: 1.02x theirs (pairs, one thread).")
    assert unsourced("The peak was 807 MB under load 6.")
    assert not unsourced("1.02x theirs, one thread (`bench/results/cpu-2026-11-25/cam-explain.txt`).")
    assert not unsourced("Uploads are kept up to 256 MB in all.")  # a setting, not a measurement
    assert not unsourced("```\n| eigencam | 1.02x theirs |\n```")
    assert unsourced("LeGrad took 0.84–0.88× the authors' CPU time.")  # a range, and the sign ×
    assert unsourced("all five in 20.7 s against 48.6 s (2.35 x), measured")
    assert not unsourced("one bias over 16,384 × 16,384 pairs, 4 GB, is refused")  # a product, computed


def test_no_page_gains_a_figure_without_its_bench_results_file():
    counts = {str(page.relative_to(ROOT)): len(unsourced(page.read_text())) for page in PAGES}
    over = {page: (n, UNSOURCED.get(page, 0)) for page, n in counts.items() if n > UNSOURCED.get(page, 0)}
    assert not over, ("name the bench/results/ file (with its command, machine and load) beside each figure; "
                      f"(page: (unsourced lines, allowed)): {over}\n"
                      + "\n---\n".join(p[:300] for page in over for p in unsourced((ROOT / page).read_text())))
    lower = {page: (n, UNSOURCED[page]) for page, n in counts.items() if n < UNSOURCED.get(page, 0)}
    assert not lower, f"fewer unsourced lines now: lower UNSOURCED to these counts: {lower}"
