"""Opening a model by its Hub id: the real huggingface_hub client against a local server that speaks the Hub's
protocol (tests/hub_server.py, at HF_ENDPOINT), with tiny models built with random weights by transformers."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import displayed, selectbox_labelled
from PIL import Image
from safetensors.torch import load_file

from vit import predict
from vit.app import catalog
from vit.sources import hub
from vit.sources.open import open_source
from vit.training.finetune import prepare_init

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds
ROOT = Path(__file__).resolve().parent.parent
CLASSES = ["cat", "dog", "fox"]
EVIL = b"import os\nos.system('touch /tmp/pwned')\n"


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory):
    """A tiny random HF ViT classifier saved with save_pretrained (config.json, model.safetensors)."""
    folder = tmp_path_factory.mktemp("tiny-vit")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, id2label=dict(enumerate(CLASSES)),
                                    label2id={c: i for i, c in enumerate(CLASSES)})
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    return folder


@pytest.fixture
def repo(fake_hub, tiny_vit):
    """``acme/tiny-vit``: the model, plus what opening never needs (code, a pickle copy, docs, ONNX)."""
    pickle_copy = tiny_vit.parent / "pickle.bin"
    torch.save(load_file(tiny_vit / "model.safetensors"), pickle_copy)
    fake_hub.add_folder("acme/tiny-vit", tiny_vit, {"modeling_evil.py": EVIL, "pytorch_model.bin":
                                                    pickle_copy.read_bytes(), "README.md": b"# tiny",
                                                    "onnx/model.onnx": b"\0" * 64})
    return "acme/tiny-vit"


def same_outputs(a, b) -> None:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(a.model(x)[0], b.model(x)[0], rtol=0, atol=0)


def test_a_hub_id_opens_the_model_fetching_only_its_config_and_safetensors(repo, fake_hub, tiny_vit):
    checkpoint = open_source(repo)
    assert sorted(fake_hub.fetched("GET")) == ["config.json", "model.safetensors"]
    assert not any("modeling_evil.py" in r.path for r in fake_hub.requests)  # code is never even asked for
    assert checkpoint.class_names == CLASSES
    same_outputs(checkpoint, open_source(tiny_vit))


def test_predict_takes_a_hub_id_and_says_how_much_it_downloads_first(repo, fake_hub, tmp_path, capsys):
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(image)
    assert predict.main([repo, str(image), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    size = sum(len(fake_hub.repos[repo].files[f]) for f in ("config.json", "model.safetensors"))
    assert f"downloading {repo}: 2 files, {hub.format_bytes(size)}" in err
    assert json.loads(out)[0]["predictions"][0]["label"] in CLASSES


def test_predict_says_in_one_line_when_a_hub_model_cannot_be_opened(fake_hub, capsys, tmp_path):
    photo = tmp_path / "photo.png"  # it exists: a missing image is reported first, before the Hub is asked
    photo.write_bytes(b"")
    assert predict.main(["acme/nothing-here", str(photo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit.predict: error: acme/nothing-here is neither") and err.count("\n") == 1


def test_train_init_takes_a_hub_id(repo):
    init = prepare_init(repo, num_classes=3, class_names=CLASSES)
    assert not init.head_replaced and init.config.num_layers == 2


def test_a_revision_after_at_is_the_one_opened_and_an_unknown_one_is_one_line(repo, fake_hub):
    sha = fake_hub.repos[repo].sha
    assert open_source(f"{repo}@{sha}").class_names == CLASSES
    with pytest.raises(hub.HubError, match=f"^{repo} has no revision 'v9'"):
        open_source(f"{repo}@v9")


def test_a_cached_model_opens_offline_without_asking_the_hub(repo, fake_hub, monkeypatch):
    from huggingface_hub import constants

    open_source(repo)
    seen = len(fake_hub.requests)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert open_source(repo).class_names == CLASSES
    assert len(fake_hub.requests) == seen


def test_a_cached_model_opens_when_the_hub_cannot_be_reached(repo, fake_hub, monkeypatch):
    from huggingface_hub import constants

    open_source(repo)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: connection refused
    assert open_source(repo).class_names == CLASSES
    with pytest.raises(hub.HubError, match="^acme/elsewhere is neither a file or folder here nor in the Hugging "
                                           "Face cache, and the Hub at http://127.0.0.1:9 cannot be reached ") as e:
        open_source("acme/elsewhere")
    assert "Connection refused" in str(e.value) and "\n" not in str(e.value)  # where, and why: a proxy's, a typo's


def test_offline_with_nothing_cached_is_one_line_naming_the_model(fake_hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubError) as caught:
        open_source("acme/never-downloaded")
    message = str(caught.value)
    assert "acme/never-downloaded" in message and "HF_HUB_OFFLINE" in message and "\n" not in message
    with pytest.raises(hub.HubError) as caught:  # the pages' road: the file list, asked of the Hub
        hub.plan(hub.parse_name("acme/never-downloaded"))
    message = str(caught.value)
    assert "downloading is off" in message and "unset HF_HUB_OFFLINE to download it" in message, message
    assert fake_hub.requests == []


def test_a_gated_model_says_to_accept_its_licence_and_set_hf_token(fake_hub, tiny_vit, monkeypatch):
    fake_hub.add_folder("meta/gated-vit", tiny_vit, gated=True)
    with pytest.raises(hub.HubError) as caught:
        open_source("meta/gated-vit")
    message = str(caught.value)
    assert "accept its licence" in message and "https://huggingface.co/meta/gated-vit" in message
    assert "HF_TOKEN" in message and "\n" not in message
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    assert open_source("meta/gated-vit").class_names == CLASSES


def test_a_model_that_is_not_on_the_hub_is_one_line(fake_hub):
    with pytest.raises(hub.HubError, match="^acme/nothing-here is neither a file or folder here nor a model on the "
                                           "Hub"):
        open_source("acme/nothing-here")
    assert fake_hub.requests[0].path == "/api/models/acme/nothing-here"


def test_a_model_over_the_download_bound_is_refused_before_any_download(repo, fake_hub, monkeypatch):
    monkeypatch.setenv("VIT_MAX_DOWNLOAD_GB", "0.000001")  # 1 kB
    with pytest.raises(hub.HubError) as caught:
        open_source(repo)
    assert "VIT_MAX_DOWNLOAD_GB" in str(caught.value) and "1.0 kB" in str(caught.value)
    assert fake_hub.fetched("GET") == [] and fake_hub.fetched("HEAD") == []


def test_a_model_larger_than_the_caches_free_disk_is_refused_before_any_download(repo, fake_hub, monkeypatch):
    """huggingface_hub only warns when a file will not fit, then fills the disk the server writes its uploads and
    runs to: the download is refused first, keeping a reserve."""
    size = sum(len(fake_hub.repos[repo].files[f]) for f in ("config.json", "model.safetensors"))
    monkeypatch.setattr(hub, "free_bytes", lambda folder: hub.DISK_RESERVE_BYTES + size - 1)
    with pytest.raises(hub.HubError) as caught:
        open_source(repo)
    message = str(caught.value)
    assert message.startswith(f"{repo} is {hub.format_bytes(size)}, and the disk of the server's Hugging Face cache "
                              f"has {hub.format_bytes(hub.DISK_RESERVE_BYTES + size - 1)} free") and "\n" not in message
    assert str(hub.cache_dir()) not in message, "no path of the server for a visitor"
    assert fake_hub.fetched("GET") == []
    monkeypatch.setattr(hub, "free_bytes", lambda folder: hub.DISK_RESERVE_BYTES + size)
    assert open_source(repo).class_names == CLASSES


def test_the_bytes_a_download_under_way_has_still_to_write_count_as_taken(repo, fake_hub, tiny_vit, monkeypatch):
    """The pages run two downloads at once, and each was checked at its start against the disk's free space alone,
    which the first had yet to take: two that fitted one at a time filled the disk together. What a download under
    way has still to write counts as taken, until it ends (done, stopped or failed)."""
    import threading

    fake_hub.repos[repo].pace["model.safetensors"] = 2000  # 2 kB at a time until released
    fake_hub.add_folder("acme/other", tiny_vit)
    first, second = hub.plan(hub.parse_name(repo)), hub.plan(hub.parse_name("acme/other"))
    ended = []
    under_way = threading.Thread(target=lambda: ended.append(hub.download(first, lambda done, total: None)))
    under_way.start()
    try:
        for _ in range(600):
            if fake_hub.sent.get("model.safetensors"):
                break
            time.sleep(0.05)
        monkeypatch.setattr(hub, "free_bytes", lambda folder: hub.DISK_RESERVE_BYTES + second.size)  # fits alone
        with pytest.raises(hub.HubError) as caught:
            hub.check_size(second)
        message = str(caught.value)
        assert "of it for the downloads under way" in message and "\n" not in message, message
    finally:
        fake_hub.release.set()
        under_way.join(60)
    assert ended, "the first download ended"
    hub.check_size(second)  # its bytes are on the disk now, which free_bytes says: nothing under way


def test_the_free_disk_is_the_nearest_existing_folders(tmp_path):
    import shutil

    assert hub.free_bytes(tmp_path / "not" / "made" / "yet") == shutil.disk_usage(tmp_path).free


def test_only_what_is_still_to_download_counts_against_the_bound(repo, fake_hub, monkeypatch):
    open_source(repo)
    fetched = fake_hub.fetched("GET")
    monkeypatch.setenv("VIT_MAX_DOWNLOAD_GB", "0.000001")
    assert open_source(repo).class_names == CLASSES  # online, the Hub asked, nothing fetched again
    assert fake_hub.fetched("GET") == fetched


def test_an_interrupted_download_resumes_where_it_stopped(repo, fake_hub, tiny_vit, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # written to disk in 4 kB chunks (10 MB by default)
    fake_hub.cut_once.add("model.safetensors")
    checkpoint = open_source(repo)
    gets = [r for r in fake_hub.requests if r.method == "GET" and r.path.endswith("/model.safetensors")]
    size = len(fake_hub.repos[repo].files["model.safetensors"])
    assert len(gets) == 2 and "range" not in gets[0].headers
    resumed_at = int(gets[1].headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert size // 2 - 4096 < resumed_at <= size // 2  # what had arrived is not fetched again
    same_outputs(checkpoint, open_source(tiny_vit))


def test_a_pickle_is_fetched_only_when_there_are_no_safetensors(fake_hub, tiny_vit):
    state = load_file(tiny_vit / "model.safetensors")
    pickle_copy = tiny_vit.parent / "only.bin"
    torch.save(state, pickle_copy)
    fake_hub.add("acme/pickle-vit", {"config.json": (tiny_vit / "config.json").read_bytes(),
                                     "pytorch_model.bin": pickle_copy.read_bytes(), "training_args.bin": b"x"})
    checkpoint = open_source("acme/pickle-vit")
    assert sorted(fake_hub.fetched("GET")) == ["config.json", "pytorch_model.bin"]
    same_outputs(checkpoint, open_source(tiny_vit))


def test_timm_and_open_clip_names_resolve_through_their_own_registries():
    import open_clip

    assert hub.parse_name("vit_base_patch16_224.augreg_in21k").repo_id == "timm/vit_base_patch16_224.augreg_in21k"
    assert hub.parse_name("ViT-B-16-SigLIP2").repo_id == "timm/ViT-B-16-SigLIP2"
    assert hub.HF_HUB_PREFIX == open_clip.factory.HF_HUB_PREFIX
    assert hub.parse_name("hf-hub:timm/ViT-B-16-SigLIP2").repo_id == "timm/ViT-B-16-SigLIP2"
    assert hub.parse_name("google/vit-base-patch16-224@v1") == hub.HubName("google/vit-base-patch16-224", "v1",
                                                                           "google/vit-base-patch16-224@v1")
    assert hub.parse_name("not_a_model_anywhere") is None
    assert not hub.looks_like_name("runs/best.pt")  # a missing weights file stays "not found"


# -- the explorer's "Open from the Hub" -------------------------------------------------------------------------

@pytest.fixture
def app_world(tmp_path, monkeypatch, fake_hub):
    """The app with no shipped checkpoints or runs, its HF cache the fake Hub's."""
    import streamlit as st

    for name in ("checkpoints", "runs"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    st.cache_data.clear()
    st.cache_resource.clear()
    catalog.forget_hub_plans()  # file lists read from another test's Hub
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


def explorer_with_hub_id(text: str, address: str = "localhost"):
    from streamlit import config
    from streamlit.testing.v1 import AppTest

    before = config.get_option("server.address")
    config.set_option("server.address", address)
    try:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
        at.run()
        next(w for w in at.sidebar.text_input if w.label == "Open from the Hub").set_value(text)
        at.run()
        buttons = [b for b in at.sidebar.button if b.label.startswith("Download")]
        if buttons:
            buttons[0].click()
            at.run()
    finally:
        config.set_option("server.address", before)
    assert not at.exception, [e.message for e in at.exception]
    return at, buttons


def test_the_explorer_shows_a_hub_models_size_then_downloads_and_opens_it(app_world, repo, fake_hub):
    at, buttons = explorer_with_hub_id(repo)  # the page waits for the download here (conftest: QUICK_S)
    size = sum(len(fake_hub.repos[repo].files[f]) for f in ("config.json", "model.safetensors"))
    assert [b.label for b in buttons] == [f"Download {hub.format_bytes(size)}"]
    # Once it is done, its size, its button and its bar leave the sidebar (they once stayed until the next click).
    assert not at.sidebar.get("progress") and not [b for b in at.sidebar.button if b.label.startswith("Download")]
    assert not [c for c in at.sidebar.caption if hub.format_bytes(size) in c.value]
    assert sorted(fake_hub.fetched("GET")) == ["config.json", "model.safetensors"]
    picker = next(w for w in at.sidebar.selectbox if w.label == "Checkpoint")
    assert picker.value == str(hub.cached_snapshot(hub.parse_name(repo)))
    assert not at.error


def hub_typed(text: str):
    """The explorer, served on localhost, with ``text`` typed in its "Open from the Hub" field."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180).run()
    next(w for w in at.sidebar.text_input if w.label == "Open from the Hub").set_value(text)
    return at.run()


def the_download(repo: str):
    """The server's one download of ``repo``'s files (``hub_download``'s registry)."""
    from app_pages.explorer_sections import hub_download

    jobs = [job for job in hub_download.downloads(hub_download.at_once()).works() if job.key[1] == repo]
    assert len(jobs) == 1, jobs
    return jobs[0]


@pytest.fixture
def slow_weights(repo, fake_hub, monkeypatch):
    """``repo`` with its weights sent 2 kB every 0.2 s until ``fake_hub.release`` is set (seconds, not the
    test's whole budget), its page not waiting for the download (``QUICK_S``: the browser's pace, not AppTest's)."""
    from app_pages.explorer_sections import hub_download

    fake_hub.repos[repo].pace["model.safetensors"] = 2000
    monkeypatch.setattr(hub_download, "QUICK_S", 0.0)
    return repo


def test_a_download_goes_on_through_the_pages_reruns_and_the_model_opens_when_it_ends(app_world, slow_weights,
                                                                                       fake_hub):
    """The download ran in the script run of its click: the next message from the browser (an upload, any click)
    stopped that run, and with it the transfer, and its unfinished file was deleted: the visitor saw the Download
    button again and a large model started over. It runs beside the page now, which only watches it."""
    repo = slow_weights
    at = hub_typed(repo)
    next(b for b in at.sidebar.button if b.label.startswith("Download")).click()
    at.run()
    job = the_download(repo)
    assert job.state in ("waiting", "running") and not job.finished
    bars = [p for p in at.sidebar.get("progress")]
    assert bars and displayed(bars[0].proto.text).startswith(f"Downloading {repo}: "), "drawn where its button was"
    assert [b.label for b in at.sidebar.button if b.key == "explorer_hub_download-stop"] == ["Stop"]
    assert not [b for b in at.sidebar.button if b.label.startswith("Download")], "the bar took the button's place"
    at.run()  # what any message from the browser does while it runs
    assert the_download(repo) is job and not job.finished, "the rerun neither stopped it nor started another"
    assert not [b for b in at.sidebar.button if b.label.startswith("Download")]
    fake_hub.release.set()  # the rest of the weights at once
    assert job.wait(60) and job.state == "done", job.error
    at.run()  # in a browser, the progress's fragment reruns the page once the download has ended
    assert not at.exception, [e.message for e in at.exception]
    assert selectbox_labelled(at, "Checkpoint").value == str(hub.cached_snapshot(hub.parse_name(repo)))
    assert not at.sidebar.get("progress") and not [b for b in at.sidebar.button if b.label.startswith("Download")]
    assert fake_hub.fetched("GET").count("model.safetensors") == 1, "one transfer of the weights"


def test_a_stopped_download_says_so_and_offers_its_button_again_with_nothing_half_written(app_world, slow_weights,
                                                                                         fake_hub):
    repo = slow_weights
    at = hub_typed(repo)
    next(b for b in at.sidebar.button if b.label.startswith("Download")).click()
    at.run()
    job = the_download(repo)
    at.button(key="explorer_hub_download-stop").click()
    at.run()
    # The Stop's run waits 2 s for the next chunk to stop it; on a loaded machine (a gate's load of 8.6 on 2 cores)
    # the paced chunk came later, and the page said so at its next redraw, as this run does
    assert job.wait(30) and job.state == "stopped"
    at.run()
    said = [i.value for i in at.sidebar.info]
    assert said and f"Downloading {repo}: stopped after" in displayed(said[0]) and \
        "stopped by a visitor" in displayed(said[0])
    assert [b for b in at.sidebar.button if b.label.startswith("Download")], "it can be started again"
    weights = list((hub.cache_dir() / "models--acme--tiny-vit").rglob("*"))
    assert not [p for p in weights if p.is_file() and p.stat().st_size > 10_000], "no partial weights kept"
    fake_hub.release.set()
    next(b for b in at.sidebar.button if b.label.startswith("Download")).click()
    at.run()
    assert the_download(repo).wait(60)
    at.run()
    assert selectbox_labelled(at, "Checkpoint").value == str(hub.cached_snapshot(hub.parse_name(repo)))


def test_the_sidebar_says_it_asks_the_hub_while_the_hub_is_slow_to_answer(app_world, repo, fake_hub, monkeypatch):
    """The Hub's file list took up to its deadline on a slow network, with nothing on the page meanwhile: the
    lookup runs under a spinner (drawn after Streamlit's half-second delay, so a cached plan shows nothing). The
    name typed is escaped: it is the visitor's text."""
    from streamlit.delta_generator import DeltaGenerator

    said, real = [], DeltaGenerator.spinner
    monkeypatch.setattr(DeltaGenerator, "spinner", lambda self, text="", **kw: said.append(text) or real(self, text,
                                                                                                           **kw))
    fake_hub.repos[repo].silent_s = 1.0
    at = hub_typed(repo)
    assert [b for b in at.sidebar.button if b.label.startswith("Download")]
    assert f"Asking the Hub about {repo}…" in [displayed(text) for text in said], said
    assert f"Asking the Hub about {repo}…" not in said, "the typed name is escaped"


def test_a_download_whose_next_chunk_is_late_says_it_is_stopping_after_stop(app_world, repo, fake_hub,
                                                                             monkeypatch):
    """The Stop's run waits 2 s for the transfer's next chunk; when none comes (a stalled connection), the bar stays,
    and its line said the bytes so far as though nothing had been asked. It says the download stops at its next
    chunk, as a long computation's does (one ``Work.describe`` for both)."""
    from app_pages.explorer_sections import hub_download

    fake_hub.repos[repo].stall.add("model.safetensors")
    monkeypatch.setattr(hub_download, "QUICK_S", 0.0)
    at = hub_typed(repo)
    next(b for b in at.sidebar.button if b.label.startswith("Download")).click()
    at.run()
    job = the_download(repo)
    deadline = time.monotonic() + 60
    while "model.safetensors" not in fake_hub.fetched("GET") and time.monotonic() < deadline:
        time.sleep(0.05)  # the JSON files first: a Stop during theirs takes effect at their next chunk
    at.button(key="explorer_hub_download-stop").click()
    at.run()
    assert not job.finished, "the stalled chunk never came"
    bars = [displayed(p.proto.text) for p in at.sidebar.get("progress")]
    assert bars == [f"Downloading {repo}: stopping at the end of this chunk (stopped by a visitor)"]
    fake_hub.release.set()  # the stalled answer ends
    assert job.wait(60)
    at.run()
    assert [b for b in at.sidebar.button if b.label.startswith("Download")], "it can be started again"


def test_two_visitors_asking_for_one_model_watch_one_download(app_world, slow_weights, fake_hub):
    repo = slow_weights
    first, second = hub_typed(repo), None
    next(b for b in first.sidebar.button if b.label.startswith("Download")).click()
    first.run()
    second = hub_typed(repo)  # another visitor, the same model: no second button, the one transfer's progress
    assert not [b for b in second.sidebar.button if b.label.startswith("Download")]
    assert [p for p in second.sidebar.get("progress")]
    fake_hub.release.set()
    assert the_download(repo).wait(60)
    for at in (first, second):
        at.run()
        assert selectbox_labelled(at, "Checkpoint").value == str(hub.cached_snapshot(hub.parse_name(repo)))
    assert fake_hub.fetched("GET").count("model.safetensors") == 1


def test_a_model_too_large_to_download_here_is_said_in_one_line_not_offered_on_a_button(app_world, repo, fake_hub,
                                                                                       monkeypatch):
    monkeypatch.setenv("VIT_MAX_DOWNLOAD_GB", "0.000001")  # 1 kB
    at, buttons = explorer_with_hub_id(repo)
    assert buttons == [] and fake_hub.fetched("GET") == []
    assert any("over the 1.0 kB download bound (VIT_MAX_DOWNLOAD_GB)" in displayed(e.value) for e in at.sidebar.error)


def test_a_network_visitor_without_the_training_token_cannot_start_a_download(app_world, repo, fake_hub):
    at, buttons = explorer_with_hub_id(repo, address="0.0.0.0")
    assert buttons == [] and fake_hub.fetched("GET") == [] and fake_hub.requests == []
    assert any("training token" in e.value for e in at.sidebar.error)


def test_a_network_visitor_opens_what_the_cache_holds_without_the_hub(app_world, repo, fake_hub):
    open_source(repo)
    seen = len(fake_hub.requests)
    at, buttons = explorer_with_hub_id(repo, address="0.0.0.0")
    picker = next(w for w in at.sidebar.selectbox if w.label == "Checkpoint")
    assert picker.value == str(hub.cached_snapshot(hub.parse_name(repo))) and buttons == []
    assert len(fake_hub.requests) == seen


def test_the_train_page_starts_from_a_hub_model_it_downloads(app_world, repo, fake_hub, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    at = AppTest.from_file(str(ROOT / "app_pages" / "training.py"), default_timeout=180).run()
    at.text_input(key="train_open_hub").set_value(repo).run()
    at.button(key="train_hub_download").click().run()
    assert not at.exception, [e.message for e in at.exception]
    snapshot = str(hub.cached_snapshot(hub.parse_name(repo)))
    assert at.radio(key="train_start").value == "import" and at.selectbox(key="train_init").value == snapshot


def test_the_analyse_page_opens_a_hub_model_from_the_cache(app_world, repo, fake_hub):
    from streamlit.testing.v1 import AppTest

    open_source(repo)  # in the HF cache now
    at = AppTest.from_file(str(ROOT / "app_pages" / "analyze.py"), default_timeout=180).run()
    at.text_input(key="analyze_open_hub").set_value(repo).run()
    assert not at.exception, [e.message for e in at.exception]
    assert selectbox_labelled(at, "Checkpoint").value == str(hub.cached_snapshot(hub.parse_name(repo)))


def test_a_weights_file_declared_larger_than_its_config_implies_is_refused_before_it_is_fetched(fake_hub, tiny_vit):
    """Issue 62, item 7: the declared size alone set what a download could take; the model's config.json, fetched
    first, bounds each weights file by the model it describes."""
    repo = fake_hub.add_folder("acme/inflated", tiny_vit)
    repo.listed_sizes["model.safetensors"] = 4 * 10**9  # the file is 40 kB; its config a 10 k-parameter ViT
    with pytest.raises(hub.HubError, match="^the Hub's file list of acme/inflated gives model.safetensors 4.0 GB, "
                                           "more than the model its config.json describes can take") as caught:
        hub.fetch(hub.parse_name("acme/inflated"), report=lambda line: None)
    assert "\n" not in str(caught.value)
    assert fake_hub.fetched("GET") == ["config.json"]  # the weights never asked for


def timm_folder(folder: Path) -> Path:
    """A tiny timm ViT as timm's push_to_hub writes it: config.json (architecture, num_classes, model_args)."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    args = {"img_size": 32, "patch_size": 8, "embed_dim": 24, "depth": 2, "num_heads": 2}
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, **args)
    save_file(model.state_dict(), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 3,
                                                    "model_args": args}))
    return folder


@pytest.mark.parametrize("family", ["vit", "clip", "swin", "timm"])
def test_real_weights_fit_what_their_config_implies(family, tiny_vit, tmp_path):
    """No false refusal: the weights each library saves for a model lie within the bound its config.json implies
    (float32 here; the bound is float64's, so at most about twice the file)."""
    if family == "vit":
        folder = tiny_vit
    elif family == "timm":
        folder = timm_folder(tmp_path)
    else:
        folder = tmp_path
        if family == "clip":
            model = transformers.CLIPModel(transformers.CLIPConfig(
                text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "vocab_size": 99},
                vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "image_size": 32, "patch_size": 8}, projection_dim=8))
        else:
            model = transformers.SwinForImageClassification(transformers.SwinConfig(
                image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4,
                num_labels=3))
        model.save_pretrained(folder)
    size = (folder / "model.safetensors").stat().st_size
    bound = hub.implied_weight_bytes(json.loads((folder / "config.json").read_text()))
    assert bound is not None and size <= bound <= 2 * size + 2 * hub.WEIGHTS_HEADER_BYTES


def test_a_config_with_absurdly_many_layers_is_refused_before_it_is_built():
    with pytest.raises(hub.HubError, match="describes 100,000 layers"):
        hub.implied_weight_bytes({"model_type": "vit", "num_hidden_layers": 100_000})
