"""tests/streamlit_once.py: the AppTests' component scan is Streamlit's own answer, scanned once per test process."""

import streamlit_once
from streamlit.components.v2 import manifest_scanner


def test_the_kept_scan_is_streamlits_answer_as_a_new_list_and_is_scanned_once(monkeypatch):
    streamlit_once.scan_components_once()  # conftest did it before this test; again changes nothing
    kept = manifest_scanner.scan_component_manifests
    assert kept.scanned_once and kept.__wrapped__ is not kept
    streamlit_once.scan_components_once()
    assert manifest_scanner.scan_component_manifests is kept
    assert kept() == kept.__wrapped__()  # what Streamlit's scan of this environment finds (none: the app has none)
    assert kept() is not kept()  # a caller may change its list; the next gets the scan's own
    scans = []
    monkeypatch.setattr(manifest_scanner, "scan_component_manifests",
                        lambda max_workers=None: scans.append(1) or [("manifest", "root")])
    streamlit_once.scan_components_once()
    once = manifest_scanner.scan_component_manifests
    assert once() == once(max_workers=2) == [("manifest", "root")] and scans == [1]
