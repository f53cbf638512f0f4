"""The tutorials' own ViTs open exactly: logits and every layer's attention equal to the tutorial's code, to 1e-5.

Each model is built at test time from the tutorial's code in the shared seed-models folder (never copied into
the project), saved the way the tutorial saves it (tintn's ``save_experiment``; a ``state_dict`` where the
tutorial saves nothing) and opened through the project's entry points: ``open_source``, ``vit.predict``, the
explorer's catalog and ``vit.train --init``. Random noise on every parameter makes a wrong mapping visible.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from parity_helpers import ATOL, assert_parity, randomize

from vit.model import ViT
from vit.sources.open import SourceError, open_source

_REPO = Path(__file__).resolve().parents[1]
_SEED_PLACES = [p for p in (os.environ.get("VIT_SEED_MODELS"), _REPO.parent / "shared" / "seed-models",
                            "/work/shared/seed-models") if p]
SEEDS = next((Path(p) for p in _SEED_PLACES if Path(p).is_dir()), None)
pytestmark = pytest.mark.skipif(SEEDS is None, reason="the tutorials' seed models are not here; looked in "
                                + ", ".join(map(str, _SEED_PLACES)) + " (set VIT_SEED_MODELS)")

# tintn's blog config (the repo's train.py adds use_faster_attention), two layers to stay fast.
TINTN_CONFIG = {"patch_size": 4, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 4 * 48, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                "initializer_range": 0.02, "image_size": 32, "num_classes": 10, "num_channels": 3, "qkv_bias": True}


def seed(name: str):
    """A tutorial's module, imported from the seed-models folder."""
    spec = importlib.util.spec_from_file_location(f"seed_{name}", SEEDS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(ours, logits: torch.Tensor, attentions: list[torch.Tensor], row: str = "from-scratch") -> None:
    our_logits, our_attentions = ours
    assert_parity(row, our_logits, logits, our_attentions, attentions)


def tintn_experiment(tmp_path: Path, faster: bool) -> tuple[Path, torch.nn.Module]:
    """A tintn experiment folder written by its own save_experiment (and a save_checkpoint of epoch 3)."""
    config = {**TINTN_CONFIG, "use_faster_attention": True} if faster else dict(TINTN_CONFIG)
    model = randomize(seed("seed000_tintn_vit").ViTForClassfication(config))
    save = seed("seed000_tintn_utils_save")
    base = tmp_path / "experiments"
    save.save_checkpoint("vit-exp", model, 3, base_dir=str(base))
    save.save_experiment("vit-exp", config, model, [1.0], [1.0], [0.1], base_dir=str(base))
    return base / "vit-exp", model


@pytest.mark.parametrize("faster", [False, True], ids=["per-head-qkv", "use_faster_attention"])
def test_tintn_experiment_opens_as_folder_and_as_its_pt_exactly(tmp_path, faster):
    folder, model = tintn_experiment(tmp_path, faster)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits, attentions = model(images, output_attentions=True)
        for path in (folder, folder / "model_final.pt"):
            checkpoint = open_source(path)
            assert checkpoint.path == folder / "model_final.pt"
            assert_same(checkpoint.model(images, output_attentions=True), logits, attentions)


def test_tintn_folder_without_model_final_opens_its_latest_epoch(tmp_path):
    folder, model = tintn_experiment(tmp_path, faster=True)
    (folder / "model_final.pt").rename(folder / "model_10.pt")
    assert open_source(folder).path == folder / "model_10.pt"  # not model_3.pt, nor model_10 < model_3 as text


def test_tintn_default_preprocessing_is_its_normalize_half_with_the_assumed_note(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=True)
    checkpoint = open_source(folder)
    assert checkpoint.preprocessing.mean == (0.5, 0.5, 0.5) and checkpoint.preprocessing.std == (0.5, 0.5, 0.5)
    assert checkpoint.preprocessing.image_size == 32
    assert "assumed" in checkpoint.metadata["preprocessing_guessed"]


def test_mean_and_std_in_the_folder_config_are_used_and_nothing_is_assumed(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=True)
    config = json.loads((folder / "config.json").read_text())
    config.update(mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26])
    (folder / "config.json").write_text(json.dumps(config))
    checkpoint = open_source(folder)
    assert checkpoint.preprocessing.mean == (0.49, 0.48, 0.45)
    assert checkpoint.preprocessing.std == (0.25, 0.24, 0.26)
    assert "preprocessing_guessed" not in checkpoint.metadata


def test_tintn_checkpoint_of_an_epoch_opens_without_its_config_from_the_per_head_layout(tmp_path):
    folder, model = tintn_experiment(tmp_path, faster=False)
    lone = tmp_path / "lone"
    lone.mkdir()
    (folder / "model_3.pt").rename(lone / "model_3.pt")
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert_same(open_source(lone / "model_3.pt").model(images, output_attentions=True),
                    *model(images, output_attentions=True))


def test_tintn_fused_layout_without_its_config_asks_for_the_heads_in_one_line(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=True)
    (folder / "config.json").unlink()
    with pytest.raises(SourceError, match="num_heads") as error:
        open_source(folder / "model_final.pt")
    assert "\n" not in str(error.value)
    assert open_source(folder / "model_final.pt", arch="scratch:num_heads=4").config.num_heads == 4


def test_tintn_experiment_through_vit_predict_gives_the_tutorials_probabilities(tmp_path, capsys):
    from PIL import Image

    from vit.predict import main

    folder, model = tintn_experiment(tmp_path, faster=False)
    pixels = torch.randint(0, 256, (32, 32, 3), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    Image.fromarray(pixels.numpy()).save(tmp_path / "photo.png")
    assert main([str(folder), str(tmp_path / "photo.png"), "--top-k", "10"]) == 0
    predictions = json.loads(capsys.readouterr().out)[0]["predictions"]
    # tintn's own test transform: ToTensor, Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    images = ((pixels.permute(2, 0, 1).float() / 255 - 0.5) / 0.5)[None]
    with torch.no_grad():
        expected = model(images)[0].softmax(-1)[0]
    got = {p["label"]: p["probability"] for p in predictions}
    for index, probability in enumerate(expected.tolist()):
        assert got[f"class {index}"] == pytest.approx(probability, abs=1e-5)


def test_tintn_experiment_starts_a_run_with_vit_train_init_exactly(tmp_path):
    from vit.training.finetune import load_init, prepare_init

    folder, model = tintn_experiment(tmp_path, faster=True)
    init = prepare_init(str(folder), num_classes=10)
    assert not init.head_replaced
    ours = ViT(init.config)
    load_init(ours, init)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_same(ours.eval()(images, output_attentions=True), *model(images, output_attentions=True))


def test_tintn_experiment_is_listed_by_the_explorers_catalog(tmp_path):
    from vit.app import catalog

    folder, _ = tintn_experiment(tmp_path, faster=True)
    entry = catalog.describe_import(catalog.Candidate(folder, "file", "vit-exp"))
    assert entry.ok, entry.error
    assert (entry.num_layers, entry.num_heads, entry.image_size) == (2, 4, 32)


# -- the MNIST tutorial: nn.TransformerEncoder ------------------------------------------------------------------

def mnist_tutorial(tmp_path: Path, rgb: bool = False) -> tuple[Path, torch.nn.Module]:
    """The tutorial's ViT with its hyperparameters (two layers and a narrower MLP to stay fast), as a state dict
    with the one constructor argument the weights cannot tell beside it; ``rgb``: on 32-px colour images with
    8-px patches, where the (row, column, channel) order of its patch vectors matters."""
    module = seed("seed002_mnist_vit")
    model = randomize(module.ViT(img_width=32 if rgb else module.img_width, img_channels=3 if rgb else 1,
                                 patch_size=8 if rgb else module.patch_size, d_model=module.embedding_dim,
                                 num_heads=module.num_heads, num_layers=2, num_classes=module.num_classes,
                                 ff_dim=256))
    folder = tmp_path / "mnist-vit"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "vit.pt")
    (folder / "config.json").write_text(json.dumps({"num_heads": module.num_heads}))
    return folder, model


def encoder_attentions(layers: torch.nn.ModuleList) -> tuple[list[torch.Tensor], list]:
    """Each nn.TransformerEncoderLayer's attention probabilities: its input captured by a hook, its own
    self_attn called again with need_weights=True (post-norm: attention reads the layer's input)."""
    attentions = []

    def hook(layer, args):
        x = args[0]
        attentions.append(layer.self_attn(x, x, x, need_weights=True, average_attn_weights=False)[1])

    return attentions, [layer.register_forward_pre_hook(hook) for layer in layers]


@pytest.mark.parametrize("rgb", [False, True], ids=["mnist", "rgb"])
def test_mnist_tutorial_opens_exactly(tmp_path, rgb):
    folder, model = mnist_tutorial(tmp_path, rgb)
    images = torch.randn(3, 3, 32, 32) if rgb else torch.randn(3, 1, 28, 28)
    attentions, hooks = encoder_attentions(model.transformer_encoder.layers)
    with torch.no_grad():
        logits = model(images)
        for hook in hooks:
            hook.remove()
        for path in (folder, folder / "vit.pt"):
            checkpoint = open_source(path)
            assert checkpoint.config.post_norm and checkpoint.config.activation == "relu"
            assert_same(checkpoint.model(images, output_attentions=True), logits, attentions)


def test_mnist_tutorial_without_its_heads_asks_for_num_heads_in_one_line(tmp_path):
    folder, _ = mnist_tutorial(tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(SourceError, match=r"num_heads=N.*--arch scratch:num_heads=N") as error:
        open_source(folder / "vit.pt")
    assert "\n" not in str(error.value)


# -- the CIFAR-10 notebook -----------------------------------------------------------------------------------------

def test_cifar_notebook_opens_exactly(tmp_path):
    module = seed("seed004_cifar_vit")
    model = randomize(module.VisionTransformer(embed_dim=64, num_heads=4, depth=2))
    torch.save(model.state_dict(), tmp_path / "vit.pt")
    attentions = []
    for block in model.encoder:  # the notebook's attention returns only x; its probabilities pass attn_drop
        block.attn.attn_drop.register_forward_hook(lambda module, args, out: attentions.append(out))
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(images)
        checkpoint = open_source(tmp_path / "vit.pt", arch="scratch:num_heads=4")
        assert_same(checkpoint.model(images, output_attentions=True), logits, attentions)


# -- the annotated ViT: refused ------------------------------------------------------------------------------------

def test_annotated_vit_is_refused_saying_its_code_does_not_compute_a_vit(tmp_path):
    model = seed("seed003_annotated_vit").ViT(patch_size=8, emb_size=32, img_size=32, depth=2, n_classes=10,
                                             nhead=4, num_hidden_dim=64)
    torch.save(model.state_dict(), tmp_path / "annotated.pt")
    with pytest.raises(SourceError, match="does not compute a ViT.*batch_first") as error:
        open_source(tmp_path / "annotated.pt")
    assert "\n" not in str(error.value)


def test_explorer_analysis_of_the_post_norm_tutorial_shows_the_attention_its_code_computes(tmp_path):
    """The explorer recomputes each layer's attention from the stored token states: for post-norm blocks the
    attention reads the block's input itself, not a LayerNorm of it."""
    from PIL import Image

    from vit.explain.views import image_analysis

    folder, model = mnist_tutorial(tmp_path)
    pixels = torch.randint(0, 256, (28, 28), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    image = Image.fromarray(pixels.numpy(), mode="L")
    analysis = image_analysis.analyse(open_source(folder), image)
    images = ((pixels.float() / 255 - 0.5) / 0.5)[None, None]  # the assumed Normalize(0.5, 0.5)
    attentions, hooks = encoder_attentions(model.transformer_encoder.layers)
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    for layer, expected in enumerate(attentions):
        torch.testing.assert_close(analysis.attentions[layer], expected, rtol=0, atol=ATOL)


def test_a_config_json_without_any_model_type_or_weights_is_refused_briefly(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINTN_CONFIG))
    with pytest.raises(SourceError, match="no Hugging Face or timm config") as error:
        open_source(tmp_path)
    assert len(str(error.value)) < 300


def test_tintn_image_size_no_multiple_of_its_patch_opens_as_its_convolution_computes(tmp_path):
    """tintn's Conv2d(stride=P) on a 30-px image reads a 7x7 grid (28 px) and drops the last 2 rows and columns."""
    from PIL import Image

    from vit.core.images import to_uint8

    config = {**TINTN_CONFIG, "image_size": 30, "use_faster_attention": True}
    model = randomize(seed("seed000_tintn_vit").ViTForClassfication(config))
    save = seed("seed000_tintn_utils_save")
    save.save_experiment("odd", config, model, [1.0], [1.0], [0.1], base_dir=str(tmp_path))
    checkpoint = open_source(tmp_path / "odd")
    images = torch.randn(2, 3, 30, 30)
    with torch.no_grad():
        logits, attentions = model(images, output_attentions=True)
        assert_same(checkpoint.model(images[..., :28, :28], output_attentions=True), logits, attentions)
    p = checkpoint.preprocessing
    assert (p.image_size, p.resize_size, p.crop_rule) == (28, 30, "top_left")
    image = Image.fromarray(torch.randint(0, 256, (40, 50, 3), dtype=torch.uint8).numpy())
    assert torch.equal(to_uint8(image, 28, 3, 30, p.resize_mode, p.resample, p.crop_rule),
                       to_uint8(image, 30, 3, resample=p.resample)[:, :28, :28])


def test_a_from_scratch_model_named_by_its_config_json_has_no_note_on_naming_classes(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=True)
    assert "class_names" in open_source(folder).metadata["class_names_note"]
    config = json.loads((folder / "config.json").read_text())
    names = [f"kind {i}" for i in range(config["num_classes"])]
    (folder / "config.json").write_text(json.dumps({**config, "class_names": names}))
    checkpoint = open_source(folder)
    assert checkpoint.class_names == names and "class_names_note" not in checkpoint.metadata
