"""dino.txt, DINOv3's text-aligned head (issue 94, item 1): a tiny random dino.txt built from the authors' own modules
(``tests/reference/dinotxt``: facebookresearch/dinov3's ``DINOTxt``, ``DinoVisionTransformer``, ``TextTransformer``
and tokenizer, unchanged), saved in the authors' file layout (the backbone's ``.pth``, and the head and text file the
hub loads over it), opened by ``vit.load``; ``vit.ask``'s labels equal the authors' ``get_logits`` and each label's
map the authors' zero-shot segmentation notebook (``predict_whole``, run from its cells) on the same pixels.
"""

import gzip
import io
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from peak_memory import can_reset_the_peak, run_measured
from PIL import Image
from test_app import charts, dirs, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)

import vit
from vit.core.inference import InputSize
from vit.explain.language import prompts, words
from vit.sources.files import BPE_VOCABULARY, SourceError
from vit.sources.vlm.text_tower import open_text_tower

REFERENCE = Path(__file__).resolve().parent / "reference"
if str(REFERENCE / "dinotxt") not in sys.path:  # the authors' package, importable as ``dinov3`` (kept verbatim)
    sys.path.insert(0, str(REFERENCE / "dinotxt"))

from dinov3.eval.text.dinotxt_model import DINOTxt, DINOTxtConfig  # noqa: E402
from dinov3.eval.text.text_transformer import TextTransformer  # noqa: E402
from dinov3.eval.text.tokenizer import get_tokenizer  # noqa: E402
from dinov3.models.vision_transformer import DinoVisionTransformer  # noqa: E402

WIDTH, TEXT_WIDTH = 64, 128  # the backbone's (4 heads of 16) and the text tower's (2 heads of 64, as the released)
PATCH = 8
NOISE = 0.05  # on every weight after the authors' init: layer scale starts at 1e-5, which would hide the blocks
HEAD_FILE = "dinov3_vits8_dinotxt_vision_head_and_text_encoder-tiny.pth"
BACKBONE_FILE = "dinov3_vits8_pretrain_tiny-00000000.pth"
LABELS = ["a dog", "a red chair", "the sky"]


def bpe_vocabulary() -> str:
    """CLIP's BPE vocabulary, which dino.txt's hub downloads (``bpe_simple_vocab_16e6.txt.gz``): open_clip's copy."""
    import open_clip

    return str(Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz")


def authors_dinotxt() -> DINOTxt:
    """``dinov3_vitl16_dinotxt_tet1280d20h24l`` of ``dinov3/hub/dinotxt.py`` at a tiny size: its DINOTxtConfig, a
    ViT-L/16-like backbone (``dinov3_vitl16``'s options) 64 wide and 2 deep, a text transformer 128 wide and 2 deep,
    initialised by the authors' ``init_weights`` and then perturbed."""
    backbone = DinoVisionTransformer(
        img_size=32, patch_size=PATCH, pos_embed_rope_base=100, pos_embed_rope_normalize_coords="separate",
        pos_embed_rope_rescale_coords=2, pos_embed_rope_dtype="fp32", embed_dim=WIDTH, depth=2, num_heads=4,
        ffn_ratio=4, qkv_bias=True, drop_path_rate=0.0, layerscale_init=1.0e-05, norm_layer="layernormbf16",
        ffn_layer="mlp", ffn_bias=True, proj_bias=True, n_storage_tokens=4, mask_k_bias=True)
    config = DINOTxtConfig(
        embed_dim=2 * WIDTH, vision_model_freeze_backbone=True, vision_model_train_img_size=224,
        vision_model_use_class_token=True, vision_model_use_patch_tokens=True, vision_model_num_head_blocks=2,
        vision_model_head_blocks_drop_path=0.3, vision_model_use_linear_projection=False,
        vision_model_patch_tokens_pooler_type="mean", vision_model_patch_token_layer=1,
        text_model_freeze_backbone=False, text_model_num_head_blocks=0, text_model_head_blocks_is_causal=False,
        text_model_head_blocks_drop_prob=0.0, text_model_tokens_pooler_type="argmax",
        text_model_use_linear_projection=True, init_logit_scale=math.log(1 / 0.07), init_logit_bias=None,
        freeze_logit_scale=False)
    text = TextTransformer(context_length=77, vocab_size=49408, dim=TEXT_WIDTH, num_heads=2, num_layers=2,
                           ffn_ratio=4, is_causal=True, ls_init_value=None, dropout_prob=0.0)
    torch.manual_seed(0)
    model = DINOTxt(model_config=config, vision_backbone=backbone, text_backbone=text)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * NOISE)
    return model.eval()


def save_authors_layout(model: DINOTxt, folder: Path, whole: bool = False) -> Path:
    """The released files: the backbone's state dict, and the rest of ``DINOTxt``'s (the vision head, the text
    tower, ``logit_scale``), which the hub loads over the backbone with ``strict=False``; ``whole``: one file of
    the whole ``DINOTxt`` instead. Returns the head and text file."""
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if not whole:
        torch.save(model.visual_model.backbone.state_dict(), folder / BACKBONE_FILE)
        state = {k: v for k, v in state.items() if not k.startswith("visual_model.backbone.")}
    torch.save(state, folder / HEAD_FILE)
    return folder / HEAD_FILE


@pytest.fixture(scope="module")
def dinotxt(tmp_path_factory):
    """The authors' tiny dino.txt, its files, and ``vit.load`` of them."""
    model = authors_dinotxt()
    head = save_authors_layout(model, tmp_path_factory.mktemp("dinotxt"))
    return model, head, vit.load(head)


def photo(height: int = 40, width: int = 60) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def notebook_cells() -> dict[str, str]:
    """The verbatim cells of the authors' zero-shot segmentation notebook (``dinotxt_cells.py``), by name."""
    text = (REFERENCE / "dinov3_notebooks" / "dinotxt_cells.py").read_text()
    parts = re.split(r"^# %% (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def authors_segmentation(model: DINOTxt, pixels: torch.Tensor, class_names: list[str]) -> torch.Tensor:
    """The notebook's text features of ``class_names`` (its 80 templates) and ``predict_whole`` of one image
    ``pixels (3, H, W)``: ``(n, h, w)`` cosines. The cells run as written but for their device: the notebook runs on
    a GPU, these tests on the CPU (its one ``.to("cuda", ...)`` made ``.to("cpu", ...)``)."""
    import math as math_module

    import torchvision.transforms as TVT
    import torchvision.transforms.functional as TVTF
    import tqdm
    from torch import Tensor, nn

    space = dict(torch=torch, F=F, math=math_module, nn=nn, Tensor=Tensor, TVT=TVT, TVTF=TVTF, tqdm=tqdm,
                 model=model, class_names=class_names,
                 tokenizer=get_tokenizer(bpe_path_or_url=bpe_vocabulary()).tokenize)  # the notebook's cell 10
    cells = notebook_cells()
    for cell in ("cell 4", "cell 6", "cell 8"):
        exec(cells[cell], space)
    exec(cells["cell 14, text features"].replace('.to("cuda"', '.to("cpu"'), space)
    with torch.no_grad():
        return space["predict_whole"](model, pixels, space["text_feats"])


def test_the_labels_are_the_authors_get_logits_softmaxed(dinotxt):
    """Through the authors' tokenizer too: a label with accents, quotes and markup tokenizes as theirs does."""
    model, _, checkpoint = dinotxt
    image = photo()
    labels = [*LABELS, "un café's “<b>sign</b>”  "]
    answer = vit.ask(checkpoint, image, labels)  # "a photo of a {}."
    pixels = words.model_input(checkpoint, image)  # (1, 3, 224, 224): what both models see
    asked = answer.answer.labels  # as typed, stripped
    tokens = get_tokenizer(bpe_path_or_url=bpe_vocabulary()).tokenize([f"a photo of a {label}." for label in asked])
    with torch.no_grad():
        expected, _ = model.get_logits(pixels, tokens)  # (1, n): exp(logit_scale) * cos, the authors' own
    torch.testing.assert_close(torch.from_numpy(answer.answer.logits), expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(answer.answer.probabilities), expected[0].softmax(-1), rtol=1e-5,
                               atol=1e-6)
    assert list(answer.scores) == [asked[i] for i in expected[0].argsort(descending=True)]


def test_each_labels_map_is_the_authors_predict_whole_on_a_non_square_grid(dinotxt):
    """Through ``vit.ask``'s ImageNet ensemble (the notebook's 80 templates, in its order) at a 32 x 48 input: a 4 x
    6 grid, which the map read column-major would not match."""
    model, _, checkpoint = dinotxt
    image = photo(32, 48)
    size = InputSize(48, keep_aspect=True)
    answer = vit.ask(checkpoint, image, LABELS, template="imagenet", size=size)
    pixels = words.model_input(checkpoint, image, size)
    assert pixels.shape == (1, 3, 32, 48)
    expected = authors_segmentation(model, pixels[0], LABELS)  # (n, 4, 6)
    for index, label in enumerate(LABELS):
        shown = answer.explain(label, "dinotxt")
        assert shown.map.shape == (4, 6)
        torch.testing.assert_close(torch.from_numpy(shown.map), expected[index], rtol=1e-5, atol=1e-5)
        transposed = torch.from_numpy(shown.map).reshape(-1).reshape(6, 4).T  # the tokens read column-major
        assert (transposed - expected[index]).abs().max() > 1e-2


def test_the_map_reads_the_backbones_patch_tokens_not_the_vision_heads_as_the_notebook_does(dinotxt):
    """The notebook's ``encode_image`` takes ``get_class_and_patch_tokens``'s third output, the backbone's normed
    patch tokens (facebookresearch/dinov3#355): its map differs from the vision head's patch tokens' cosine."""
    model, _, checkpoint = dinotxt
    image = photo()
    answer = vit.ask(checkpoint, image, LABELS)
    pixels = words.model_input(checkpoint, image)
    ours = torch.from_numpy(answer.explain(0, "dinotxt").map)
    with torch.no_grad():
        _, head_patches, backbone_patches = model.encode_image_with_patch_tokens(pixels)
    text = answer.answer.prompts.patch[0]
    grid = ours.shape
    torch.testing.assert_close(ours, (F.normalize(backbone_patches[0], dim=-1) @ text).reshape(grid),
                               rtol=1e-5, atol=1e-5)
    assert ((F.normalize(head_patches[0], dim=-1) @ text).reshape(grid) - ours).abs().max() > 1e-2


def test_a_folder_of_the_two_files_and_a_whole_dinotxt_file_open_alike(dinotxt, tmp_path):
    model, head, checkpoint = dinotxt
    whole = vit.load(save_authors_layout(model, tmp_path / "whole", whole=True))
    folder = vit.load(head.parent)
    image = photo()
    expected = vit.ask(checkpoint, image, LABELS).scores
    for other in (whole, folder):
        assert vit.ask(other, image, LABELS).scores == pytest.approx(expected, abs=1e-6)
    assert "dinotxt" in vit.ask_methods(checkpoint)
    assert set(vit.ask_methods(checkpoint)) == {"attnlrp", "dinotxt"}  # the CLIP readouts refused


def test_the_head_without_its_backbone_is_refused_in_one_line(dinotxt, tmp_path):
    model, _, _ = dinotxt
    head = save_authors_layout(model, tmp_path / "alone")
    (head.parent / BACKBONE_FILE).unlink()
    with pytest.raises(SourceError, match="head and text tower; put its one DINOv3 backbone .pth") as e:
        vit.load(head)
    assert "\n" not in str(e.value)


def test_a_head_of_another_backbone_is_refused_in_one_line(dinotxt, tmp_path):
    """A text embedding 192 wide beside a backbone whose CLS and patch mean make 128 channels."""
    model, head, _ = dinotxt
    folder = tmp_path / "mismatched"
    folder.mkdir()
    torch.save(model.visual_model.backbone.state_dict(), folder / BACKBONE_FILE)
    state = torch.load(head, weights_only=True)
    state["text_model.head.linear_projection.weight"] = torch.zeros(3 * WIDTH, TEXT_WIDTH)
    torch.save(state, folder / HEAD_FILE)
    with pytest.raises(SourceError, match="its text embedding has 192 channels where the image's CLS and patch "
                                          "mean have 128") as e:
        vit.load(folder / HEAD_FILE)
    assert "\n" not in str(e.value)


VOCABULARY_WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from peak_memory import peak, start
import vit
from vit.sources.vlm.text_tower import open_text_tower

def opened(head):
    # what opening the text tower beside head grew the process by, and its refusal or None
    checkpoint = vit.load(head)
    before = start()
    try:
        open_text_tower(checkpoint)
        refusal = None
    except ValueError as e:
        refusal = str(e)
    return peak() - before, refusal


opened(sys.argv[1])  # the libraries imported and warmed once
good, _ = opened(sys.argv[1])
bomb, refusal = opened(sys.argv[3])
print(json.dumps({"refusal": refusal, "good": good, "bomb": bomb}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_a_vocabulary_that_inflates_past_its_bound_is_refused_while_it_inflates_in_bounded_memory(dinotxt, tmp_path):
    """Issue 114, finding 5: open_clip's ``SimpleTokenizer`` inflates its ``.gz`` whole (a 0.5 MB one inflated to
    3 GB). A 65 KB one of 64 MiB of zeros here: read whole, it grew a fresh process by 189 MB, 111 MB more than
    opening the same tower beside open_clip's vocabulary (78 MB: the bytes and their text); refused at
    ``MAX_VOCABULARY_BYTES`` (8 MiB) of inflated bytes, by 65 MB, and never 16 MB more."""
    model, good, _ = dinotxt
    head = save_authors_layout(model, tmp_path / "bomb")
    with gzip.open(head.parent / BPE_VOCABULARY, "wb", compresslevel=9) as f:
        for _ in range(64):
            f.write(bytes(2**20))
    assert (head.parent / BPE_VOCABULARY).stat().st_size < 2**17
    done = run_measured(VOCABULARY_WORKER, [str(good), str(Path(__file__).parent), str(head)], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["refusal"] is not None and "\n" not in out["refusal"], out
    assert re.search(r"bpe_simple_vocab_16e6.txt.gz, a 0.1 MB .gz, inflates to more than the 8 MB", out["refusal"])
    assert out["bomb"] < out["good"] + 16 * 2**20, out


def test_the_vocabulary_beside_the_weights_is_the_one_read_and_a_damaged_one_is_one_line(dinotxt, tmp_path):
    """CLIP's vocabulary copied beside the weights scores as open_clip's own copy; cut in half, it is refused in one
    line (so the file beside the weights is the one read, through the bounded reader)."""
    model, _, checkpoint = dinotxt
    head = save_authors_layout(model, tmp_path / "beside")
    vocabulary = Path(bpe_vocabulary()).read_bytes()
    (head.parent / BPE_VOCABULARY).write_bytes(vocabulary)
    image = photo()
    assert vit.ask(vit.load(head), image, LABELS).scores == pytest.approx(vit.ask(checkpoint, image, LABELS).scores,
                                                                          abs=1e-6)
    (head.parent / BPE_VOCABULARY).write_bytes(vocabulary[: len(vocabulary) // 2])
    with pytest.raises(ValueError, match=r"bpe_simple_vocab_16e6.txt.gz is not a whole .gz file") as e:
        open_text_tower(vit.load(head))
    assert "\n" not in str(e.value)


def test_the_dinotxt_map_needs_the_dinotxt_text_side():
    from vit.model import ViT, ViTConfig

    clip = ViT(ViTConfig(image_size=16, patch_size=4, num_classes=0, hidden_size=16, num_layers=1, num_heads=2,
                         mlp_size=32, projection_dim=8))
    assert "dinotxt" not in prompts.methods_for(clip)
    with pytest.raises(prompts.PromptError, match="needs a DINOv3 with its dino.txt head"):
        prompts.dinotxt_maps(clip, torch.zeros(1, 3, 16, 16), torch.zeros(2, 16))


@pytest.mark.slow
def test_the_explorers_ask_in_words_scores_and_maps_each_label(dinotxt, dirs):  # noqa: F811 (test_app's fixture)
    """The explorer opens the head and text file and its Ask in words box shows ``vit.ask``'s probabilities (the
    authors', above) and the dino.txt map of a label; AttnLRP is the other map a dino.txt's labels have."""
    model, head, checkpoint = dinotxt
    image = png_bytes(48, 32, seed=4)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(head))
    at.run()
    upload(at, "photo.png", image)
    assert "Ask in words" in [h.value for h in at.main.subheader]
    [area] = [w for w in at.main.text_area if w.label == "Labels"]
    area.set_value(", ".join(LABELS))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [bars] = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    expected = vit.ask(checkpoint, Image.open(io.BytesIO(image)), LABELS).scores
    assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(expected, abs=1e-5)
    [method] = [w for w in at.main.selectbox if w.label == "Method"]
    assert method.options == ["AttnLRP", "dino.txt patch-text map"]
    method.set_value("dinotxt")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(c.value.startswith("**dino.txt patch-text map for “a dog”**") for c in at.main.caption)
