"""What a browser test's Chromium costs (issue 93): the CPU of Chromium's processes for N loads of the explorer's
first page (the shipped default's sample, its prediction and its maps drawn). ``--compare launch``: each load in a
browser launched for it (what every browser test does) against one browser launched once, each load in a new
context. ``--compare flags``: tests/helpers.py's ``CHROMIUM_ARGS`` against the same without its ``RENDER_ARGS``
(each browser launched once for the N loads). ``--compare animations``: pages whose animations run against pages
held still (tests/helpers.py's ``STILL_SCRIPT``, what every browser test's pages run), the explorer's first page
as above; ``--compare spinner``: the same two, each load a page of one spinner held for 20 s (a script that runs:
what a browser test waits through while the app computes). ``--compare waits``: the explorer's first page, then
20 s of waiting for a text the page does not show, by ``expect(locator).to_be_visible()`` against
``locator.wait_for()``, Chromium's and Playwright's driver's CPU (on each poll that finds nothing, expect takes an
ARIA snapshot of the whole page for its error message). ``--compare cache``: each load in a context of its own (what
every browser test does: an off-the-record context, its HTTP cache and V8's code cache its own, so every page parses
and compiles Streamlit's bundle again) against every load a new page of one persistent profile (one cache); both held
still. ``--compare viewport``: the browser tests' 1400 x 1000 page against a 1000 x 700 one (half the pixels to
paint), held still. ``--compare tab``: each load in a context of its own against every load a ``goto`` in one
page of one context (the same renderer process, a new Streamlit session each), both held still.

    python bench/bench_browser_launch.py --loads 4 --rounds 2 \
        --out bench/results/cpu-2026-11-27/suite-browser-launch.txt
    python bench/bench_browser_launch.py --compare flags --loads 2 --rounds 3 \
        --out bench/results/cpu-2026-11-27/suite-browser-flags.txt
    python bench/bench_browser_launch.py --compare animations --loads 2 --rounds 3 \
        --out bench/results/cpu-2026-11-28/suite-browser-animations.txt
    python bench/bench_browser_launch.py --compare spinner --loads 1 --rounds 3 \
        --out bench/results/cpu-2026-11-28/suite-browser-spinner.txt
    python bench/bench_browser_launch.py --compare waits --loads 1 --rounds 3 \
        --out bench/results/cpu-2026-11-28/suite-browser-waits.txt
    python bench/bench_browser_launch.py --compare cache --loads 3 --rounds 2 \
        --out bench/results/cpu-2026-11-29e/browser-cache-per-context.txt
    python bench/bench_browser_launch.py --compare viewport --loads 2 --rounds 2 \
        --out bench/results/cpu-2026-11-29f/browser-viewport.txt
    python bench/bench_browser_launch.py --compare tab --loads 3 --rounds 2 \
        --out bench/results/cpu-2026-11-29g/browser-tab.txt

One ``streamlit run app.py`` serves both; each variant runs in a process of its own, and its Chromium processes'
CPU (user + system, /proc/PID/stat) is read every 0.2 s while it runs, each process's last reading counted (a
renderer is not a child the Python process waits for, so its rusage does not reach ours). Rounds alternate the
order, so background load slows both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # tests/helpers.py imports vit
TICK = os.sysconf("SC_CLK_TCK")
VIEWPORT = {"width": 1400, "height": 1000}
SPINNER_S = 20
EXPLORER_PAGE = "the explorer's first page, drawn"
WAIT_S = 20
PAGES = {"launch": EXPLORER_PAGE, "flags": EXPLORER_PAGE, "animations": EXPLORER_PAGE,
         "spinner": f"a page of one spinner, {SPINNER_S} s",
         "waits": f"{EXPLORER_PAGE}, then {WAIT_S} s of waiting for a text it does not show",
         "cache": EXPLORER_PAGE, "viewport": EXPLORER_PAGE, "tab": EXPLORER_PAGE}
SPINNER_APP = f"""import time
import streamlit as st
with st.spinner("Working"):
    time.sleep({SPINNER_S})
st.write("Done")
"""
VARIANTS = {"launch": ("launched per load", "shared"), "flags": ("base (no RENDER_ARGS)", "CHROMIUM_ARGS"),
            "animations": ("moving animations", "still"), "spinner": ("moving animations", "still"),
            "waits": ("expect(...).to_be_visible()", "locator.wait_for()"),
            "cache": ("contexts (one per load)", "profile (one, a page per load)"),
            "viewport": ("large (1400 x 1000)", "small (1000 x 700)"),
            "tab": ("contexts (one per load)", "tab (one page, a goto per load)")}
SMALL_VIEWPORT = {"width": 1000, "height": 700}


def loads(url: str, variant: str, count: int) -> None:
    """``count`` loads of ``url`` in ``variant``'s browsers (run in a process of its own)."""
    from helpers import BASE_ARGS, CHROMIUM, CHROMIUM_ARGS, STILL_SCRIPT
    from playwright.sync_api import Error, TimeoutError, expect, sync_playwright

    args = BASE_ARGS if variant == "base" else CHROMIUM_ARGS

    def load(page) -> None:
        page.goto(url)
        if url.endswith("#spinner"):
            page.get_by_text("Done").wait_for(timeout=180_000)
            return
        page.get_by_text("Colours span").wait_for(timeout=180_000)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] svg image').length >= 2",
                               timeout=180_000)
        absent = page.get_by_text("a text the explorer never shows")
        try:
            if variant == "expect(...).to_be_visible()":
                expect(absent).to_be_visible(timeout=WAIT_S * 1000)
            elif variant == "locator.wait_for()":
                absent.wait_for(timeout=WAIT_S * 1000)
        except (AssertionError, TimeoutError, Error):
            pass

    with sync_playwright() as playwright:
        if variant == "profile":  # one persistent profile: its HTTP cache and code cache shared by every load
            with tempfile.TemporaryDirectory() as profile:
                context = playwright.chromium.launch_persistent_context(
                    profile, executable_path=str(CHROMIUM), args=args, viewport=VIEWPORT)
                context.add_init_script(STILL_SCRIPT)
                for _ in range(count):
                    page = context.new_page()
                    load(page)
                    page.close()
                context.close()
            return

        if variant == "tab":  # one context, one page: each load a goto in it
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
            context = browser.new_context(viewport=VIEWPORT)
            context.add_init_script(STILL_SCRIPT)
            page = context.new_page()
            for _ in range(count):
                load(page)
            browser.close()
            return

        def launch():
            return playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)

        shared = launch() if variant != "launched" else None  # one browser: every variant but "launched"
        for _ in range(count):
            browser = shared or launch()
            context = browser.new_context(viewport=SMALL_VIEWPORT if variant == "small" else VIEWPORT)
            if variant in ("still", "contexts", "large", "small") or variant in VARIANTS["waits"]:
                context.add_init_script(STILL_SCRIPT)
            load(context.new_page())
            context.close()
            if shared is None:
                browser.close()
        if shared is not None:
            shared.close()


def chromium_cpu(command: list[str], kinds: tuple[bytes, ...] = (b"chromium",)) -> float:
    """Run ``command``; the CPU seconds its Chromium processes (those whose command line holds one of ``kinds``)
    spent."""
    seen: dict[tuple[int, str], float] = {}
    process = subprocess.Popen(command)
    while process.poll() is None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read()
                    if not any(kind in line for kind in kinds):
                        continue
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seen[(int(entry), fields[19])] = (int(fields[11]) + int(fields[12])) / TICK
        time.sleep(0.2)
    if process.returncode:
        raise SystemExit(f"{command} failed with {process.returncode}")
    return sum(seen.values())


def spinner_app(compare: str, folder: str) -> dict:
    """``streamlit_app``'s arguments for ``compare``: ``SPINNER_APP`` written to ``folder`` for "spinner"."""
    if compare != "spinner":
        return {}
    app = Path(folder) / "spinner.py"
    app.write_text(SPINNER_APP)
    return {"app": app}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=tuple(VARIANTS), default="launch")
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--run", nargs=3, metavar=("URL", "VARIANT", "LOADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        loads(args.run[0], args.run[1], int(args.run[2]))
        return 0
    from helpers import streamlit_app

    names = VARIANTS[args.compare]
    spent: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder, streamlit_app({}, **spinner_app(args.compare, folder)) as (url, _):
        if args.compare == "spinner":
            url += "/#spinner"
        for i in range(args.rounds):
            order = names if i % 2 == 0 else names[::-1]
            for variant in order:
                command = [sys.executable, __file__, "--run", url, variant.split()[0], str(args.loads)]
                kinds = (b"chromium", b"playwright/driver") if args.compare == "waits" else (b"chromium",)
                spent[variant].append(chromium_cpu(command, kinds) / args.loads)
    lines = [f"# python bench/bench_browser_launch.py --compare {args.compare} --loads {args.loads} "
             f"--rounds {args.rounds}",
             f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
             f"{'Chromium and its Playwright driver' if args.compare == 'waits' else 'Chromium'}'s CPU seconds "
             f"per page load ({PAGES[args.compare]}), each round's, then the median", "",
             "| browser | CPU s per load, by round | median |", "|---|---|---:|"]
    for variant, values in spent.items():
        lines.append(f"| {variant} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
