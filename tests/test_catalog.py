"""The checkpoint catalog: what the explorer's picker lists, read without building models."""

import json
import os
from pathlib import Path

import pytest
from helpers import displayed

from vit.app import catalog
from vit.app.catalog import (
    Candidate,
    candidate_for,
    dataset_label,
    default_entry,
    describe,
    find_checkpoints,
    format_parameters,
    list_checkpoints,
    sample_images,
)
from vit.checkpoint import save_checkpoint
from vit.core import runfiles
from vit.model import ViT, ViTConfig, count_parameters

TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)
CLASSES = ["cat", "dog", "bird"]


def write_checkpoint(path: Path, config: ViTConfig = TINY, classes=CLASSES, **metadata) -> Path:
    return save_checkpoint(path, ViT(config), list(classes)[: config.num_classes], metadata=metadata)


def write_run(runs: Path, name: str, state: str, files=("best.pt",), **metadata) -> Path:
    run = runs / name
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": state}))
    for file in files:
        write_checkpoint(run / file, **metadata)
    return run


@pytest.fixture
def dirs(tmp_path):
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    checkpoints.mkdir()
    runs.mkdir()
    return checkpoints, runs


def test_entry_reads_dataset_classes_size_and_accuracy_from_metadata(dirs):
    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "tiny.pt", dataset="folder:data/pets", val_acc=0.8125, parameters=1234,
                            epochs=7)
    entry = describe(Candidate(path, "checkpoint", "tiny"))
    assert entry.ok
    assert (entry.dataset, entry.class_names, entry.parameters, entry.val_acc) == ("pets", tuple(CLASSES), 1234,
                                                                                   0.8125)
    assert (entry.image_size, entry.patch_size, entry.num_layers, entry.num_heads, entry.epochs) == (16, 4, 2, 2, 7)
    assert entry.label == "tiny.pt · pets · 3 classes · 1.2 k params · val 81.2%"
    assert "2 layers × 2 heads" in entry.description
    assert "input of 16×16 px in 4 rows × 4 columns of 4-px patches" in entry.description


def test_missing_metadata_counts_parameters_from_the_weights_and_says_accuracy_is_unknown(dirs):
    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "bare.pt")
    entry = describe(Candidate(path, "checkpoint", "bare"))
    assert entry.parameters == count_parameters(ViT(TINY))
    assert entry.val_acc is None and entry.dataset is None
    assert entry.label.endswith("val n/a")


def test_best_val_acc_is_used_when_the_checkpoint_has_no_val_acc(dirs):
    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "b.pt", val_acc=None, best_val_acc=0.5)
    assert describe(Candidate(path, "checkpoint", "b")).val_acc == 0.5


@pytest.mark.parametrize("content", [b"", b"not a torch file", b"PK\x03\x04 truncated zip"])
def test_unreadable_file_becomes_an_entry_with_a_one_line_error(dirs, content):
    checkpoints, _ = dirs
    path = checkpoints / "broken.pt"
    path.write_bytes(content)
    entry = describe(Candidate(path, "checkpoint", "broken"))
    assert not entry.ok
    assert "broken.pt" in entry.error and "\n" not in entry.error
    assert entry.label == "broken.pt · cannot be loaded"
    assert entry.error in displayed(entry.description)


def test_listing_puts_the_default_first_and_keeps_broken_files(dirs):
    checkpoints, runs = dirs
    write_checkpoint(checkpoints / "a.pt")
    write_checkpoint(checkpoints / runfiles.DEFAULT_CHECKPOINT)
    (checkpoints / "zz-broken.pt").write_bytes(b"junk")
    (checkpoints / "notes.txt").write_text("not a checkpoint")
    (checkpoints / f".{runfiles.DEFAULT_CHECKPOINT}.abc.tmp").write_bytes(b"half-written")
    names = [e.path.name for e in list_checkpoints(checkpoints, runs)]
    assert names == [runfiles.DEFAULT_CHECKPOINT, "a.pt", "zz-broken.pt"]


def test_only_completed_runs_are_listed_with_best_pt_preferred_and_the_run_name_in_the_label(dirs):
    checkpoints, runs = dirs
    write_run(runs, "done", "completed", files=("best.pt", "last.pt"))
    write_run(runs, "only-last", "completed", files=("last.pt",))
    write_run(runs, "busy", "running")
    write_run(runs, "crashed", "failed")
    (runs / "no-status").mkdir()
    entries = list_checkpoints(checkpoints, runs)
    assert [(e.name, e.path.name, e.source) for e in entries] == [("done", "best.pt", "run"),
                                                                  ("only-last", "last.pt", "run")]
    assert all(e.label.startswith(f"run {e.name} · ") for e in entries)


def test_run_with_a_half_written_status_file_is_skipped(dirs):
    checkpoints, runs = dirs
    run = write_run(runs, "r", "completed")
    (run / "status.json").write_text('{"state": "compl')
    assert find_checkpoints(checkpoints, runs) == []


def test_missing_folders_give_an_empty_list(tmp_path):
    assert list_checkpoints(tmp_path / "nope", tmp_path / "nope either") == []


def test_folders_come_from_environment_variables(dirs, monkeypatch):
    checkpoints, runs = dirs
    write_checkpoint(checkpoints / "env.pt")
    write_run(runs, "env-run", "completed")
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    assert [e.name for e in list_checkpoints()] == ["env", "env-run"]


def test_default_entry_is_the_shipped_default_unless_it_is_broken(dirs):
    checkpoints, runs = dirs
    write_checkpoint(checkpoints / "a.pt")
    (checkpoints / runfiles.DEFAULT_CHECKPOINT).write_bytes(b"junk")
    entries = list_checkpoints(checkpoints, runs)
    assert default_entry(entries).path.name == "a.pt"
    write_checkpoint(checkpoints / runfiles.DEFAULT_CHECKPOINT)
    assert default_entry(list_checkpoints(checkpoints, runs)).path.name == runfiles.DEFAULT_CHECKPOINT
    assert default_entry([]) is None


def test_candidate_for_a_listed_path_matches_it_however_it_is_spelled(dirs, monkeypatch):
    checkpoints, runs = dirs
    run = write_run(runs, "r1", "completed", files=("best.pt", "last.pt"))
    candidates = find_checkpoints(checkpoints, runs)
    monkeypatch.chdir(runs)
    assert candidate_for("r1/best.pt", candidates) is candidates[0]
    # A run's last.pt is not listed but can still be opened, named after its run.
    assert candidate_for(run / "last.pt", candidates) == Candidate(run / "last.pt", "run", "r1")
    assert candidate_for(checkpoints / "x.pt", candidates).source == "file"


def test_fingerprint_changes_when_a_checkpoint_is_replaced(dirs):
    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "a.pt")
    before = Candidate(path, "checkpoint", "a").fingerprint
    write_checkpoint(path, dataset="retrained")
    assert Candidate(path, "checkpoint", "a").fingerprint != before


def test_a_folders_fingerprint_changes_when_a_file_in_it_is_edited_in_place(tmp_path):
    """A model folder (a ViT's, a VLM's, SAM 3's: every page's cache is keyed by this fingerprint) whose config.json
    is rewritten in place keeps its own stat (the same entries), yet is another model: its fingerprint changes."""
    import os

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_hidden_layers": 2}')
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    before, stat = Candidate(folder, "file", "model").fingerprint, folder.stat()
    (folder / "config.json").write_text('{"num_hidden_layers": 3}')  # same size, same entries
    config = (folder / "config.json").stat()
    os.utime(folder / "config.json", ns=(config.st_atime_ns, config.st_mtime_ns + 10**9))  # a coarse clock's tick
    assert (folder.stat().st_mtime_ns, folder.stat().st_size) == (stat.st_mtime_ns, stat.st_size)
    after = Candidate(folder, "file", "model").fingerprint
    assert after != before and after == Candidate(folder, "file", "model").fingerprint


def test_samples_come_from_the_checkpoints_own_folder_or_a_shipped_one_with_the_same_classes(dirs):
    checkpoints, runs = dirs
    write_checkpoint(checkpoints / "shipped.pt")
    samples = checkpoints / "samples" / "shipped"
    samples.mkdir(parents=True)
    for name in ("dog_1.png", "cat_1.png", "readme.txt"):
        (samples / name).write_bytes(b"x")
    write_run(runs, "same-classes", "completed")
    write_run(runs, "other-classes", "completed", classes=["a", "b", "c"])
    entries = list_checkpoints(checkpoints, runs)
    by_name = {e.name: e for e in entries}
    expected = [samples / "cat_1.png", samples / "dog_1.png"]
    assert sample_images(by_name["shipped"], entries, checkpoints) == expected
    assert sample_images(by_name["same-classes"], entries, checkpoints) == expected
    assert sample_images(by_name["other-classes"], entries, checkpoints) == []


@pytest.mark.parametrize(("spec", "label"), [("folder:data/cifar10", "cifar10"), ("folder:data/mnist/train/", "mnist"),
                                             ("cifar10", "cifar10"), (None, None), ("", None)])
def test_dataset_label(spec, label):
    assert dataset_label(spec) == label


@pytest.mark.parametrize(("count", "text"), [(12, "12 params"), (1_234, "1.2 k params"),
                                             (460_906, "0.46 M params"), (86_567_656, "86.6 M params")])
def test_format_parameters(count, text):
    assert format_parameters(count) == text


def test_absurd_config_is_listed_as_cannot_be_loaded(dirs):
    from vit.checkpoint import atomic_torch_save, read_checkpoint_payload

    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "absurd.pt")
    payload = read_checkpoint_payload(path)
    payload["config"] = {**payload["config"], "num_layers": 10**5}
    atomic_torch_save(payload, path)
    entry = describe(Candidate(path, "checkpoint", "absurd"))
    assert not entry.ok
    assert "num_layers is 100,000; at most 256" in entry.error
    assert entry.label == "absurd.pt · cannot be loaded"


def test_preprocessing_that_disagrees_with_the_model_is_listed_as_cannot_be_loaded(dirs):
    from vit.checkpoint import atomic_torch_save, read_checkpoint_payload

    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "wide.pt")
    payload = read_checkpoint_payload(path)
    payload["preprocessing"] = {**payload["preprocessing"], "image_size": 512}
    atomic_torch_save(payload, path)
    entry = describe(Candidate(path, "checkpoint", "wide"))
    assert "invalid preprocessing" in entry.error


def test_pickle_bomb_is_listed_as_cannot_be_loaded_without_unpickling(dirs, monkeypatch):
    import zipfile

    import torch

    checkpoints, _ = dirs
    path = checkpoints / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02]" + b"Na" * 4_000_000 + b".")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the bomb was unpickled"))
    [entry] = list_checkpoints(checkpoints, dirs[1])
    assert "refused to load" in entry.error


def test_describing_a_checkpoint_does_not_read_its_weights(dirs, monkeypatch):
    import torch

    checkpoints, _ = dirs
    path = write_checkpoint(checkpoints / "a.pt")
    real_load = torch.load
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("mmap"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    assert describe(Candidate(path, "checkpoint", "a")).ok
    assert seen == [True], "the weights are memory-mapped, not read, to describe a checkpoint"


@pytest.mark.parametrize("env", [
    {"HF_HUB_CACHE": "{tmp}/hub-cache", "HF_HOME": "{tmp}/hf-home"},
    {"HF_HOME": "{tmp}/hf-home"},
    {"XDG_CACHE_HOME": "{tmp}/xdg"},
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HOME": "{tmp}/hf-home"},
    {},
])
def test_the_hf_cache_folder_is_the_one_huggingface_hub_itself_uses(tmp_path, env):
    """Against huggingface_hub's own constants, read in a fresh process with exactly this environment."""
    import subprocess
    import sys

    values = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items()
             if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    full = {**clean, "HOME": str(tmp_path / "home"), **values}
    reference = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; "
                                "print(constants.HF_HUB_CACHE)"], env=full, capture_output=True, text=True,
                               check=True).stdout.strip()
    with pytest.MonkeyPatch.context() as mp:
        for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
            mp.delenv(key, raising=False)
        mp.setenv("HOME", str(tmp_path / "home"))
        for key, value in values.items():
            mp.setenv(key, value)
        assert catalog.hf_cache_dirs() == [Path(reference)]


def test_the_suite_never_sees_the_users_real_caches():
    """conftest points HOME and the Hugging Face cache at a temporary folder for every test and subprocess."""
    import pwd

    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    [cache] = catalog.hf_cache_dirs()
    assert Path(os.environ["HOME"]) != real_home and real_home not in cache.parents
    assert Path(os.environ["HOME"]) in cache.parents


def test_the_shipped_checkpoints_folder_is_the_repositorys(monkeypatch):
    """After vit/ gained wings the picker looked in vit/checkpoints/ and the app opened on nothing."""
    monkeypatch.delenv("VIT_CHECKPOINTS_DIR", raising=False)
    repository = Path(__file__).resolve().parent.parent
    assert runfiles.default_checkpoints_dir() == repository / "checkpoints"
    assert (runfiles.default_checkpoints_dir() / runfiles.DEFAULT_CHECKPOINT).is_file()


def tiny_hf_cache(root: Path, count: int) -> Path:
    """``count`` supported models (a tiny ViT config.json each) laid out as huggingface_hub does."""
    config = json.dumps({"architectures": ["ViTForImageClassification"], "model_type": "vit", "image_size": 16,
                         "patch_size": 4, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                         "intermediate_size": 16})
    for i in range(count):
        snapshot = root / f"models--org--vit-{i:04d}" / "snapshots" / "rev1"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(config)
        (snapshot.parent.parent / "refs").mkdir()
        (snapshot.parent.parent / "refs" / "main").write_text("rev1")
    return root


@pytest.fixture
def config_reads(monkeypatch):
    """The config.json files read through vit.sources.open.read_json, as the catalog reads them."""
    from vit.sources import open as sources

    reads, read_json = [], sources.read_json
    monkeypatch.setattr(sources, "read_json", lambda path: reads.append(path) or read_json(path))
    return reads


def test_a_large_hf_cache_is_listed_from_a_bounded_number_of_config_files(tmp_path, config_reads):
    """10,000 cached models once meant 10,000 config.json read per page load (51 s): a listing looks into at most
    MAX_HF_CACHE_EXAMINED folders, in name order, and counts the others by name alone."""
    cache = tiny_hf_cache(tmp_path / "hub", catalog.MAX_HF_CACHE_EXAMINED * 3)
    listing = catalog.hf_cache_listing([cache])
    assert len(config_reads) <= catalog.MAX_HF_CACHE_EXAMINED
    assert (listing.folders, listing.examined) == (catalog.MAX_HF_CACHE_EXAMINED * 3, catalog.MAX_HF_CACHE_EXAMINED)
    assert [c.name for c in listing.candidates] == [f"org/vit-{i:04d}" for i in range(catalog.MAX_HF_CACHE_EXAMINED)]
    assert not listing.complete


def test_a_name_filter_reaches_the_hf_cache_models_past_the_first_page(tmp_path, config_reads):
    cache = tiny_hf_cache(tmp_path / "hub", catalog.MAX_HF_CACHE_EXAMINED * 3)
    listing = catalog.hf_cache_listing([cache], contains="VIT-0149")
    assert [c.name for c in listing.candidates] == ["org/vit-0149"] and listing.complete
    assert len(config_reads) == 1


def test_the_hf_cache_folder_names_are_read_again_only_when_the_cache_changes(tmp_path, monkeypatch):
    cache = tiny_hf_cache(tmp_path / "hub", 3)
    assert len(catalog.hf_cache_folders([cache])) == 3
    scans = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: scans.append(path) or scandir(path))
    assert len(catalog.hf_cache_folders([cache])) == 3 and scans == []
    tiny_hf_cache(tmp_path / "more", 1).joinpath("models--org--vit-0000").rename(cache / "models--org--new")
    os.utime(cache, ns=(0, cache.stat().st_mtime_ns + 10**9))  # a coarse clock must not hide the change
    assert [name for name, _ in catalog.hf_cache_folders([cache])][0] == "org/new" and len(scans) == 1


def test_the_note_under_a_cut_short_hf_listing_says_how_to_reach_the_others():
    listing = catalog.HfCacheListing((), folders=10_000, examined=50)
    assert catalog.hf_cache_note(listing, "Find", "Open a path") == (
        "10,000 models in the Hugging Face cache match; the supported ones among the first 50 by name are listed. "
        'For another one, type part of its name in "Find" or give its folder to "Open a path".')
    assert catalog.hf_cache_note(listing, "Find", None).endswith('type part of its name in "Find".')
    assert catalog.hf_cache_note(catalog.HfCacheListing((), 3, 3), "Find", "Open a path") is None


def test_a_run_named_with_a_right_to_left_override_is_labelled_with_it_visible(dirs):
    """Issue 20, item 9: the explorer's picker showed a run folder's U+202E raw, turning the label around."""
    checkpoints, runs = dirs
    write_run(runs, "cats\u202egpj.exe", "completed", dataset="folder:data/\u2066birds")
    write_checkpoint(checkpoints / "model\u202ett.pt")
    labels = [e.label for e in list_checkpoints(checkpoints, runs)]
    assert labels[0].startswith("model\\u202ett.pt · ")
    assert labels[1].startswith("run cats\\u202egpj.exe · \\u2066birds · 3 classes")
    assert not any(c in label for label in labels for c in "\u202e\u2066")
    assert "\\\\u202e" in describe(find_checkpoints(checkpoints, runs)[1]).description  # the path, Markdown-escaped


def test_a_completed_sae_run_is_no_model_but_is_listed_among_the_sae_runs(dirs):
    _, runs = dirs
    vit_run = write_run(runs, "vit-run", "completed")
    sae_run = write_run(runs, "sae-run", "completed", files=())
    (sae_run / "config.json").write_text(json.dumps({"kind": "sae", "args": {}}))
    (sae_run / "last.pt").write_bytes(b"an SAE's resume state")  # what vit.sae train writes: no ViT
    unfinished = write_run(runs, "sae-running", "running", files=())
    (unfinished / "config.json").write_text(json.dumps({"kind": "sae", "args": {}}))
    assert [c.path for c in find_checkpoints(dirs[0], runs)] == [vit_run / "best.pt"]
    assert catalog.sae_runs(runs) == [sae_run]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["swin", "swinv2", "beit"])
def test_an_hf_family_classifier_is_described_with_its_own_class_names(tmp_path, family):
    """Issue 69, item 6: the sidebar said "no classifier" for Swin, Swin V2 and BEiT classifiers, whose page showed
    predictions: the folder's description names the classes its config's id2label gives, as opening it does."""
    transformers = pytest.importorskip("transformers")
    labels = {0: "tabby", 1: "tiger", 2: "lynx"}
    if family == "beit":
        config = transformers.BeitConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32, id2label=labels)
        model = transformers.BeitForImageClassification(config)
    else:
        config_class, model_class = ((transformers.SwinConfig, transformers.SwinForImageClassification)
                                     if family == "swin" else
                                     (transformers.Swinv2Config, transformers.Swinv2ForImageClassification))
        model = model_class(config_class(image_size=16, patch_size=4, embed_dim=8, depths=[1], num_heads=[2],
                                         window_size=4, id2label=labels))
    model.save_pretrained(tmp_path / family)
    entry = catalog.describe_current(catalog.Candidate(tmp_path / family, "path", family))
    assert entry.ok, entry.error
    assert entry.class_names == ("tabby", "tiger", "lynx")
    assert "no classifier" not in entry.description


@pytest.mark.slow
def test_a_swin_is_described_by_its_stages_and_each_stages_heads(tmp_path):
    """Issue 69, item 10: the sidebar said "8 layers × 3 heads" for a Swin with 3/6/12/24 heads (its first stage's
    count): an HF folder and the same model saved as our checkpoint name each stage's layers and heads."""
    transformers = pytest.importorskip("transformers")
    from vit.sources.open import open_source

    config = transformers.SwinConfig(image_size=32, patch_size=2, embed_dim=24, depths=[2, 2, 2, 2],
                                     num_heads=[3, 6, 12, 24], window_size=2, num_labels=3)
    transformers.SwinForImageClassification(config).save_pretrained(tmp_path / "swin")
    checkpoint = open_source(tmp_path / "swin")
    save_checkpoint(tmp_path / "swin.pt", checkpoint.model, checkpoint.class_names)
    for path in (tmp_path / "swin", tmp_path / "swin.pt"):
        entry = catalog.describe_current(catalog.Candidate(path, "path", path.name))
        assert entry.ok, entry.error
        assert "**Model** 8 layers in 4 stages (2+2+2+2), 3/6/12/24 heads, " in entry.description
        assert "× 3 heads" not in entry.description


def test_a_plain_vit_is_described_as_layers_times_heads(dirs):
    entry = describe(Candidate(write_checkpoint(dirs[0] / "tiny.pt"), "checkpoint", "tiny"))
    assert entry.layers_and_heads == "2 layers × 2 heads"
