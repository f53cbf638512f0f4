"""The explorer's Features section through Streamlit's AppTest (issue 36): an SAE folder trained on the open model,
the image's strongest features and their maps, the features at a patch, exemplars cropped from the images
features.npz names, a feature scaled for the section and in every map, and one-line refusals."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import test_app
import torch
from helpers import displayed
from test_app import CLASSES, charts, png_bytes, run_app, sidebar_widget
from test_app_mechanism import sample_input
from test_sae_formats import prisma_sae, saev_sae

from vit.checkpoint import load_checkpoint
from vit.core.images import open_image
from vit.core.inference import preprocess
from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.features.autoencoder import SAEInfo, SparseAutoencoder, model_fingerprint, save_sae
from vit.features.autoencoder_training import HeldOut

pytest.importorskip("streamlit")
pytestmark = pytest.mark.slow  # each test starts the app
dirs, default_world = test_app.dirs, test_app.default_world  # fixtures
LAYER = 2  # the SAE reads block 2's output of the tiny model's 3


def hand_stream(model, x):
    """Block LAYER's output by hand: the embedding and the first LAYER blocks."""
    with torch.no_grad():
        h = model.embed(x)
        for block in model.blocks[:LAYER]:
            h = block(h, rope=None)[0]
    return h


@pytest.fixture
def sae_world(default_world, tmp_path):
    """The default world, an SAE of its model at block 2 (random weights, k 4 of 32), and its features.npz over a
    folder of six images in class folders."""
    checkpoints, _ = default_world
    checkpoint = load_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    model = checkpoint.model.eval()
    torch.manual_seed(0)
    sae = SparseAutoencoder(16, 32, 4, info=SAEInfo(model_name="tiny", hook_name=f"blocks.{LAYER - 1}.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.2)
    data = tmp_path / "sae-data"
    names = []
    for i in range(6):
        name = f"{CLASSES[i % 2]}/{i}.png"
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(png_bytes(24, 24, seed=10 + i))
        names.append(name)
    held = HeldOut(sae, exemplars=4)
    images = [open_image((data / n).read_bytes(), name=n) for n in names]
    held.add(hand_stream(model, preprocess(images, checkpoint.preprocessing)))
    folder = tmp_path / "sae"
    save_sae(sae, folder)
    (folder / "features.npz").write_bytes(held.features(names))
    (folder / "metrics.json").write_text(json.dumps({"explained_variance": 0.5, "l0": 4.0, "dead_fraction": 0.0,
                                                     "data": str(data)}))
    return checkpoints, folder, sae.eval()


def open_features(at, folder):
    at.toggle(key="sae_view").set_value(True)
    at.run()
    at.text_input(key="sae_folder").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_strongest_features_their_maps_and_exemplars(sae_world):
    checkpoints, folder, sae = sae_world
    at = open_features(run_app(), folder)
    checkpoint, x = sample_input(checkpoints)
    z = sae.encode(hand_stream(checkpoint.model, x))[0]  # (T, 32): the SAE's own encoding of the layer's output
    P = checkpoint.model.num_prefix_tokens
    peak = z[P:].max(dim=0).values.detach()
    expected = peak.topk(8).indices[peak.topk(8).values > 0].tolist()
    [strongest] = [r for r in at.radio if r.key == "sae_strongest"]
    assert strongest.options == [f"feature {i} · {float(peak[i]):.3g}" for i in expected]
    assert any(f"its peak here, {float(peak[expected[0]]):.3g}" in c.value for c in at.caption)
    # Exemplars: as many crops as features.npz holds for the feature (up to 4 here), each named by its file.
    table = np.load(folder / "features.npz")
    # each image once (at its strongest token), named with its class folder
    distinct = {int(i) for i in table["exemplar_images"][expected[0]] if i >= 0}
    # the model's input, the strongest features' sheet, the drivers' sheet, the drivers' crops, the crops
    [theirs] = [e for e in at.expander if e.label == "Their exemplars"]
    driving = len(theirs.get("image"))
    assert len(at.get("image")) == 3 + driving + len(distinct) > 3 + driving
    shown = [t for t in at.text if t.value.count("\n") == 1][driving:]  # the shown feature's come last
    assert len(shown) == len(distinct)
    assert sorted(t.proto.help for t in shown) == sorted(str(table["images"][i]) for i in distinct)  # on hover
    # Each on one line, its end as much as an eighth of the page holds (wrapped, a path broke at any character).
    for t in shown:
        name = t.proto.help
        assert not t.proto.wrap and t.value.split("\n")[0] == (name if len(name) <= 12 else "…" + name[-11:])


def test_the_features_that_drive_the_prediction_are_listed_by_their_share_of_its_logit(sae_world):
    checkpoints, folder, sae = sae_world
    at = open_features(run_app(), folder)
    checkpoint, x = sample_input(checkpoints)
    model = checkpoint.model
    held = {}

    def leaf(h, point):  # by hand: the predicted logit's gradient at the SAE's hook point
        held["h"] = h.detach().requires_grad_(True)
        return held["h"]

    logits = model.run_with_hooks(x, [(f"blocks.{LAYER - 1}.hook_resid_post", leaf)]).logits[0]
    (g,) = torch.autograd.grad(logits[int(logits.argmax())], held["h"])
    with torch.no_grad():
        share = (sae.encode(held["h"][0]) * (g[0] @ sae.W_dec.T)).sum(dim=0)  # f_i (g . W_dec[i]) over the tokens
    expected = [i for i in share.topk(8).indices.tolist() if share[i] > 0]
    [drivers] = [r for r in at.radio if r.key == "sae_drivers"]
    assert expected and drivers.options == [f"feature {i} · {float(share[i]):+.3g}" for i in expected]
    assert any(c.value.startswith(f"Each feature's share of the {CLASSES[int(logits.argmax())]} logit")
               for c in at.caption)
    drivers.set_value(expected[-1])
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["sae_feature"] == expected[-1]  # picked: its map large and its exemplars
    assert any(c.value.startswith(f"Feature {expected[-1]}'s activation") for c in at.caption)


def test_each_feature_that_drives_the_prediction_is_shown_with_its_exemplars(sae_world):
    checkpoints, folder, sae = sae_world
    at = open_features(run_app(), folder)
    [drivers] = [r for r in at.radio if r.key == "sae_drivers"]
    latents = [int(option.split(" ")[1]) for option in drivers.options]
    table = np.load(folder / "features.npz")
    [theirs] = [e for e in at.expander if e.label == "Their exemplars"]
    rows, shown = {}, []
    for t in theirs.text:  # in the page's order: a feature's line, then its crops' names
        if t.value.startswith("Feature "):
            shown.append(int(t.value.split(" ")[1]))
            rows[shown[-1]] = []
        else:
            rows[shown[-1]].append(t.proto.help)  # a crop's whole image name, on hover
    assert shown == latents  # every feature of the list, in its order
    for latent in latents:  # each image once, named as features.npz names it, at most six
        distinct = list(dict.fromkeys(int(i) for i in table["exemplar_images"][latent] if i >= 0))[:6]
        assert rows[latent] == [str(table["images"][i]) for i in distinct]
    assert len(theirs.get("image")) == sum(map(len, rows.values())) > 0  # each one cropped from its file


def test_an_exemplars_long_name_is_shortened_to_its_end():
    from app_pages.explorer_sections.feature_exemplars import short_name

    assert short_name("cat/0.png") == "cat/0.png"
    assert short_name("golden_retriever/IMG_20240101_123456.png") == "…_123456.png"


def test_a_patch_lists_the_features_active_there(sae_world):
    checkpoints, folder, sae = sae_world
    at = open_features(run_app(), folder)
    checkpoint, x = sample_input(checkpoints)
    z = sae.encode(hand_stream(checkpoint.model, x))[0]
    token = checkpoint.model.num_prefix_tokens + 5  # what a click on patch 6 sets
    at.session_state["sae_token"] = token
    at.run()
    [active] = [r for r in at.radio if r.key == "sae_active"]
    fired = z[token][z[token] > 0]
    assert [int(o.split(" ")[1]) for o in active.options] == z[token].topk(len(fired)).indices.tolist()
    latent = int(z[token].argmin() if len(fired) == 0 else z[token].topk(len(fired)).indices[-1])
    active.set_value(latent)
    at.run()
    assert at.session_state["sae_feature"] == latent  # the feature picked at the patch is the one mapped
    assert any(c.value.startswith(f"Feature {latent}'s activation") for c in at.caption)


def prediction_bars(at):
    return [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]


def test_zeroing_a_feature_moves_the_prediction_as_the_sae_decode_says(sae_world):
    checkpoints, folder, sae = sae_world
    at = open_features(run_app(), folder)
    checkpoint, x = sample_input(checkpoints)
    model = checkpoint.model
    stream = hand_stream(model, x)
    z = sae.encode(stream)
    [strongest] = [r for r in at.radio if r.key == "sae_strongest"]
    latent = int(strongest.options[0].split(" ")[1])
    with torch.no_grad():
        edited = stream - z[..., latent:latent + 1] * sae.W_dec[latent]  # by hand: its share taken out
        probs = model.classify(model.run_blocks(edited, model.config.grid_size, LAYER)[0]).softmax(dim=-1)[0]
        clean = model(x)[0].softmax(dim=-1)[0]
    at.number_input(key=f"sae_factor-{latent}").set_value(0.0)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    page, section = prediction_bars(at)
    expected = {CLASSES[i]: float(p) for i, p in enumerate(probs)}
    assert dict(zip(section["y"], section["x"], strict=True)) == pytest.approx(
        {c: expected[c] for c in section["y"]}, abs=1e-5)
    assert dict(zip(page["y"], page["x"], strict=True)) == pytest.approx(
        {c: float(clean[CLASSES.index(c)]) for c in page["y"]}, abs=1e-5)  # the page's: as it was
    at.checkbox(key="sae_everywhere").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    for bars in prediction_bars(at):  # now the page's prediction follows; the section's scales the model once
        assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(
            {c: expected[c] for c in bars["y"]}, abs=1e-5)
    assert any(f"feature {latent} × 0" in i.value for i in at.info)
    at.button(key="features_reset").click()
    at.run()
    page = prediction_bars(at)[0]
    assert dict(zip(page["y"], page["x"], strict=True)) == pytest.approx(
        {c: float(clean[CLASSES.index(c)]) for c in page["y"]}, abs=1e-5)


def test_an_sae_run_is_offered_in_the_features_section_not_as_a_model(sae_world):
    _, folder, _ = sae_world
    run = Path(os.environ["VIT_RUNS_DIR"]) / "my-sae"
    shutil.copytree(folder, run)
    (run / "config.json").write_text(json.dumps({"kind": "sae", "args": {}}))
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    (run / "last.pt").write_bytes(b"an SAE's resume state")
    at = run_app()
    assert not any("my-sae" in option for option in sidebar_widget(at, "selectbox", "Checkpoint").options)
    assert not any("my-sae" in option for option in at.selectbox(key="compare_with").options)
    at.toggle(key="sae_view").set_value(True)
    at.run()
    at.selectbox(key="sae_run").set_value(str(run))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.text_input(key="sae_folder").value == str(run)
    assert [r for r in at.radio if r.key == "sae_strongest"]  # its features are shown


def test_the_runs_folder_is_not_scanned_again_on_every_rerun_but_a_new_run_is_listed(sae_world, monkeypatch):
    # Issue 47: every rerun of the Features section listed the runs folder and read each run's status and config.
    from vit.app import catalog

    _, folder, _ = sae_world
    scans = []
    scan = catalog.sae_runs
    monkeypatch.setattr(catalog, "sae_runs", lambda runs_dir=None: scans.append(runs_dir) or scan(runs_dir))
    at = run_app()
    at.toggle(key="sae_view").set_value(True)
    at.run()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert len(scans) == 1 and not [s for s in at.selectbox if s.key == "sae_run"]
    run = Path(os.environ["VIT_RUNS_DIR"]) / "new-sae"  # a new folder: the runs folder's time changes
    shutil.copytree(folder, run)
    (run / "config.json").write_text(json.dumps({"kind": "sae", "args": {}}))
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    at.run()
    assert len(scans) == 2 and at.selectbox(key="sae_run").options == ["run new-sae"]


def test_an_sae_of_another_model_or_width_is_a_one_line_refusal(sae_world, tmp_path):
    _, folder, sae = sae_world
    other = SparseAutoencoder(16, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                      model_fingerprint="0" * 16))
    save_sae(other, tmp_path / "other")
    wide = SparseAutoencoder(24, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post"))
    save_sae(wide, tmp_path / "wide")
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.pt").write_bytes(b"not an SAE")
    at = run_app()
    for path, message in ((tmp_path / "other", "trained on another model"), (tmp_path / "wide", "24-wide"),
                          (tmp_path / "nothing", "nothing is not a file or folder"),
                          (tmp_path / "empty", "empty is no SAE folder: SAELens's holds cfg.json"),
                          (tmp_path / "junk.pt", "junk.pt is not a checkpoint or weights file")):
        at = open_features(at, path)
        [error] = at.error
        assert message in displayed(error.value) and "\n" not in error.value


def shows_the_strongest_of(at, z, P):
    """The section lists the features whose peak on a patch of ``z (T, d_sae)``, the reference's latents, is largest,
    with those peaks, and draws the first one's map."""
    peak = z[P:].max(dim=0).values.detach()
    expected = peak.topk(8).indices[peak.topk(8).values > 0].tolist()
    [strongest] = [r for r in at.radio if r.key == "sae_strongest"]
    assert expected and strongest.options == [f"feature {i} · {float(peak[i]):.3g}" for i in expected]
    assert any(f"its peak here, {float(peak[expected[0]]):.3g}" in c.value for c in at.caption)


def test_a_vit_prisma_sae_opens_by_its_folder_with_the_features_prismas_code_computes(default_world, tmp_path):
    checkpoints, _ = default_world
    checkpoint, x = sample_input(checkpoints)
    tokens = checkpoint.model.num_prefix_tokens + checkpoint.model.config.num_patches
    reference = prisma_sae(tmp_path / "prisma", "topk", "layer_norm", layer=LAYER - 1, d_in=16, context_size=tokens)
    at = open_features(run_app(), tmp_path / "prisma")
    with torch.no_grad():
        _, z = reference.encode(hand_stream(checkpoint.model, x))
    shows_the_strongest_of(at, z[0], checkpoint.model.num_prefix_tokens)
    assert any("(ViT-Prisma, k 5)" in c.value for c in at.caption)


def test_a_saev_file_opens_once_its_block_is_given_with_the_features_saevs_code_computes(default_world, tmp_path):
    checkpoints, _ = default_world
    checkpoint, x = sample_input(checkpoints)
    reference = saev_sae(tmp_path / "sae.pt", "relu", d_in=16)
    at = open_features(run_app(), tmp_path / "sae.pt")
    assert not [r for r in at.radio if r.key == "sae_strongest"]  # its file does not say which block it reads
    [error] = at.error
    assert "give the block" in error.value and "\n" not in error.value
    at.number_input(key="sae_block").set_value(LAYER)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    with torch.no_grad():
        z = reference.encode(hand_stream(checkpoint.model, x)[0]).f_x
    shows_the_strongest_of(at, z, checkpoint.model.num_prefix_tokens)
    assert any("a single file" in c.value for c in at.caption)  # no features.npz: no exemplars


def test_without_access_to_the_servers_files_no_sae_folder_is_asked(sae_world, monkeypatch):
    monkeypatch.setenv("VIT_TRAIN_TOKEN", "secret")  # a token configured and not entered: nothing read by path
    at = run_app()
    at.toggle(key="sae_view").set_value(True)
    at.run()
    assert not [w for w in at.text_input if w.key == "sae_folder"]
    assert any("by path" in c.value for c in at.caption)


def open_browser(at, folder):
    at.switch_page("app_pages/analyze.py")
    at.run()
    at.toggle(key="browse_features").set_value(True)
    at.run()
    at.text_input(key="browse_sae_folder").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def browsed(at) -> list[int]:
    """The features listed, in order."""
    return [int(t.value.split(" ")[1]) for t in at.text if t.value.startswith("Feature ")]


def test_the_analyse_page_browses_features_by_frequency_and_by_class(sae_world):
    _, folder, _ = sae_world
    table = np.load(folder / "features.npz")
    frequency, images = table["frequency"], table["exemplar_images"]
    live = [i for i in range(32) if images[i, 0] >= 0]
    at = open_browser(AppTest_of_app(), folder)
    assert browsed(at) == sorted(live, key=lambda i: (-frequency[i], i))[:10]  # most frequent first
    thumbnails = sum(len({int(j) for j in images[i] if j >= 0}) for i in browsed(at))  # each image once
    assert len(at.get("image")) == thumbnails  # every exemplar of the page, cropped from its file
    at.radio(key="browse_order").set_value("rare")
    at.run()
    assert browsed(at) == sorted(live, key=lambda i: (frequency[i], i))[:10]
    # by class: the class folder most of a feature's exemplar images lie in (airplane/ and cat/ here; a tie is
    # airplane's, the first name)
    names = [str(n) for n in table["images"]]
    cats = [i for i in live if [names[j].split("/")[0] for j in images[i] if j >= 0].count("cat") * 2
            > int((images[i] >= 0).sum())]
    assert cats
    at.selectbox(key="browse_class").set_value("cat")
    at.run()
    assert browsed(at) == sorted(cats, key=lambda i: (frequency[i], i))[:10]  # still rarest first


def test_the_browser_refuses_an_sae_of_another_model_in_one_line(sae_world, tmp_path):
    other = SparseAutoencoder(16, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                      model_fingerprint="0" * 16))
    save_sae(other, tmp_path / "other")
    at = open_browser(AppTest_of_app(), tmp_path / "other")
    [error] = at.error
    assert "trained on another model" in displayed(error.value) and "\n" not in error.value


def AppTest_of_app():  # noqa: N802 (an AppTest, as run_app makes it, without running the explorer first)
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(test_app.APP, default_timeout=test_app.TIMEOUT)


def test_a_clips_feature_lists_its_nearest_typed_labels(dirs, tmp_path):
    open_clip = pytest.importorskip("open_clip")
    from test_app_words import ask, open_clip_app
    from test_prompts import save_open_clip

    from vit.sources.open import open_source

    reference, clip = save_open_clip(tmp_path / "open_clip")
    model = open_source(clip).model
    torch.manual_seed(0)
    sae = SparseAutoencoder(128, 20, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                     model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.2)
    save_sae(sae, tmp_path / "sae")
    at = open_clip_app(clip, png_bytes(32, 32, seed=4))
    labels = ["a dog", "a cat", "a red ball", "the sea"]
    ask(at, ", ".join(labels))
    at = open_features(at, tmp_path / "sae")
    [strongest] = [r for r in at.radio if r.key == "sae_strongest"]
    latent = int(strongest.options[0].split(" ")[1])
    with torch.no_grad():  # by hand on open_clip's modules: ln_post's linear part, then the projection
        tokens = open_clip.get_tokenizer(f"local-dir:{clip}")([f"a photo of a {label}." for label in labels])
        text = reference.encode_text(tokens, normalize=True)
        row = sae.W_dec[latent]
        direction = (row - row.mean()) * reference.visual.ln_post.weight @ reference.visual.proj
        cosines = torch.nn.functional.normalize(direction, dim=-1) @ text.T
    values, index = cosines.topk(3)
    expected = ", ".join(f"{labels[i]} ({c:+.2f})" for i, c in zip(index.tolist(), values.tolist(), strict=True))
    assert f"Nearest typed labels: {expected}" in [t.value for t in at.text]


def test_features_open_while_heads_are_switched_off_in_every_map(sae_world):
    from test_app_mechanism import open_mechanism, switch_heads_off

    _, folder, _ = sae_world
    at = switch_heads_off(open_mechanism(run_app(), "Ablation"), ["1.1"], everywhere=True)
    at = open_features(at, folder)
    assert not at.error  # the SAE is checked against the model as loaded, not the copy with a head off
    assert [r for r in at.radio if r.key == "sae_strongest"]


def test_an_exemplar_named_outside_its_folder_is_not_read(sae_world, tmp_path):
    _, folder, _ = sae_world
    (tmp_path / "outside.png").write_bytes(png_bytes(24, 24, seed=99))
    table = dict(np.load(folder / "features.npz"))
    table["images"] = np.array(["../outside.png"] * len(table["images"]))  # a features.npz from anyone
    np.savez(folder / "features.npz", **table)
    at = open_features(run_app(), folder)
    assert len(at.get("image")) == 3  # the model's input, the features' and the drivers' sheets: no crop
    assert any("outside.png is not inside" in t.value for t in at.text)


def test_an_sae_handed_over_by_the_train_page_opens_in_the_features_section(sae_world):
    checkpoints, folder, _ = sae_world
    at = run_app(explorer_sae=str(folder))  # what "Open with this SAE in the explorer" sets
    assert at.toggle(key="sae_view").value and at.text_input(key="sae_folder").value == str(folder)
    assert [r for r in at.radio if r.key == "sae_strongest"], "the handed SAE's features are shown"


def test_a_hub_sae_too_large_to_download_here_is_said_in_one_line_not_offered_on_a_button(default_world, fake_hub,
                                                                                        tmp_path, monkeypatch):
    checkpoints, _ = default_world
    checkpoint, _ = sample_input(checkpoints)
    tokens = checkpoint.model.num_prefix_tokens + checkpoint.model.config.num_patches
    prisma_sae(tmp_path / "prisma", "relu", "none", layer=LAYER - 1, d_in=16, context_size=tokens)
    fake_hub.add("acme/saes", {f"prisma/{p.name}": p.read_bytes() for p in (tmp_path / "prisma").iterdir()})
    monkeypatch.setenv("VIT_MAX_DOWNLOAD_GB", "0.000001")  # 1 kB
    at = open_features(run_app(), "acme/saes/prisma")
    assert not [b for b in at.button if b.key == "features_download"] and not fake_hub.fetched()
    assert any("over the 1.0 kB download bound (VIT_MAX_DOWNLOAD_GB)" in displayed(e.value) for e in at.error)


def test_a_hub_sae_missing_from_the_cache_downloads_on_its_button_then_opens(default_world, fake_hub, tmp_path):
    checkpoints, _ = default_world
    checkpoint, x = sample_input(checkpoints)
    tokens = checkpoint.model.num_prefix_tokens + checkpoint.model.config.num_patches
    reference = prisma_sae(tmp_path / "prisma", "relu", "none", layer=LAYER - 1, d_in=16, context_size=tokens)
    fake_hub.add("acme/saes", {f"prisma/{p.name}": p.read_bytes() for p in (tmp_path / "prisma").iterdir()})
    at = open_features(run_app(), "acme/saes/prisma")
    assert not fake_hub.fetched() and not [r for r in at.radio if r.key == "sae_strongest"]  # nothing before asked
    offers = [c.value for c in at.caption if " files" in c.value and "kB" in c.value]  # its files' count and size
    assert offers, "the size is shown before the download"
    at.button(key="features_download").click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert sorted(fake_hub.fetched()) == ["prisma/config.json", "prisma/n_images_100.pt"]
    # Once it is done, its size, its button and its full bar leave the section (they stayed until the next click).
    assert not at.get("progress") and not [b for b in at.button if b.key == "features_download"]
    assert not [c for c in at.caption if c.value in offers]
    with torch.no_grad():
        _, z = reference.encode(hand_stream(checkpoint.model, x))
    shows_the_strongest_of(at, z[0], checkpoint.model.num_prefix_tokens)
