"""bench/suite_cpu.py: each process's CPU given to the test its worker ran then, descendants included (issue 93)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "suite_cpu.py"
spec = importlib.util.spec_from_file_location("suite_cpu", BENCH)
suite_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_cpu)


def test_a_descendants_cpu_is_its_workers_test_at_that_time(tmp_path):
    timeline = tmp_path / "timeline.txt"
    timeline.write_text("gw0 100 10.00 20.00 tests/test_a.py::test_one\n"
                        "gw1 200 10.00 40.00 tests/test_b.py::test_two\n"
                        "gw0 100 30.00 50.00 tests/test_a.py::test_three\n")
    spans = suite_cpu.read_timeline(timeline)
    rows = [(15.0, (101, "s1"), (101, 100, 1), 2.0, "Chromium", "chromium"),  # gw0's child during test_one
            (25.0, (102, "s2"), (102, 101, 100, 1), 3.0, "Chromium", "chromium"),  # a grandchild, between tests
            (35.0, (201, "s3"), (201, 200, 1), 4.0, "app servers", "streamlit"),  # gw1's child during test_two
            (35.0, (100, "s0"), (100, 1), 1.5, "pytest workers", "python"),  # gw0 itself during test_three
            (35.0, (300, "s4"), (300, 1), 5.0, "yes", "/usr/bin/yes"),  # not the suite's worker
            (35.0, (400, "s5"), (400, 100, 1), 9.0, "yes", "/usr/bin/yes")]  # running before the run: left out
    by_test, by_kind, unowned = suite_cpu.attribute(rows, spans, baseline={(400, "s5")})
    assert by_test == {"tests/test_a.py::test_one": 2.0, "(worker, between tests)": 3.0,
                       "tests/test_b.py::test_two": 4.0, "tests/test_a.py::test_three": 1.5, "(no worker)": 5.0}
    assert by_kind[("tests/test_a.py", "Chromium")] == 2.0 and by_kind[("tests/test_a.py", "pytest workers")] == 1.5
    assert unowned == {"/usr/bin/yes": 5.0}  # what "(no worker)" ran, by its command
    lines = suite_cpu.report(by_test, by_kind, wall=10.0, command=["tests"], top=10, unowned=unowned)
    assert "| Chromium | 5 | 32.3 % |" in lines and "| tests/test_b.py | 4 | 25.8 % |" in lines
    assert "| tests/test_a.py | Chromium | 2.0 |" in lines and "| `/usr/bin/yes` | 5.0 |" in lines
    # each process counted once, however many readings it has; those running before the run left out
    processes = suite_cpu.started([*rows, (36.0, (101, "s1"), (101, 100, 1), 1.0, "Chromium", "chromium")],
                                  baseline={(400, "s5")})
    assert processes == {"Chromium": 2, "app servers": 1, "pytest workers": 1, "yes": 1}
    lines = suite_cpu.report(by_test, by_kind, wall=10.0, command=["tests"], top=10, processes=processes)
    assert "| kind of process | CPU s | share | processes |" in lines and "| Chromium | 5 | 32.3 % | 2 |" in lines


def test_a_made_runs_timeline_gives_each_groups_span_and_each_modules_wall(tmp_path):
    timeline = tmp_path / "timeline.txt"
    timeline.write_text("gw0 100 10.00 20.00 tests/test_a.py::test_one@memory\n"
                        "gw1 200 10.00 40.00 tests/test_b.py::test_two\n"
                        "gw0 100 30.00 55.00 tests/test_c.py::test_three[x]@memory\n")
    out = tmp_path / "walls.txt"
    assert suite_cpu.main(["--timeline", str(timeline), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "# 3 tests in 45 s, first start to last stop"
    assert "| memory | 0 | 45 | 2 | 35 |" in lines  # from gw0's first start to its last stop, 10 + 25 s summed
    assert lines.index("| tests/test_b.py | 1 | 30 |") < lines.index("| tests/test_c.py | 1 | 25 |")


def test_kinds_of_processes():
    assert suite_cpu.kind("/usr/lib/chromium/chromium --type=renderer") == "Chromium"
    assert suite_cpu.kind("ray::RayTrainWorker") == "Ray workers"
    # a Ray worker before it names itself (importing Ray): a worker still, not one of Ray's daemons
    assert suite_cpu.kind("/venv/bin/python3 /venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py "
                          "--node-ip-address=127.0.0.1") == "Ray workers"
    assert suite_cpu.kind("/venv/bin/python3 -u /venv/lib/python3.11/site-packages/ray/_private/log_monitor.py"
                          ) == "Ray's daemons"
    assert suite_cpu.kind("/venv/bin/python -m vit.train --out x") == "vit's commands"
    assert suite_cpu.kind("/usr/bin/yes") == "yes"


@pytest.mark.slow
def test_a_run_reports_the_cpu_of_a_test_that_starts_a_busy_process(tmp_path):
    # tests/test_suite_cpu.py's own busy test, run by the bench in one process: its subprocess's second of CPU is
    # the test's
    out = tmp_path / "cpu.txt"
    done = subprocess.run([sys.executable, str(BENCH), "--out", str(out), "--", "-p", "no:xdist", "-p",
                           "no:cacheprovider", str(Path(__file__)), "-k", "busy_child"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "VIT_BUSY_CHILD": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| "): float(line.split(" | ")[1].strip(" |"))
            for line in out.read_text().splitlines() if line.startswith("| tests/test_suite_cpu.py::")}
    assert rows["tests/test_suite_cpu.py::test_busy_child"] >= 1.0, out.read_text()
    # the run's own tests' lane, collected from its selection (not the whole suite: ~14 s of CPU more)
    assert "| everyday (`pytest --quick`: 1 collected) | 1 |" in out.read_text(), out.read_text()
    # and whether the run it measured passed, in pytest's own words
    assert out.read_text().splitlines()[1].startswith("# pytest's exit status 0: 1 passed, "), out.read_text()


def test_the_outcome_is_pytests_last_line_that_counts_its_tests():
    from bench.suite_cpu import outcome

    said = "..F\n=== 1 failed, 2 passed, 3 skipped in 4.56s ===\nper-test CPU: median 0.010 s over 3 tests\n"
    assert outcome(said) == "1 failed, 2 passed, 3 skipped in 4.56s"
    assert outcome("ERROR: file or directory not found: tests/nothing.py\n") == "no line of pytest's counted its tests"


def test_busy_child():
    """Run by the test above (skipped in a normal run): a child process that spends about two seconds of CPU."""
    if "VIT_BUSY_CHILD" not in os.environ:
        pytest.skip("run by test_a_run_reports_the_cpu_of_a_test_that_starts_a_busy_process")
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 2\n"
                    "while time.process_time() < end: pass"], check=True)


def test_the_profile_gives_the_lanes_totals_and_names_each_long_test_with_its_own_why():
    """Issue 112: the everyday lane's and the whole run's CPU, and every test past 10 s with its docstring's why."""
    lane_test = "tests/test_suite_cpu.py::test_a_descendants_cpu_is_its_workers_test_at_that_time"
    long_test = ("tests/test_suite_cpu.py::"
                 "test_the_profile_gives_the_lanes_totals_and_names_each_long_test_with_its_own_why")
    by_test = {lane_test: 1.5, f"{long_test}@some-group": 12.0, "(no worker)": 99.0}
    lines = suite_cpu.lanes_report(by_test, lane={lane_test})
    assert "| everyday (`pytest --quick`: 1 collected) | 1 | 2 |" in lines and "| this run | 2 | 14 |" in lines
    named = [line for line in lines if line.startswith(f"| {long_test} |")]
    assert named == [f"| {long_test} | 12.0 | whole | Issue 112: the everyday lane's and the whole run's CPU, and "
                     "every test past 10 s with its docstring's why |"]
    assert not any(line.startswith(f"| {lane_test}") for line in lines)  # 1.5 s: not a long test


def test_the_docs_table_names_a_reports_costliest_tests_with_their_lane_and_why(tmp_path):
    """Issue 112: the docs show a run's ten costliest tests, each with its lane and why it must be that long.

    ``--costliest`` writes that table from a report this script wrote; a why past 200 characters is cut between
    words."""
    here = "tests/test_suite_cpu.py"
    lane_test = f"{here}::test_kinds_of_processes"
    long_test = f"{here}::test_the_docs_table_names_a_reports_costliest_tests_with_their_lane_and_why"
    rows = [("(no worker)", 99.0), (f"{long_test}@some-group", 30.0), (f"{here}::test_since_renamed", 20.0),
            *((f"{lane_test}[{i}]", 10.0 - i) for i in range(10))]
    report = tmp_path / "suite-cpu.txt"
    report.write_text("# python bench/suite_cpu.py -- \n# pytest's exit status 0: 13 passed\n"
                      "# Run in a clone of main, its CPU measured while nothing else ran\n"  # a context line above
                      "# 2 cores; 100 s of wall time; 190 s of CPU\n\n"
                      "| module | CPU s | share |\n|---|---:|---:|\n| tests/test_x.py | 1 | 1 % |\n\n"
                      "| test | CPU s |\n|---|---:|\n" + "".join(f"| {t} | {s:.1f} |\n" for t, s in rows) +
                      "\n| module | kind of process | CPU s |\n|---|---|---:|\n| tests/test_x.py | python | 1.0 |\n")
    table = suite_cpu.costliest_markdown(report, lane={f"{lane_test}[{i}]" for i in range(10)}).splitlines()
    assert table[0] == "# The suite's costliest tests"
    assert "2 cores; 100 s of wall time; 190 s of CPU. The 10 costliest tests" in table[2]
    body = [line for line in table if line.startswith("| `")]
    assert len(body) == 10  # (no worker) is no test; the ten costliest in the report's order
    assert body[0] == (f"| `{long_test}` | 30.0 | whole | Issue 112: the docs show a run's ten costliest tests, each "
                       "with its lane and why it must be that long |")
    assert suite_cpu.why_long(f"{here}::test_busy_child").endswith("spends about two seconds of CPU")
    (tmp_path / "test_long.py").write_text('def test_f():\n    """' + "word " * 60 + '"""\n')
    assert suite_cpu.why_long(f"{tmp_path}/test_long.py::test_f") == "word " * 39 + "word …"  # 200 characters
    assert body[1] == f"| `{here}::test_since_renamed` | 20.0 | gone | (no longer in the suite) |"
    assert body[2].startswith(f"| `{lane_test}[0]` | 10.0 | everyday | ")
    assert body[-1].startswith(f"| `{lane_test}[7]` | 3.0 | everyday | ")
