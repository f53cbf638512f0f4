"""Where the suite's CPU goes (issue 93): each test's, module's and kind of process's seconds of CPU in one run.

    python bench/suite_cpu.py --out bench/results/cpu-2026-11-27/suite-cpu.txt              # the whole suite
    python bench/suite_cpu.py --out /tmp/ray.txt -- tests/test_ray_train.py -k cluster       # pytest's arguments
    python bench/suite_cpu.py --out gate.txt --timeline GATE/timeline.txt   # a run already made: wall by module
    python bench/suite_cpu.py --costliest bench/results/cpu-DATE/suite-cpu.txt \
        --out bench/results/cpu-DATE/suite-costliest.md                      # the docs' table, from a made report

``--timeline``: no run; a file a run wrote through ``VIT_TEST_TIMELINE`` (a gate's ``bash .ci/run`` with it set), each
module's tests and wall seconds summed, and each xdist group's span on its worker (when it started and ended).

``--costliest``: no run; a report this script wrote (a whole run's), its ``COSTLIEST`` costliest tests as a Markdown
table with their lane and why each must be that long (``costliest_markdown``): the table the docs' Contributing page
shows (docs/hooks.py reads the newest ``bench/results/*/suite-costliest.md``).

A test's wall time is no measure of what it costs on two shared cores: four workers and their processes (app servers,
Chromium, a Ray cluster, the memory tests' measuring server) take turns, and a test that alone takes 15 s took 105 s
in a whole run. This runs pytest (its own ``addopts``: the workers of the README's command) with
``VIT_TEST_TIMELINE`` (tests/conftest.py: each test's worker process and wall-clock span), reads every process's CPU
(``/proc/PID/stat``: user + system) once a second, and gives each process's CPU since the last reading to the test
its xdist worker ran then: the worker itself and every process it started, however deep (a Ray job's workers, a
browser's renderers), by the chain of parents. A process that lived less than a second between two readings is not
seen; one whose parent exited before it was first read is counted as "(no worker)".
"""

from __future__ import annotations

import argparse
import bisect
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
# A process's kind, by the first of these its command line holds (else the first word of its command). A Ray worker
# is ``ray/_private/workers/default_worker.py`` until it names itself (``ray::IDLE``, ``ray::Actor``): its start, most
# of its CPU, is a worker's, not a daemon's (``ray/_private`` below: the log monitor, the agents).
KINDS = (("chromium", "Chromium"), ("playwright/driver", "Playwright's driver"), ("ray::", "Ray workers"),
         ("ray/_private/workers/", "Ray workers"), ("raylet", "Ray's daemons"), ("gcs_server", "Ray's daemons"),
         ("ray/dashboard", "Ray's daemons"),
         ("ray/_private", "Ray's daemons"), ("bin/ray start", "Ray's daemons"), ("streamlit", "app servers"),
         ("ipykernel", "notebook kernels"), ("torchrun", "torchrun"), ("-m pip", "pip"),
         ("import numpy, torch, transformers", "measuring server"),
         ("chat_template_utils", "chat-template server"), ("-m vit.", "vit's commands"),
         ("-m bench.", "bench scripts"), ("exec(eval(sys.stdin", "pytest workers"))


def kind(command: str) -> str:
    """The kind of process a command line is (``KINDS``)."""
    for key, name in KINDS:
        if key in command:
            return name
    words = command.split()
    return Path(words[0]).name if words else "?"


def processes() -> dict[int, tuple[int, str, float, str]]:
    """Every process now: pid -> (parent pid, start time, CPU seconds, command line)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we read
            continue
        if command:  # a kernel thread, or a zombie whose CPU was read while it ran
            found[int(entry)] = (int(fields[1]), fields[19], (int(fields[11]) + int(fields[12])) / TICK, command)
    return found


def sample(pytest: subprocess.Popen, every: float = 1.0) -> list[tuple[float, tuple, int, float, str, str]]:
    """(time, process key, its chain of ancestors, CPU since the last reading, kind, command's start) of each
    process that used CPU
    since the last reading, read every ``every`` seconds until ``pytest`` ends. A process's chain is read the first
    time it is seen (its parent may exit first)."""
    seen: dict[tuple, float] = {}
    chains: dict[tuple, tuple[int, ...]] = {}
    rows = []
    while True:
        now, running = time.time(), pytest.poll() is None
        table = processes()
        for pid, (parent, started, cpu, command) in table.items():
            key = (pid, started)
            if key not in chains:
                chain, at = [pid], parent
                while at in table and len(chain) < 64:
                    chain.append(at)
                    at = table[at][0]
                chains[key] = tuple(chain)
            spent = cpu - seen.get(key, 0.0)
            seen[key] = cpu
            if spent > 0:
                rows.append((now, key, chains[key], spent, kind(command), command[:90]))
        if not running:
            return rows
        time.sleep(max(0.0, every - (time.time() - now)))


def read_timeline(path: Path) -> dict[int, list[tuple[float, float, str]]]:
    """worker pid -> its tests' (start, stop, id), in order (tests/conftest.py's ``VIT_TEST_TIMELINE`` lines)."""
    spans: dict[int, list] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            _worker, pid, start, stop, test = line.split(" ", 4)
            spans[int(pid)].append((float(start), float(stop), test))
    for tests in spans.values():
        tests.sort()
    return spans


def attribute(rows, spans, baseline: set[tuple]) -> tuple[collections.Counter, collections.Counter,
                                                          collections.Counter]:
    """(CPU by test, CPU by (module, kind), CPU of "(no worker)" by command): each row's CPU given to the test its
    worker ran at its time (a second's slack either side: the reading is once a second); "(worker, between tests)"
    for a worker's collection and the gaps; "(no worker)" for a process with no worker among its ancestors (the
    controller, or one whose parent exited before it was first read); processes that ran before pytest started are
    left out."""
    starts = {pid: [s for s, _, _ in tests] for pid, tests in spans.items()}
    by_test: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    unowned: collections.Counter = collections.Counter()
    for when, key, chain, spent, what, command in rows:
        if key in baseline:
            continue
        worker = next((pid for pid in chain if pid in spans), None)
        test = "(no worker)"
        if worker is not None:
            test = "(worker, between tests)"
            i = bisect.bisect_right(starts[worker], when + 1.0) - 1
            if i >= 0 and spans[worker][i][1] >= when - 1.0:
                test = spans[worker][i][2]
        by_test[test] += spent
        by_kind[(test.split("::")[0], what)] += spent
        if worker is None:
            unowned[command] += spent
    return by_test, by_kind, unowned


def started(rows, baseline: set[tuple]) -> collections.Counter:
    """How many processes of each kind used CPU in the run (each counted once; those that ran before pytest started
    left out): where fresh interpreters are started, each paying its imports."""
    kinds = {key: what for _when, key, _chain, _spent, what, _command in rows if key not in baseline}
    return collections.Counter(kinds.values())


def report(by_test, by_kind, wall: float, command: list[str], top: int, unowned=None, processes=None) -> list[str]:
    """The report's lines: the run, then CPU by kind of process (with how many processes of each kind, where
    ``processes`` is given: ``started``), by module (``top``), by test (``top``), each module's kinds of process
    (``top`` pairs) and what "(no worker)" ran (``top`` commands)."""
    total = sum(by_test.values())
    by_module: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    for (module, what), spent in by_kind.items():
        by_module[module] += spent
        kinds[what] += spent
    lines = [f"# python bench/suite_cpu.py -- {' '.join(command)}",
             f"# {os.cpu_count()} cores; {wall:.0f} s of wall time; {total:.0f} s of CPU "
             f"({total / max(wall, 1e-9):.2f} cores busy on average)", "",
             "| kind of process | CPU s | share |" + (" processes |" if processes else ""),
             "|---|---:|---:|" + ("---:|" if processes else "")]
    lines += [f"| {what} | {spent:.0f} | {100 * spent / total:.1f} % |"
              + (f" {processes.get(what, 0)} |" if processes else "") for what, spent in kinds.most_common()]
    lines += ["", "| module | CPU s | share |", "|---|---:|---:|"]
    lines += [f"| {module} | {spent:.0f} | {100 * spent / total:.1f} % |"
              for module, spent in by_module.most_common(top)]
    lines += ["", "| test | CPU s |", "|---|---:|"]
    lines += [f"| {test} | {spent:.1f} |" for test, spent in by_test.most_common(top)]
    lines += ["", "| module | kind of process | CPU s |", "|---|---|---:|"]
    lines += [f"| {module} | {what} | {spent:.1f} |" for (module, what), spent in by_kind.most_common(top)]
    if unowned:
        lines += ["", "| (no worker): command | CPU s |", "|---|---:|"]
        lines += [f"| `{c}` | {spent:.1f} |" for c, spent in unowned.most_common(top)]
    return lines


def wall_report(spans: dict[int, list[tuple[float, float, str]]], top: int) -> list[str]:
    """A made run's wall seconds from its timeline (``read_timeline``): its span, each xdist group's (``@group``
    suffix: first start and last stop after the run's start, tests, seconds summed), each module's tests and summed
    seconds (a test's wall time measures its neighbours too)."""
    tests = [test for worker in spans.values() for test in worker]
    began, ended = min(t[0] for t in tests), max(t[1] for t in tests)
    groups: dict[str, list] = {}
    modules: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for start, stop, test in tests:
        name = test.split("::")[-1]
        if "@" in name:
            group = groups.setdefault(name.rsplit("@", 1)[1], [stop, start, 0, 0.0])
            group[0], group[1] = min(group[0], start), max(group[1], stop)
            group[2], group[3] = group[2] + 1, group[3] + stop - start
        modules[test.split("::")[0]][0] += 1
        modules[test.split("::")[0]][1] += stop - start
    lines = [f"# {len(tests)} tests in {ended - began:.0f} s, first start to last stop", "",
             "| group | from s | to s | tests | wall s (summed) |", "|---|---:|---:|---:|---:|"]
    for name, (start, stop, count, seconds) in sorted(groups.items(), key=lambda kv: -kv[1][3])[:top]:
        lines.append(f"| {name} | {start - began:.0f} | {stop - began:.0f} | {count} | {seconds:.0f} |")
    lines += ["", "| module | tests | wall s (summed) |", "|---|---:|---:|"]
    for module, (count, seconds) in sorted(modules.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"| {module} | {count} | {seconds:.0f} |")
    return lines


LONG_CPU_S = 10.0  # a test past this many seconds of CPU is named with why it must be that long (issue 112)


def test_id(node: str) -> str:
    """A timeline's test id without xdist's ``@group`` suffix (the id ``--collect-only`` prints)."""
    return node.rsplit("@", 1)[0] if "@" in node.rpartition("::")[2] else node


def lane_ids(args: list[str] | None = None) -> set[str]:
    """The ids of the tests the everyday lane runs (``pytest --quick``), collected without running them: of the tests
    ``args`` (pytest's arguments) select, else of the whole suite, which is also collected where pytest refuses
    ``args`` for a collection (an xdist option: it collects in one process). A run's report needs only its own
    tests' lane, and a selection is collected in seconds where the whole suite takes ~14 s of CPU."""
    def collect(*selection: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "--quick",
                               *selection], cwd=ROOT, capture_output=True, text=True)

    done = collect(*(args or []))
    if done.returncode not in (0, 5):  # pytest's exit codes: collected, or nothing to collect
        done = collect()
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def why_long(test: str) -> str:
    """Why a test takes long, in its own words: its docstring's first sentence, else its module's (read from the
    source, nothing imported); the docstring is where a costly test must say why it cannot be cheaper."""
    import ast

    path, _, name = test.partition("::")
    function = name.split("[")[0].split("::")[-1]
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        return "(its file cannot be read)"
    said = next((ast.get_docstring(node) for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function), None)
    said = said or ast.get_docstring(tree) or "(no docstring: say there why it must be this long)"
    first = " ".join(said.split()).split(". ")[0].rstrip(".")
    return first if len(first) <= 200 else first[:200].rsplit(" ", 1)[0] + " …"  # cut between words


def lanes_report(by_test, lane: set[str]) -> list[str]:
    """The everyday lane's and the whole run's tests and CPU, then every test past ``LONG_CPU_S`` with its why."""
    tests = {test: spent for test, spent in by_test.items() if "::" in test}
    in_lane = {test: spent for test, spent in tests.items() if test_id(test) in lane}
    # a test a 1-s sample never caught running spent under a sample's CPU: it is in the lane, not in these rows
    lines = ["", "| lane | tests a sample caught | CPU s (theirs) |", "|---|---:|---:|",
             f"| everyday (`pytest --quick`: {len(lane):,} collected) | {len(in_lane)} | {sum(in_lane.values()):.0f} |",
             f"| this run | {len(tests)} | {sum(tests.values()):.0f} |"]
    long = sorted(((spent, test) for test, spent in tests.items() if spent > LONG_CPU_S), reverse=True)
    lines += ["", f"| test over {LONG_CPU_S:.0f} s of CPU | CPU s | lane | why it must be that long |",
              "|---|---:|---|---|"]
    lines += [f"| {test_id(test)} | {spent:.1f} | {'everyday' if test_id(test) in lane else 'whole'} | "
              f"{why_long(test_id(test)).replace('|', '/')} |" for spent, test in long]
    return lines


COSTLIEST = 10  # the tests the docs' Contributing page names, with why each must be that long


def report_tests(lines: list[str]) -> dict[str, float]:
    """{test id: CPU s} of a report's per-test table (``| test | CPU s |``, costliest first), its ``@group``
    suffixes dropped."""
    start = lines.index("| test | CPU s |") + 2
    found = {}
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        test, spent = line[2:-2].rsplit(" | ", 1)
        if "::" in test:  # not "(no worker)" or "(worker, between tests)"
            found[test_id(test)] = float(spent)
    return found


def still_there(test: str) -> bool:
    """Whether a test's function still stands in its file (read from the source, nothing imported)."""
    import ast

    path, _, name = test.partition("::")
    function = name.split("[")[0].split("::")[-1]
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
               for node in ast.walk(tree))


def costliest_markdown(report: Path, count: int = COSTLIEST, lane: set[str] | None = None) -> str:
    """The ``count`` costliest tests of a made report as a Markdown table: CPU seconds, the lane that runs each
    (``everyday`` when ``pytest --quick`` collects it today, else ``whole``; ``gone`` for a test no longer in the
    suite) and why it must be that long, in its docstring's words (``why_long``). ``lane`` is the everyday lane's
    ids; None collects them from the tests' own files."""
    lines = report.read_text().splitlines()
    tests = list(report_tests(lines).items())[:count]
    if lane is None:
        lane = lane_ids(sorted({test.partition("::")[0] for test, _ in tests}))
    header = itertools.takewhile(lambda line: line.startswith("#"), lines)  # a context line may come anywhere in it
    run = next((line[2:] for line in header if re.match(r"# \d+ cores; .* of CPU", line)), "")
    name = report.relative_to(ROOT).as_posix() if report.is_relative_to(ROOT) else str(report)
    rows = ["# The suite's costliest tests", "",
            f"From `{name}`: {run}. The {len(tests)} costliest tests by their own CPU seconds, their processes' "
            "included (app servers, Chromium, Ray workers, the memory tests' measuring server).", "",
            "| test | CPU s | lane | why it must be that long |", "|---|---:|---|---|"]
    for test, spent in tests:
        where = "everyday" if test in lane else "whole" if still_there(test) else "gone"
        why = why_long(test) if where != "gone" else "(no longer in the suite)"
        rows.append(f"| `{test}` | {spent:.1f} | {where} | {why.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def outcome(said: str) -> str:
    """pytest's last line that counts its tests ("5,284 passed, 30 skipped in 923.61s"), or that none was found: a
    report says whether the run it measured passed."""
    found = [line.strip(" =") for line in said.splitlines()
             if re.search(r"\d+ (passed|failed|error|errors|skipped|deselected)\b", line)]
    return found[-1] if found else "no line of pytest's counted its tests"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the report (Markdown tables)")
    parser.add_argument("--top", type=int, default=60, help="modules and tests listed (default 60)")
    parser.add_argument("--timeline", type=Path, help="no run: report a made run's VIT_TEST_TIMELINE file")
    parser.add_argument("--costliest", type=Path, metavar="REPORT",
                        help=f"no run: the {COSTLIEST} costliest tests of a report this script wrote, as the docs' "
                             "Markdown table (write it to bench/results/cpu-DATE/suite-costliest.md)")
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments, after --")
    args = parser.parse_args(argv)
    if args.costliest is not None:
        table = costliest_markdown(args.costliest.resolve())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
        print(table, end="")
        return 0
    if args.timeline is not None:
        lines = wall_report(read_timeline(args.timeline), args.top)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        timeline = Path(folder) / "timeline.txt"
        baseline = {(pid, started) for pid, (_, started, _, _) in processes().items()}
        began = time.time()
        output = Path(folder) / "pytest.txt"  # pytest's own output, for its outcome line (and shown at the end)
        with open(output, "w") as out:
            pytest = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *args.pytest_args], cwd=ROOT,
                                      env={**os.environ, "VIT_TEST_TIMELINE": str(timeline)}, stdout=out,
                                      stderr=subprocess.STDOUT)
            rows = sample(pytest)
        wall = time.time() - began
        by_test, by_kind, unowned = attribute(rows, read_timeline(timeline), baseline)
        said = output.read_text(errors="replace")
    print(said[-4000:], end="")
    lines = report(by_test, by_kind, wall, args.pytest_args, args.top, unowned, started(rows, baseline))
    lines.insert(1, f"# pytest's exit status {pytest.returncode}: {outcome(said)}")
    lines += lanes_report(by_test, lane_ids(args.pytest_args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))
    return pytest.returncode


if __name__ == "__main__":
    sys.exit(main())
