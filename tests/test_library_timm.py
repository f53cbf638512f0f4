"""The library road for timm (issue 91, item 1): a timm architecture no port reads opens as timm builds it; its
logits are timm's own forward, and every layer's and head's attention is what timm's explicit attention path computes
(the probabilities its ``attn_drop`` receives, recorded here by a hook of the test's own), and for timm's plain
``Attention`` what q and k of the layer's input give by hand. Each model is built tiny with random weights in timm
and saved with timm's ``save_for_hf``, never downloaded."""

from __future__ import annotations

import threading

import pytest
import torch

import vit
from vit.checkpoint import CheckpointError
from vit.model import ViT

timm = pytest.importorskip("timm")
from test_import_parity import timm_attentions  # noqa: E402
from timm.models import _hub  # noqa: E402  (timm's save_for_hf)

TINY = dict(depth=2, embed_dim=64, num_heads=2)
# architecture -> (constructor overrides, the prefix tokens before the patches): families the ports refuse
FAMILIES = {
    "flexivit_small": (dict(TINY, img_size=48, patch_size=8), 1),
    "vit_small_patch16_rope_mixed_224": (dict(TINY, img_size=48, patch_size=8), 1),  # timm's Eva, mixed RoPE
    "vit_base_patch16_rope_reg1_gap_256": (dict(TINY, img_size=48, patch_size=8), 1),  # a register, no CLS
    "vit_intern300m_patch14_448": (dict(TINY, img_size=56, patch_size=14), 1),
    "vit_relpos_small_patch16_224": (dict(TINY, img_size=48, patch_size=8), 0),  # relative position bias
}


def spread(model: torch.nn.Module) -> None:
    """Weights wide enough that every head's attention differs from uniform."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def build(name: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=3, **FAMILIES[name][0], **extra)
    spread(model)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, (args, _) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(name)
        _hub.save_for_hf(build(name), folder, model_args=args)
        out[name] = folder
    return out


def timms_own(name: str) -> torch.nn.Module:
    """The saved model as timm itself builds it from the same weights (the fixture's build is deterministic)."""
    return build(name)


def eager_attention(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's own explicit path: every block's attention with ``fused_attn`` off, the probabilities its
    ``attn_drop`` receives (``timm_attentions``); the logits of that forward."""
    for block in model.blocks:
        block.attn.fused_attn = False
    return timm_attentions(model, x)


def pixels(hw: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, hw, hw, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", FAMILIES)
def test_a_timm_family_without_a_port_opens_by_the_library_road(folders, name):
    checkpoint = vit.load(folders[name], device="cpu")
    assert checkpoint.road == "library" and checkpoint.metadata["architecture"] == f"timm:{name}"
    assert not isinstance(checkpoint.model, ViT)
    side = FAMILIES[name][0]["img_size"] // FAMILIES[name][0]["patch_size"]
    assert checkpoint.model.layout.num_prefix_tokens == FAMILIES[name][1]
    assert checkpoint.model.layout.grid == (side, side) and checkpoint.model.num_layers == 2
    assert checkpoint.model.is_classifier and len(checkpoint.class_names) == 3


@pytest.mark.parametrize("name", FAMILIES)
def test_its_logits_are_timms_and_every_layers_attention_is_timms_explicit_path(folders, name):
    checkpoint = vit.load(folders[name], device="cpu")
    x = pixels(FAMILIES[name][0]["img_size"])
    own = timms_own(name)
    with torch.no_grad():
        fused = own(x)
    out, kept = checkpoint.model.run(x)  # nothing asked: timm's fused path throughout
    assert torch.equal(out.logits, fused)
    eager_logits, reference = eager_attention(own, x)
    out, kept = checkpoint.model.run(x, layers=[0, 1])
    assert list(kept) == [0, 1]
    for layer in (0, 1):
        assert kept[layer].shape == reference[layer].shape
        torch.testing.assert_close(kept[layer], reference[layer], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits, eager_logits, atol=1e-5, rtol=0)


def test_the_plain_attentions_probabilities_are_softmax_of_q_and_k_by_hand(folders):
    checkpoint = vit.load(folders["flexivit_small"], device="cpu")
    x = pixels(48, batch=1)
    attention = checkpoint.model.model.blocks[1].attn
    inputs = []
    handle = attention.register_forward_hook(lambda mod, args, out: inputs.append(args[0].detach()))
    try:
        _, kept = checkpoint.model.run(x, layers=[1])
    finally:
        handle.remove()
    tokens = inputs[0]  # (1, T, C): the layer's normalised input
    B, T, C = tokens.shape
    q, k, _ = (tokens @ attention.qkv.weight.T + attention.qkv.bias).reshape(B, T, 3, 2, C // 2).permute(2, 0, 3, 1, 4)
    by_hand = torch.softmax(q @ k.transpose(-2, -1) * (C // 2) ** -0.5, dim=-1)
    torch.testing.assert_close(kept[1], by_hand, atol=1e-6, rtol=0)


def test_only_the_asked_layers_heads_and_rows_are_kept_and_the_others_run_fused(folders):
    checkpoint = vit.load(folders["flexivit_small"], device="cpu")
    x = pixels(48)
    _, whole = checkpoint.model.run(x, layers=[1])
    _, kept = checkpoint.model.run(x, layers=[-1], heads=[1], rows=[0, 3])
    assert list(kept) == [1] and kept[1].shape == (2, 1, 2, 37)
    torch.testing.assert_close(kept[1], whole[1][:, [1]][:, :, [0, 3]], atol=0, rtol=0)
    assert all(m.fused_attn for m in checkpoint.model._attention)  # outside a recording: timm's own flag


def test_concurrent_recordings_in_two_threads_never_mix(folders):
    checkpoint = vit.load(folders["vit_small_patch16_rope_mixed_224"], device="cpu")
    x = pixels(48)
    _, alone = checkpoint.model.run(x, layers=[0, 1])
    results, errors = {}, []

    def record(layer):
        try:
            for _ in range(5):
                results[layer] = checkpoint.model.run(x, layers=[layer])[1]
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=record, args=(layer,)) for layer in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for layer in (0, 1):
        assert list(results[layer]) == [layer]
        torch.testing.assert_close(results[layer][layer], alone[layer], atol=1e-6, rtol=0)


def test_vit_explain_places_a_non_square_grid_row_major_and_a_transposed_grid_would_fail(tmp_path):
    from PIL import Image

    from vit.core.inference import preprocess

    args = dict(TINY, img_size=(32, 48), patch_size=8)  # (height, width): 4 x 6 patches
    torch.manual_seed(0)
    model = timm.create_model("flexivit_small", pretrained=False, num_classes=2, **args)
    spread(model)
    _hub.save_for_hf(model.eval(), tmp_path, model_args=args)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.model.layout.grid == (4, 6)
    image = Image.fromarray((torch.rand(30, 50, 3, generator=torch.Generator().manual_seed(4)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=0, head=1, query=0)
    _, reference = eager_attention(model, preprocess([image], checkpoint.preprocessing))
    row = reference[0][0, 1, 0, 1:]  # CLS's row over the 24 patches, row-major
    assert explanation.map.shape == (4, 6)
    torch.testing.assert_close(torch.from_numpy(explanation.map), row.reshape(4, 6), atol=1e-6, rtol=0)
    assert not torch.allclose(torch.from_numpy(explanation.map), row.reshape(6, 4).T, atol=1e-6, rtol=0)
    rollout = vit.explain(checkpoint, image, "rollout")
    assert rollout.map.shape == (4, 6)


def test_a_timm_port_still_opens_by_its_port(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **TINY, img_size=32,
                              patch_size=8)
    _hub.save_for_hf(model.eval(), tmp_path, model_args=dict(TINY, img_size=32, patch_size=8))
    checkpoint = vit.load(tmp_path, device="cpu")
    assert isinstance(checkpoint.model, ViT) and checkpoint.road == "port"


@pytest.mark.parametrize("name, message", [
    # attention over channels alone (XCiT, with class-attention layers too, opens: tests/test_timm_layer_kinds.py;
    # PiT's pooled stages, refused here before, open: tests/test_layer_places.py; ViTamin's conv stem too:
    # tests/test_census_buckets.py)
    ("edgenext_xx_small", "the recorder cannot place it: its cross-covariance attention \\(CrossCovarianceAttn"),
])
def test_a_timm_model_the_road_cannot_place_is_refused_in_one_line_naming_why(tmp_path, name, message):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=3)
    _hub.save_for_hf(model.eval(), tmp_path)
    with pytest.raises(CheckpointError, match=message) as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value) and "is not supported" in str(refused.value)


def test_weights_that_do_not_fit_the_architecture_are_refused_in_one_line(folders, tmp_path):
    import json
    import shutil

    for f in folders["flexivit_small"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"]["embed_dim"] = 128  # declared twice the width the weights hold
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="the weights do not fit flexivit_small") as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)


def test_open_source_without_the_library_road_keeps_the_ports_refusal(folders):
    """open_source without ``library_road``, as the Analyse and Train pages open a model (the explorer, vit-predict
    and vit-evaluate pass it: tests/test_library_explorer.py, tests/test_library_commands.py)."""
    from vit.sources.open import open_source

    with pytest.raises(CheckpointError, match="is not supported") as refused:
        open_source(folders["flexivit_small"])
    assert "as timm builds it" not in str(refused.value)


@pytest.mark.parametrize("edit, message", [
    ({"depth": 10**6}, "declare 1000000 layers, over the 1000"),
    ({"embed_dim": 10**9}, "embed_dim is over 1,000,000"),
    ({"img_size": 10**5}, "img_size .* is not a side"),
])
def test_declared_sizes_past_what_can_be_built_are_refused_before_the_build(folders, tmp_path, monkeypatch, edit,
                                                                               message):
    import json
    import shutil

    from vit.sources.library_road import timm_models

    for f in folders["flexivit_small"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"].update(edit)
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(timm_models, "_build", lambda *a: pytest.fail("built before the declared sizes' check"))
    with pytest.raises(CheckpointError, match=message) as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)


# --- open_clip towers with a timm trunk (SigLIP 2, PE-Core): open_clip's own tower, the trunk's attention recorded ---

TRUNKS = {  # timm trunk -> (vision_cfg beside it, the prefix tokens): PE-Core's (timm's Eva, RoPE, a CLS), and
    # SigLIP 2's kind (timm's ViT with attention pooling) at a tiny width; open_clip builds the trunk at its own size
    "vit_pe_core_tiny_patch16_384": (dict(image_size=384, timm_pool="map", timm_proj=None), 1),
    "vit_tiny_patch16_224": (dict(image_size=224, timm_pool="map", timm_proj="none"), 1),
}


def open_clip_folder(folder, trunk: str):
    open_clip = pytest.importorskip("open_clip")
    open_clip_hub = pytest.importorskip("open_clip.push_to_hf_hub")
    from safetensors.torch import save_file

    vision, _ = TRUNKS[trunk]
    model_cfg = dict(embed_dim=16, vision_cfg=dict(vision, timm_model_name=trunk, timm_model_pretrained=False),
                     text_cfg=dict(context_length=8, vocab_size=64, width=64, heads=1, layers=1))
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**model_cfg)
    spread(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    return folder


@pytest.mark.parametrize("trunk", TRUNKS)
def test_an_open_clip_tower_with_a_timm_trunk_opens_as_open_clip_builds_it(tmp_path, trunk):
    open_clip = pytest.importorskip("open_clip")
    from PIL import Image

    from vit.core.inference import preprocess

    folder = open_clip_folder(tmp_path, trunk)
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.road == "library" and checkpoint.metadata["architecture"] == f"open_clip:timm:{trunk}"
    side = TRUNKS[trunk][0]["image_size"] // 16
    assert checkpoint.model.layout.grid == (side, side)
    assert checkpoint.model.layout.num_prefix_tokens == TRUNKS[trunk][1]
    reference, transform = open_clip.create_model_from_pretrained(f"local-dir:{folder}")
    reference.eval()
    image = Image.fromarray((torch.rand(50, 70, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    x = preprocess([image], checkpoint.preprocessing)
    torch.testing.assert_close(x, transform(image)[None], atol=1e-6, rtol=0)  # open_clip's own transform
    with torch.no_grad():
        expected = reference.encode_image(x)
    out, _ = checkpoint.model.run(x)
    torch.testing.assert_close(out.image_embeds, expected, atol=1e-6, rtol=0)
    _, eager = eager_attention(reference.visual.trunk, x)
    _, kept = checkpoint.model.run(x, layers=range(checkpoint.model.num_layers))
    assert len(kept) == len(eager) == len(reference.visual.trunk.blocks)
    for layer, probabilities in kept.items():
        torch.testing.assert_close(probabilities, eager[layer], atol=1e-6, rtol=0)
    explanation = vit.explain(checkpoint, image, "attention", layer=-1, head=1, query=0)
    torch.testing.assert_close(torch.from_numpy(explanation.map), eager[-1][0, 1, 0, 1:].reshape(side, side),
                               atol=1e-6, rtol=0)


def test_open_source_without_the_library_road_keeps_the_open_clip_ports_refusal_of_a_timm_trunk(tmp_path):
    """open_source without ``library_road``, as the Analyse and Train pages open a model (the explorer, vit-predict
    and vit-evaluate pass it: tests/test_library_commands.py)."""
    from vit.sources.open import open_source

    folder = open_clip_folder(tmp_path, "vit_tiny_patch16_224")
    with pytest.raises(CheckpointError) as refused:
        open_source(folder)
    assert "as open_clip builds it" not in str(refused.value) and "\n" not in str(refused.value)


def test_transformers_timm_wrapper_opens_by_the_timm_port_as_its_own_forward(tmp_path):
    """A timm model saved through transformers (``TimmWrapperForImageClassification``) keeps timm's keys under
    ``timm_model.``: it opens by timm's port (issue 91's census found it refused), its logits its own forward's."""
    transformers = pytest.importorskip("transformers")
    args = dict(depth=2, embed_dim=64, num_heads=2, img_size=32, patch_size=8)
    config = transformers.TimmWrapperConfig(architecture="vit_tiny_patch16_224", model_args=args, num_labels=3)
    torch.manual_seed(0)
    model = transformers.TimmWrapperForImageClassification(config).eval()
    spread(model)
    model.save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "port" and len(checkpoint.class_names) == 3
    x = pixels(32)
    with torch.no_grad():
        ours, _ = checkpoint.model(x)
        theirs = model(pixel_values=x).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
