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


def test_a_scripts_bytecode_is_streamlits_own_compiled_once_per_text(tmp_path):
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1.util import patch_config_options

    streamlit_once.compile_scripts_once()  # conftest did it before this test; again changes nothing
    kept = ScriptCache.get_bytecode
    assert kept.compiled_once
    streamlit_once.compile_scripts_once()
    assert ScriptCache.get_bytecode is kept
    script = tmp_path / "page.py"
    script.write_text("x = 1\n'shown'\n")
    first = ScriptCache().get_bytecode(str(script))
    assert ScriptCache().get_bytecode(str(script)) is first  # a new cache (each AppTest run's): the kept bytecode
    assert first == kept.__wrapped__(ScriptCache(), str(script))  # Streamlit's own compilation, magic and all
    assert "transparent_write" in first.co_names  # the string shown by Streamlit's magic
    script.write_text("x = 2\n'shown'\n")  # the same size, written again: compiled again
    second = ScriptCache().get_bytecode(str(script))
    assert second is not first and 2 in second.co_consts and 1 not in second.co_consts
    with patch_config_options({"runner.magicEnabled": False}):  # no magic: its own bytecode
        plain = ScriptCache().get_bytecode(str(script))
    assert plain != second and plain == compile(script.read_text(), str(script), "exec")
