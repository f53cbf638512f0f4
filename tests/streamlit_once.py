"""Streamlit's one-time work that its ``AppTest`` repeats for every new test app, done once per test process.

Each ``AppTest``'s first run makes a new ``BidiComponentManager`` and scans every installed distribution's metadata
for custom components (``streamlit.components.v2.manifest_scanner.scan_component_manifests``): 239 distributions,
0.3 s of CPU each time, and the suite makes over a thousand AppTests (test_app.py alone: a third of its CPU in a
profile). The answer depends only on what is installed, which no test changes in its own process; the app declares
no custom component, so the scan finds none. The first scan in a process is kept and given to the later ones, each a
new list as the scan returns. A real app server (a browser test's) scans once at its start, as Streamlit does.

Each ``AppTest.run`` also makes a new ``ScriptCache``, so every run read, rewrote (``magic.add_magic``: an AST pass)
and compiled ``app.py`` and its page again (~8 ms of CPU a run idle, ~5 % of test_app_ask_vlm.py's samples, and the
suite runs AppTests thousands of times). A real server keeps one cache for all its sessions; here the bytecode is kept
per script path, text and magic setting, so a script written again (``AppTest.from_string``'s, a test's own) is
compiled again, and Streamlit's own compilation makes each kept one.
"""

from __future__ import annotations

import functools
import os
import sys


def scan_components_once() -> None:
    """Keep the first component scan's answer for this process's later AppTests; nothing until Streamlit is
    imported (a process running no app test never imports it for this), and nothing twice."""
    if "streamlit" not in sys.modules:
        return
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if getattr(scan, "scanned_once", False):
        return
    first = functools.cache(lambda: scan())

    @functools.wraps(scan)
    def scanned_once(max_workers: int | None = None):
        return list(first())

    scanned_once.scanned_once = True
    manifest_scanner.scan_component_manifests = scanned_once


def compile_scripts_once() -> None:
    """Keep each script's bytecode, as Streamlit's ``ScriptCache.get_bytecode`` compiles it, for this process's later
    AppTest runs of the same text (the path, the file's text and ``runner.magicEnabled`` as the key); nothing until
    Streamlit is imported, and nothing twice."""
    if "streamlit" not in sys.modules:
        return
    from streamlit import config
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.source_util import open_python_file

    compile_script = ScriptCache.get_bytecode
    if getattr(compile_script, "compiled_once", False):
        return
    kept: dict = {}

    @functools.wraps(compile_script)
    def compiled_once(self, script_path: str):
        path = os.path.abspath(script_path)
        with open_python_file(path) as f:
            key = (path, f.read(), config.get_option("runner.magicEnabled"))
        if key not in kept:  # a cache of its own: the run's may hold this path's earlier text
            kept[key] = compile_script(ScriptCache(), path)
        return kept[key]

    compiled_once.compiled_once = True
    ScriptCache.get_bytecode = compiled_once
