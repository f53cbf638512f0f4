"""The vision towers inside vision-language models, opened from the VLM's own folder: LLaVA (1.5, NeXT, OneVision),
PaliGemma and Gemma 3 (issue 68).

References are transformers' own models with random weights (σ 0.05 noise on every parameter, eager attention),
saved whole with ``save_pretrained`` in several shards: every tower layer's attention (``output_attentions``) and
the projector's output (``get_image_features``) equal to 1e-5.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.model import ViT, ViTConfig
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5


def noisy(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """σ 0.05 noise on every parameter (norms, biases and the projector's zeros included), eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


# -- the projector block against transformers' own ----------------------------------------------------------------

def _tower(**projector) -> ViT:
    config = ViTConfig(32, 8, 3, 0, hidden_size=32, num_layers=1, num_heads=2, mlp_size=48, pooling="avg",
                       **projector)
    return ViT(config).eval()


def test_the_mlp_projector_is_llavas():
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(hidden_size=32, num_attention_heads=2),
        text_config=transformers.LlamaConfig(hidden_size=24, num_attention_heads=2))
    theirs = noisy(transformers.models.llava.modeling_llava.LlavaMultiModalProjector(config))
    model = _tower(projector="mlp", projector_dim=24, projector_skip=1)
    model.projector.load_state_dict({"fc1.weight": theirs.linear_1.weight, "fc1.bias": theirs.linear_1.bias,
                                     "fc2.weight": theirs.linear_2.weight, "fc2.bias": theirs.linear_2.bias})
    tokens = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.projector(tokens, (4, 4)), theirs(tokens), rtol=0, atol=ATOL)


def test_the_gemma3_projector_pools_norms_and_projects_as_gemma3s():
    config = transformers.Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", image_size=64, patch_size=8, hidden_size=32,
                           num_attention_heads=2),
        text_config=dict(model_type="gemma3_text", hidden_size=24, num_attention_heads=2, head_dim=12),
        mm_tokens_per_image=4)
    theirs = noisy(transformers.models.gemma3.modeling_gemma3.Gemma3MultiModalProjector(config))
    model = _tower(projector="gemma3", projector_dim=24, projector_pool=4, class_token=False)
    model.projector.load_state_dict({"fc1.weight": theirs.mm_input_projection_weight.t(),
                                     "norm.weight": 1 + theirs.mm_soft_emb_norm.weight})
    tokens = torch.randn(2, 64, 32)  # an 8 x 8 grid, pooled 4 x 4 to 2 x 2
    with torch.no_grad():
        torch.testing.assert_close(model.projector(tokens, (8, 8)), theirs(tokens), rtol=0, atol=ATOL)


def test_the_gemma3_pool_refuses_a_grid_it_does_not_tile_in_one_line():
    model = _tower(projector="gemma3", projector_dim=24, projector_pool=4, class_token=False)
    with pytest.raises(ValueError, match="not made of whole 4x4 cells") as e:
        model.projector(torch.randn(1, 30, 32), (5, 6))
    assert "\n" not in str(e.value)


# -- tiny VLMs built and saved by transformers --------------------------------------------------------------------

CLIP_TOWER = dict(model_type="clip_vision_model", image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=2)
SIGLIP_TOWER = dict(CLIP_TOWER, model_type="siglip_vision_model", vision_use_head=False)
TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=12, vocab_size=256)
PINPOINTS = [[32, 64], [64, 32], [64, 64]]


def _llava(kind: str):
    if kind == "llava":
        config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(TEXT, model_type="llama"),
                                          image_token_id=3)
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return transformers.LlavaForConditionalGeneration, config, processor
    if kind in ("llava_next", "llava_next_video"):  # NeXT-Video: NeXT's tower and projector beside its video pooling
        video = kind == "llava_next_video"
        config = (transformers.LlavaNextVideoConfig if video else transformers.LlavaNextConfig)(
            vision_config=CLIP_TOWER, text_config=dict(TEXT, model_type="llama"), image_grid_pinpoints=PINPOINTS,
            **(dict(image_token_index=3, video_token_index=4) if video else dict(image_token_id=3)))
        processor = transformers.LlavaNextImageProcessor(size={"shortest_edge": 32},
                                                         crop_size={"height": 32, "width": 32},
                                                         image_grid_pinpoints=PINPOINTS)
        return (transformers.LlavaNextVideoForConditionalGeneration if video
                else transformers.LlavaNextForConditionalGeneration), config, processor
    config = transformers.LlavaOnevisionConfig(vision_config=SIGLIP_TOWER, text_config=dict(TEXT, model_type="qwen2"),
                                               image_token_id=3, image_grid_pinpoints=PINPOINTS)
    processor = transformers.LlavaOnevisionImageProcessor(size={"height": 32, "width": 32},
                                                          image_grid_pinpoints=PINPOINTS, image_mean=[0.5] * 3,
                                                          image_std=[0.5] * 3)
    return transformers.LlavaOnevisionForConditionalGeneration, config, processor


def _gemma(kind: str):
    if kind == "paligemma":
        config = transformers.PaliGemmaConfig(vision_config=SIGLIP_TOWER, text_config=dict(TEXT, model_type="gemma"),
                                              projection_dim=24, image_token_id=3)
        processor = transformers.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3)
        return transformers.PaliGemmaForConditionalGeneration, config, processor
    tower = dict(SIGLIP_TOWER, image_size=64)  # an 8 x 8 grid, pooled 4 x 4 into Gemma 3's 2 x 2 image tokens
    config = transformers.Gemma3Config(vision_config=tower, text_config=dict(TEXT, model_type="gemma3_text"),
                                       mm_tokens_per_image=4, image_token_id=3)
    processor = transformers.Gemma3ImageProcessor(size={"height": 64, "width": 64})
    return transformers.Gemma3ForConditionalGeneration, config, processor


KINDS = ["llava", "llava_next", "llava_next_video", "llava_onevision", "paligemma", "gemma3"]
# of the tower's 3 layers
DEPTH = {"llava": 2, "llava_next": 2, "llava_next_video": 2, "llava_onevision": 3, "paligemma": 3, "gemma3": 3}
NATIVE = {"gemma3": (64, 64)}
OTHER = {"gemma3": (48, 80)}  # another aspect: the tower's positions interpolated as its library does


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """Each VLM built by transformers with σ 0.05 noise on every parameter, saved whole in many shards with its
    image processor: ``{kind: (folder, model, processor)}``."""
    built = {}
    for kind in KINDS:
        model_class, config, processor = _llava(kind) if kind.startswith("llava") else _gemma(kind)
        torch.manual_seed(0)
        model = noisy(model_class(config))
        model.set_attn_implementation("eager")
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        built[kind] = folder, model, processor
    return built


def _tower_of(model):
    return model.model.vision_tower


@pytest.mark.parametrize("kind", KINDS)
def test_every_tower_layer_attends_as_transformers_at_two_sizes(vlms, kind):
    folder, model, _ = vlms[kind]
    checkpoint = open_source(folder)
    assert checkpoint.config.num_layers == DEPTH[kind] and checkpoint.model.head is None
    for size in (NATIVE.get(kind, (32, 32)), OTHER.get(kind, (40, 24))):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            theirs = _tower_of(model)(pixel_values=images, output_attentions=True,
                                      interpolate_pos_encoding=size != NATIVE.get(kind, (32, 32)))
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert len(ours.attentions) == DEPTH[kind]
        for mine, reference in zip(ours.attentions, theirs.attentions[:DEPTH[kind]], strict=True):
            assert mine.shape == reference.shape
            torch.testing.assert_close(mine, reference, rtol=0, atol=ATOL)


def _image_features(model, kind: str, images: torch.Tensor) -> torch.Tensor:
    """What transformers' ``get_image_features`` gives the language model for each image, (B, N, E); LLaVA-NeXT
    and OneVision: the base tile's rows (the first tile of each image's tiles, packed first)."""
    with torch.no_grad():
        if kind in ("llava_next", "llava_next_video", "llava_onevision"):
            from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

            image_size = [48, 80]
            tiles = image_size_to_num_patches(image_size, PINPOINTS, 32)
            out = []
            for base in images:
                pixels = torch.cat([base[None], torch.randn(tiles - 1, *base.shape)])[None]  # (1, tiles, C, H, W)
                features = model.get_image_features(pixel_values=pixels, image_sizes=torch.tensor([image_size]))
                out.append(features.pooler_output[0][:16])  # the base tile's 4 x 4 tokens come first
            return torch.stack(out)
        features = model.get_image_features(pixel_values=images).pooler_output
        return torch.stack(list(features)) if isinstance(features, (list, tuple)) else features


@pytest.mark.parametrize("kind", KINDS)
def test_the_projector_gives_what_get_image_features_gives_the_language_model(vlms, kind):
    folder, model, _ = vlms[kind]
    checkpoint = open_source(folder)
    images = torch.randn(2, 3, *NATIVE.get(kind, (32, 32)))
    expected = _image_features(model, kind, images)
    with torch.no_grad():
        x, _ = checkpoint.model.tokens(images)
        ours = checkpoint.model.project(x, checkpoint.model.patch_grid(*images.shape[2:]))
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)


def _index(folder) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


def _is_tower_tensor(name: str, kind: str) -> bool:
    """Whether a tensor of the saved VLM belongs to what the tower opened here computes (by hand, per family)."""
    if name.startswith("multi_modal_projector."):
        return True
    if not name.startswith("vision_tower."):
        return False
    inner = name[len("vision_tower."):]
    layers = tuple(f"encoder.layers.{i}." for i in range(DEPTH[kind]))
    final = ("post_layernorm.",) if kind in ("paligemma", "gemma3") else ()
    return inner.startswith(("embeddings.", "pre_layrnorm.", *layers, *final))


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_towers_tensors_are_read_and_only_the_shards_that_hold_them_opened(vlms, kind, monkeypatch):
    from safetensors import safe_open

    folder, _, _ = vlms[kind]
    opened, read = [], []

    class Recording:
        def __init__(self, path, **kwargs):
            opened.append(Path(path).name)
            self.file = safe_open(path, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.file.get_tensor(name)

    def whole_file(*args, **kwargs):
        raise AssertionError("a whole safetensors file was read")

    monkeypatch.setattr("safetensors.safe_open", Recording)
    monkeypatch.setattr("safetensors.torch.load_file", whole_file)
    open_source(folder)
    weight_map = _index(folder)
    tower = sorted(k for k in weight_map if _is_tower_tensor(k, kind))
    assert sorted(read) == tower  # the language model's, the head's and the later layers' never
    assert set(opened) == {weight_map[k] for k in tower}
    assert len(set(weight_map.values())) >= 5 and set(weight_map.values()) - set(opened)  # the LM's stay shut


@pytest.mark.parametrize("kind", KINDS)
def test_the_image_is_prepared_as_the_folders_own_image_processor_prepares_the_towers_view(vlms, kind):
    from vit.core.inference import preprocess

    folder, _, processor = vlms[kind]
    checkpoint = open_source(folder)
    for width, height in ((640, 480), (300, 500)):
        image = Image.fromarray(np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8))
        pixels = processor(images=image, return_tensors="pt")["pixel_values"][0]
        expected = pixels[0] if pixels.dim() == 4 else pixels  # LLaVA-NeXT, OneVision: the base tile comes first
        ours = preprocess([image], checkpoint.preprocessing)[0]
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


def test_the_metadata_says_which_layer_the_tower_ends_at_and_which_tile_is_shown(vlms):
    llava = open_source(vlms["llava"][0]).metadata["tower"]
    assert "first 2 layers (of 3; vision_feature_layer -2)" in llava and "the CLS" in llava
    assert "base tile alone, the whole image resized to 32x32" in open_source(vlms["llava_next"][0]).metadata["tower"]
    gemma = open_source(vlms["gemma3"][0]).metadata["tower"]
    assert "after its final norm" in gemma and "Gemma3MultiModalProjector" in gemma and "pans" not in gemma


def test_gemma3_with_pan_and_scan_says_the_crops_are_not_shown(vlms, tmp_path):
    folder = _edited(vlms["gemma3"][0], tmp_path, processor=dict(do_pan_and_scan=True))
    assert "the whole image alone, its first view" in open_source(folder).metadata["tower"]


def _noise_image(width: int = 120, height: int = 100) -> np.ndarray:
    return np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("kind", ["llava", "gemma3"])
def test_vit_load_explains_attention_and_refuses_the_class_maps_in_one_line(vlms, kind):
    import vit

    checkpoint = vit.load(str(vlms[kind][0]))
    assert set(vit.methods(checkpoint)) >= {"attention", "rollout"}
    explanation = vit.explain(checkpoint, _noise_image(), "attention", layer=-1, head=0)
    assert explanation.map.shape == checkpoint.config.grid_size
    for method in ("class", "legrad", "attnlrp"):
        with pytest.raises(ValueError, match=f"{method} does not apply to this model") as e:
            vit.explain(checkpoint, _noise_image(), method)
        assert "\n" not in str(e.value)


def test_the_catalogue_describes_the_tower_from_its_shard_headers_alone(vlms, monkeypatch):
    from vit.app.catalog import Candidate, describe_import

    parameters = sum(p.numel() for p in open_source(vlms["llava_next"][0]).model.parameters())

    def no_data(*args, **kwargs):
        raise AssertionError("a tensor was read to describe the model")

    monkeypatch.setattr("vit.sources.weights_files._read_tensors", no_data)
    entry = describe_import(Candidate(vlms["llava_next"][0], "file", "llava-next"))
    assert entry.ok, entry.error
    assert entry.metadata["architecture"] == "hf:LlavaNextForConditionalGeneration" and entry.class_names == ()
    assert entry.num_layers == 2 and entry.image_size == 32
    assert entry.parameters == parameters
    assert "base tile alone" in entry.description and "no classifier" in entry.description


@pytest.mark.parametrize("kind", ["llava", "gemma3"])
def test_a_hub_id_downloads_the_towers_shards_alone_then_opens_from_the_cache(vlms, kind, fake_hub):
    from vit.app.catalog import hf_cache_listing

    folder, model, _ = vlms[kind]
    fake_hub.add_folder(f"acme/{kind}-tiny", folder)
    by_path = open_source(folder).model.state_dict()
    for _ in range(2):  # downloaded, then read from the HF cache
        by_id = open_source(f"acme/{kind}-tiny").model.state_dict()
        assert by_id.keys() == by_path.keys() and all(torch.equal(by_id[k], by_path[k]) for k in by_path)
    weight_map = _index(folder)
    shards = sorted(f for f in fake_hub.fetched("GET") if f.endswith(".safetensors"))
    assert shards == sorted({weight_map[k] for k in weight_map if _is_tower_tensor(k, kind)})
    assert len(shards) < len(set(weight_map.values()))  # the language model's shards never leave the Hub
    listed = hf_cache_listing().candidates
    assert [c.name for c in listed] == [f"acme/{kind}-tiny"]  # the HF cache's copy is listed, and opens
    assert open_source(listed[0].path).config.num_layers == DEPTH[kind]


def test_an_opened_tower_saved_as_our_checkpoint_keeps_its_projector(vlms, tmp_path):
    from vit.checkpoint import load_checkpoint, save_checkpoint

    checkpoint = open_source(vlms["gemma3"][0])
    save_checkpoint(tmp_path / "gemma3.pt", checkpoint.model, [], checkpoint.preprocessing, checkpoint.metadata)
    again = load_checkpoint(tmp_path / "gemma3.pt")
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = checkpoint.model.project(checkpoint.model.tokens(images)[0], (8, 8))
        torch.testing.assert_close(again.model.project(again.model.tokens(images)[0], (8, 8)), expected,
                                   rtol=0, atol=0)


def _edited(folder, tmp_path, config=None, processor=None):
    """A copy of ``folder`` with entries of its config.json (or its image processor's) replaced."""
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    for name, changes in (("config.json", config), ("preprocessor_config.json", processor)):
        if changes:
            values = json.loads((copy / name).read_text())
            values.update(changes)
            (copy / name).write_text(json.dumps(values))
    return copy


@pytest.mark.parametrize("config, processor, message", [
    (dict(vision_config=dict(CLIP_TOWER, model_type="dinov2")), None, "vision tower 'dinov2' is not supported"),
    (dict(vision_feature_layer=0), None, "vision_feature_layer 0 reads no layer of a 3-layer tower"),
    (dict(vision_feature_select_strategy="spatial"), None, "vision_feature_select_strategy 'spatial' is not"),
    (None, dict(image_processor_type="LlavaImageProcessor", do_pad=True), "pads each image to a square"),
])
def test_what_a_llava_folder_asks_for_that_is_not_reproduced_is_refused_in_one_line(vlms, tmp_path, config,
                                                                                    processor, message):
    from vit.sources.open import SourceError

    with pytest.raises(SourceError, match=message) as e:
        open_source(_edited(vlms["llava"][0], tmp_path, config, processor))
    assert "\n" not in str(e.value)


def test_a_llava_read_at_several_layers_opens_to_the_deepest_without_its_projector(vlms, tmp_path):
    checkpoint = open_source(_edited(vlms["llava"][0], tmp_path, dict(vision_feature_layer=[-3, -2])))
    assert checkpoint.config.num_layers == 2 and checkpoint.model.projector is None
    assert "projector is left out" in checkpoint.metadata["tower"]


@pytest.mark.parametrize("kind", ["llava", "paligemma"])
def test_q_k_and_v_are_read_into_the_one_qkv_tensor_the_tower_keeps_not_copied_into_it(vlms, kind):
    """The reader fills one buffer per layer with q, k and v (in whichever shards they are), and the mapping takes
    it whole: no second copy of the three is ever held (a LLaVA-shaped folder peaked 22 % over its tower's size)."""
    from vit.sources.open import read_hf_weights, read_json
    from vit.sources.vlm import import_vlm

    folder = vlms[kind][0]
    config_json = read_json(folder / "config.json")
    state = read_hf_weights(folder, "cpu", import_vlm.wanted(config_json))
    config = import_vlm.config_from_hf(config_json, state)
    ours = import_vlm.state_dict_from_hf(state, config)
    weight_map, spread = _index(folder), 0
    for i in range(config.num_layers):
        for part in ("weight", "bias"):
            names = [f"vision_tower.encoder.layers.{i}.self_attn.{n}_proj.{part}" for n in "qkv"]
            qkv = ours[f"blocks.{i}.attn.qkv.{part}"]
            assert qkv.data_ptr() == state[names[0]].data_ptr()  # the buffer itself, q's rows first
            torch.testing.assert_close(qkv, torch.cat([state[n] for n in names]), rtol=0, atol=0)
            spread += len({weight_map[n] for n in names}) > 1
    assert spread  # some layer's q, k and v sit in different shards


# -- LLaVA-NeXT whose base view is resized past its crop (issue 76) ----------------------------------------------

NEXT_TOWER = dict(CLIP_TOWER, image_size=56, patch_size=14)  # a 4 x 4 grid, as the 56-px crop gives
NEXT_PINPOINTS = [[56, 112], [112, 56], [112, 112]]


@pytest.fixture(scope="module")
def cropping_llava_next(tmp_path_factory):
    """A tiny LLaVA-NeXT (σ 0.05 noise) saved twice, with processors resizing the base view's square to 70 and to 64
    px before their centre 56 x 56 crop: ``{shortest_edge: (folder, model, processor)}``."""
    config = transformers.LlavaNextConfig(vision_config=NEXT_TOWER, text_config=dict(TEXT, model_type="llama"),
                                          image_token_id=3, image_grid_pinpoints=NEXT_PINPOINTS)
    torch.manual_seed(0)
    model = noisy(transformers.LlavaNextForConditionalGeneration(config))
    model.set_attn_implementation("eager")
    built = {}
    for shortest in (70, 64):
        processor = transformers.LlavaNextImageProcessor(size={"shortest_edge": shortest},
                                                         crop_size={"height": 56, "width": 56},
                                                         image_grid_pinpoints=NEXT_PINPOINTS)
        folder = tmp_path_factory.mktemp(f"llava_next_{shortest}")
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        built[shortest] = folder, model, processor
    return built


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
@pytest.mark.parametrize("shortest", [70, 64])
def test_llava_next_shows_the_tower_the_processors_centre_crop_of_its_base_view(cropping_llava_next, shortest,
                                                                                backend, monkeypatch):
    """LlavaNextImageProcessor resizes the base view to shortest_edge square, then crops its centre crop_size, as
    each tile: the tower reads that 56-px crop (16 tokens), not the whole 70-px square (25), and at 64 px opens.
    Both of transformers' backends (``*ImageProcessor``, ``*ImageProcessorPil``) to float32 rounding."""
    from vit.core.inference import preprocess

    monkeypatch.setenv("VIT_HF_IMAGE_BACKEND", backend)
    folder, model, processor = cropping_llava_next[shortest]
    if backend == "pil":
        processor = transformers.LlavaNextImageProcessorPil(**processor.to_dict())
    checkpoint = open_source(folder)
    image = Image.fromarray(_noise_image(130, 100))
    pixels = processor(images=image, return_tensors="pt")
    expected = pixels["pixel_values"][0, 0]  # the base view comes first
    ours = preprocess([image], checkpoint.preprocessing)
    assert ours.shape == (1, *expected.shape)
    torch.testing.assert_close(ours[0], expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        theirs = _tower_of(model)(pixel_values=expected[None], output_attentions=True)
        mine = checkpoint.model.encode(ours, output_attentions=True)
        for a, reference in zip(mine.attentions, theirs.attentions[:DEPTH["llava_next"]], strict=True):
            assert a.shape == reference.shape == (1, 2, 17, 17)
            torch.testing.assert_close(a, reference, rtol=0, atol=ATOL)
        features = model.get_image_features(**pixels).pooler_output[0][:16]  # the base view's 4 x 4 tokens first
        x, _ = checkpoint.model.tokens(ours)
        torch.testing.assert_close(checkpoint.model.project(x, (4, 4))[0], features, rtol=0, atol=ATOL)
    assert f"resized to {shortest}x{shortest}, then its centre 56x56" in checkpoint.metadata["tower"]


def test_a_llava_onevision_tower_whose_side_is_no_whole_number_of_patches_reads_as_transformers(tmp_path):
    """LLaVA-OneVision's tower is SigLIP so400m at 384 px in 14-px patches; here 36 px in 8-px patches. The tower is
    built at the patches' 32 px and fed the processor's base tile cropped at its top left (the pixels transformers'
    convolution reads): our input is that crop, and every layer's attention is transformers' own on the whole tile."""
    from vit.core.inference import preprocess

    pinpoints = [[36, 72], [72, 36], [72, 72]]
    config = transformers.LlavaOnevisionConfig(vision_config=dict(SIGLIP_TOWER, image_size=36),
                                               text_config=dict(TEXT, model_type="qwen2"), image_token_id=3,
                                               image_grid_pinpoints=pinpoints)
    processor = transformers.LlavaOnevisionImageProcessor(size={"height": 36, "width": 36},
                                                          image_grid_pinpoints=pinpoints, image_mean=[0.5] * 3,
                                                          image_std=[0.5] * 3)
    torch.manual_seed(0)
    model = noisy(transformers.LlavaOnevisionForConditionalGeneration(config))
    model.set_attn_implementation("eager")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    checkpoint = open_source(tmp_path)
    assert checkpoint.config.image_size == 32 and checkpoint.preprocessing.crop_rule == "top_left"
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    tile = processor(images=image, return_tensors="pt")["pixel_values"][0][:1]  # the base tile, (1, C, 36, 36)
    ours = preprocess([image], checkpoint.preprocessing)
    torch.testing.assert_close(ours, tile[..., :32, :32], rtol=0, atol=1e-5)
    with torch.no_grad():
        theirs = _tower_of(model)(pixel_values=tile, output_attentions=True)
        mine = checkpoint.model.encode(ours, output_attentions=True)
    for layer, reference in zip(mine.attentions, theirs.attentions[:DEPTH["llava_onevision"]], strict=True):
        torch.testing.assert_close(layer, reference, rtol=0, atol=ATOL)
