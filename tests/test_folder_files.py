"""The one bounded reader of a model folder's auxiliary files (issue 114, "files read by size"): what a reader sees
(a ``.gz`` inflated, as ``gzip`` inflates it), counted while it is read, refused in one line past its bound before
the rest is read, and never waiting on what is not a regular file."""

import gzip
import os
from pathlib import Path

import pytest

from vit.sources import files
from vit.sources.files import SourceError, auxiliary_problem, read_bounded


def test_a_gz_reads_as_gzip_reads_it_every_member_and_a_plain_file_as_it_is(tmp_path):
    path = tmp_path / files.BPE_VOCABULARY
    path.write_bytes(gzip.compress(b"first\n" * 1000) + gzip.compress(b"second\n"))  # two members, as cat makes
    assert read_bounded(path) == gzip.decompress(path.read_bytes()) == b"first\n" * 1000 + b"second\n"
    (tmp_path / "merges.txt").write_bytes(b"a b\n")
    assert read_bounded(tmp_path / "merges.txt") == b"a b\n"
    assert auxiliary_problem(tmp_path) is None


def test_a_gz_is_refused_as_soon_as_it_inflates_past_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CHUNK", 1024)
    path = tmp_path / files.BPE_VOCABULARY
    path.write_bytes(gzip.compress(bytes(64 * 1024)))
    inflated = []
    chunks = files._chunks(path, 4096, "its vocabulary")
    with pytest.raises(SourceError, match=r"^its vocabulary, a 0.0 MB .gz, inflates to more than the 4,096 bytes"):
        for chunk in chunks:
            inflated.append(len(chunk))
    assert sum(inflated) <= 4096 and max(inflated) <= 1024  # never more than a chunk past what was counted


def test_a_plain_file_over_its_bound_is_refused_unread_and_a_fifo_is_never_waited_on(tmp_path):
    with open(tmp_path / "tokenizer.json", "wb") as f:
        f.truncate(files.MAX_TOKENIZER_BYTES + 1)  # sparse: its size alone is read
    assert auxiliary_problem(tmp_path) == ("its tokenizer.json is 40 MB, over the 40 MB such a file may have "
                                           "(Gemma 3's is 33 MB)")
    os.unlink(tmp_path / "tokenizer.json")
    os.mkfifo(tmp_path / "chat_template.jinja")
    assert auxiliary_problem(tmp_path) == ("its chat_template.jinja is not a regular file; give the model's own "
                                           "chat_template.jinja")
    with pytest.raises(SourceError, match="is not a regular file"):
        read_bounded(tmp_path / "chat_template.jinja")


def test_a_damaged_gz_is_one_line(tmp_path):
    path = tmp_path / files.BPE_VOCABULARY
    path.write_bytes(gzip.compress(b"x" * 10_000)[:-20])
    with pytest.raises(SourceError, match=r"is not a whole .gz file \(it ends early\)") as e:
        read_bounded(path)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(SourceError, match=r"^cannot read .*bpe_simple_vocab_16e6.txt.gz \(") as e:
        read_bounded(path)
    assert "\n" not in str(e.value)


def test_the_additional_chat_templates_are_bounded_as_the_template_and_counted(tmp_path):
    """transformers reads every ``additional_chat_templates/*.jinja`` with a tokenizer or a processor."""
    templates = tmp_path / files.CHAT_TEMPLATE_DIR
    templates.mkdir()
    (templates / "tool_use.jinja").write_text("{{ messages }}")
    assert auxiliary_problem(tmp_path) is None
    with open(templates / "huge.jinja", "wb") as f:
        f.truncate(files.MAX_JSON_BYTES + 1)  # sparse: its size alone is read
    assert auxiliary_problem(tmp_path) == (f"its {files.CHAT_TEMPLATE_DIR}/huge.jinja is 4 MB, over the 4 MB such a "
                                           "file may have")
    os.unlink(templates / "huge.jinja")
    for i in range(files.MAX_TEMPLATES):
        (templates / f"t{i}.jinja").write_text("x")
    assert auxiliary_problem(tmp_path) == (f"its {files.CHAT_TEMPLATE_DIR} holds more than {files.MAX_TEMPLATES} "
                                           "files (a model has a template or a few)")


def _returns_without_waiting(call, fifo: Path):
    """``call()``'s result, or a failure when it waits on ``fifo`` (then released, so no thread is left blocked)."""
    import threading

    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        with open(fifo, "w"):  # the reader waits for a writer: one comes and goes
            pass
        thread.join(20)
        pytest.fail(f"waited on the FIFO {fifo.name}")
    return result[0]


def test_a_cache_folders_ref_that_is_a_fifo_is_never_waited_on(tmp_path, monkeypatch):
    """A listed cache folder's ``refs/main`` is read by the home page's picker for every visitor: a FIFO there stalled
    it (``read_text``), as the Hub reader's ``open`` did; both go through the bounded reader."""
    from vit.app.catalog import hf_snapshot
    from vit.sources import hub

    model = tmp_path / "models--evil--fifo"
    snapshot = model / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (model / "refs").mkdir()
    os.mkfifo(model / "refs" / "main")
    assert _returns_without_waiting(lambda: hf_snapshot(model), model / "refs" / "main") == snapshot  # the newest
    monkeypatch.setattr(hub, "cache_dir", lambda: tmp_path)
    assert _returns_without_waiting(lambda: hub.cached_snapshot(hub.parse_name("evil/fifo")),
                                    model / "refs" / "main") is None


def test_quiet_transformers_blocks_that_overlap_in_two_threads_leave_its_settings_as_they_were():
    """The explorer's sessions open models at once, and transformers' verbosity and progress bars are the
    process's: each block restored what it found, so two that overlapped (the first closed before the second)
    left transformers quiet for good, its warnings gone from the server's log."""
    import threading

    transformers = pytest.importorskip("transformers")
    before = (transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled())
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with files.quiet_transformers():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with files.quiet_transformers():
            second_in.set()
            first_out.wait(10)
            seen.append(transformers.logging.get_verbosity())  # still quiet for this one, the first closed

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == [transformers.logging.ERROR]
    assert (transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()) == before
