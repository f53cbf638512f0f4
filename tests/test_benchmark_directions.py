"""The benchmarks' tables say which side of each score is better (issue 76, item 10), as each paper defines it: the
report's Markdown (the command's stderr and ``--out``'s faithfulness.md) and the Analyse page's table."""

import numpy as np
import pytest

from vit.explain.benchmarks import benchmark_run
from vit.explain.benchmarks import metrics as bench

# From the papers, not from our code: Petsiuk et al. 2018 (RISE): deletion's area low, insertion's high; Chefer et al.
# 2021: positive perturbation (most relevant removed first) low, negative high, segmentation's pixel accuracy, mIoU
# and mAP high; Rong et al. 2022 (ROAD, its values the probability after imputation minus before): most relevant
# first low, least relevant first high, their combined (least - most) / 2 high; Wu et al. 2024: SaCo high.
PAPERS = {"deletion_auc": "↓", "insertion_auc": "↑", "positive_auc": "↓", "negative_auc": "↑",
          "pixel_accuracy": "↑", "mIoU": "↑", "mAP": "↑", "most_relevant_first": "↓", "least_relevant_first": "↑",
          "combined": "↑", "saco": "↑", "images_per_s": "↑"}


def report(benchmark: str, parts: list) -> dict:
    """A benchmark's report of one method, its scores from ``summary`` as the command's."""
    scores = benchmark_run.summary(benchmark, parts, accuracy=0.75)
    scores["images_per_s"] = 10.0
    return {"benchmark": benchmark, "methods": {"rollout": scores}}


SEGMENTATION = [(np.array([5]), np.array([8]), np.array([[2, 3]]), np.array([[4, 4]]), np.array([0.5]))]
REPORTS = {
    "deletion": {"methods": {"rollout": {"deletion_auc": {"mean": 0.2, "std": 0.1},
                                         "insertion_auc": {"mean": 0.6, "std": 0.1}}}},
    "segmentation": report("segmentation", SEGMENTATION),
    "perturbation": report("perturbation", [[np.full((9, 2), 0.5), np.full((9, 2), 0.7)]]),
    "road": report("road", [[np.full((9, 2), -0.1), np.full((9, 2), -0.3)]]),
    "saco": report("saco", [np.array([0.4, np.nan])]),
}


@pytest.mark.parametrize("benchmark", list(REPORTS))
def test_every_score_column_of_every_benchmark_says_its_better_side_as_its_paper_defines_it(benchmark):
    table = benchmark_run.table(REPORTS[benchmark])
    head = table.splitlines()[0]
    columns, _ = benchmark_run.table_rows(REPORTS[benchmark])
    scored = [c for c in columns if c in PAPERS]
    assert scored, columns
    for column in scored:
        assert f"| {column} {PAPERS[column]} |" in head, (column, head)
    for column in set(columns) - set(PAPERS):  # a spread or a count: no better side
        assert f"| {column} |" in head, (column, head)


def test_the_legend_under_the_table_says_what_the_arrows_mean():
    table = benchmark_run.table(REPORTS["perturbation"])
    assert table.splitlines()[-1] == "↑ higher is better; ↓ lower is better (images_per_s: faster)."
    assert benchmark_run.legend(["saco_std", "undefined"]) == ""
    assert benchmark_run.legend(["mAP"]) == "↑ higher is better."


def test_the_report_file_carries_the_directions(tmp_path):
    result = {**REPORTS["road"], "images": 2, "data": "d", "checkpoint": "m.pt",
              "removed": [(100 - q) / 100 for q in bench.ROAD_PERCENTILES]}
    benchmark_run.write_out(tmp_path, result)
    text = (tmp_path / "faithfulness.md").read_text()
    assert "| method | most_relevant_first ↓ | least_relevant_first ↑ | combined ↑ | images_per_s ↑ |" in text
    assert "↓ lower is better" in text


def test_every_direction_is_a_score_the_benchmarks_report():
    reported = {c for result in REPORTS.values() for c in benchmark_run.table_rows(result)[0]}
    assert set(bench.BETTER) == set(PAPERS) <= reported
