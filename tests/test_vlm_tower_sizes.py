"""What a vision-language model's tower is said to be shown (issue 76, item 2): Qwen2.5-VL and Qwen3-VL size each
image themselves (``smart_resize``), so ``vit.load``'s checkpoint and the sidebar's description say so, with the
processor's pixel bounds, instead of the nominal side the config is built at (1,036 px, 74 x 74 patches, which no
image is shown at); and ``metadata["tower"]`` says where every VLM's tower ends, Qwen's too (it raised KeyError)."""

import pytest
import torch

from vit.app import catalog

transformers = pytest.importorskip("transformers")
from test_visual_lens import _build, noisy  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: (folder, processor)}``: tiny Qwen2.5-VL (14-px patches, 3,136 to 31,360 pixels), Qwen3-VL (16-px
    patches, 4,096 to 65,536 pixels) and LLaVA (32 px) folders as ``save_pretrained`` writes them."""
    built = {}
    for kind in ("qwen2_5_vl", "qwen3_vl", "llava"):
        torch.manual_seed(0)
        model, processor = _build(kind)
        folder = tmp_path_factory.mktemp(kind)
        noisy(model).save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        built[kind] = folder, processor
    return built


def _described(folder) -> str:
    return catalog.describe(catalog.candidate_for(folder, [])).description


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_a_qwen_tower_is_said_to_see_each_image_at_its_own_size_within_its_processors_bounds(folders, kind):
    folder, processor = folders[kind]
    checkpoint = vit.load(folder, device="cpu")
    nominal = checkpoint.preprocessing.image_hw[0]  # the config's 1,036 / Qwen3's table side: never an input
    unit = processor.patch_size * processor.merge_size
    low, high = processor.size["shortest_edge"], processor.size["longest_edge"]  # transformers 5's min / max pixels
    rule = f"smart_resize, {low:,} to {high:,} pixels in whole {unit}-px units"
    assert f"each image at its own size ({rule}) in patches of {processor.patch_size}" in repr(checkpoint)
    assert f"{nominal} px" not in repr(checkpoint)
    described = _described(folder)
    assert f"each image at its own size ({rule}), in {processor.patch_size}-px patches" in described
    assert f"{nominal}×{nominal}" not in described and f"{nominal:,}" not in described


def test_a_fixed_size_tower_is_still_said_to_see_its_size(folders):
    folder, _ = folders["llava"]
    assert "32 px in patches of 8" in repr(vit.load(folder, device="cpu"))
    assert "colour input of 32×32 px in 4 rows × 4 columns of 8-px patches" in _described(folder)


@pytest.mark.parametrize(("kind", "says"), [
    ("qwen2_5_vl", ["Qwen2.5-VL reads this tower after all its 2 layers", "through its patch merger",
                    "each 2×2 merge unit", "ViT.project"]),
    ("qwen3_vl", ["Qwen3-VL reads this tower after all its 2 layers", "through its patch merger",
                  "the output of its layer 1 (deepstack_visual_indexes [0]) through its DeepStack merger"]),
    ("llava", ["LLaVA reads this CLIP tower"]),
])
def test_every_vlm_towers_metadata_says_where_it_ends_and_the_sidebar_shows_it(folders, kind, says):
    folder, _ = folders[kind]
    note = vit.load(folder, device="cpu").metadata["tower"]  # the README's notebook example reads it
    assert all(part in note for part in says), note
    assert note in _described(folder).replace("\\", "")  # the description escapes Markdown
