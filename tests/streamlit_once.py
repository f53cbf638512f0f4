"""Streamlit's one-time work that its ``AppTest`` repeats for every new test app, done once per test process.

Each ``AppTest``'s first run makes a new ``BidiComponentManager`` and scans every installed distribution's metadata
for custom components (``streamlit.components.v2.manifest_scanner.scan_component_manifests``): 239 distributions,
0.3 s of CPU each time, and the suite makes over a thousand AppTests (test_app.py alone: a third of its CPU in a
profile). The answer depends only on what is installed, which no test changes in its own process; the app declares
no custom component, so the scan finds none. The first scan in a process is kept and given to the later ones, each a
new list as the scan returns. A real app server (a browser test's) scans once at its start, as Streamlit does.
"""

from __future__ import annotations

import functools
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
