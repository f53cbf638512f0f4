"""What ``vlm_read_layout`` reads of a model's parts, on modules built by hand (fast: no transformers model): the pixels
one step of a tower of towers' tokens spans (its first tower's patch embedding times the strides of the
convolutions after it, checked against torch's own output grid), and a tower's learned queries, named."""

from types import SimpleNamespace

import torch
from torch import nn

from vit.explain.language.vlm_read_layout import CANVASES, token_stride, tower_queries


class _Part(nn.Module):
    def __init__(self, config, **children):
        super().__init__()
        self.config = config
        for name, child in children.items():
            self.add_module(name, child)


def _opened(tower: nn.Module, vision) -> SimpleNamespace:
    """An opened VLM as the layouts read it: its model, whose config's vision_config built ``tower``."""
    model = _Part(SimpleNamespace(vision_config=vision), vision_tower=tower)
    return SimpleNamespace(model=model)


def sam_like() -> nn.Sequential:
    """A SAM-like first tower: 16-px patches, a neck of stride 1, two stride-2 downsampling convolutions."""
    return nn.Sequential(nn.Conv2d(3, 8, 16, 16), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1),
                         nn.Conv2d(8, 8, 3, 2, 1), nn.Conv2d(8, 8, 3, 2, 1))


def test_a_tower_of_towers_steps_its_patch_times_its_downsampling_strides():
    vision = SimpleNamespace()
    first = sam_like()
    vlm = _opened(_Part(vision, sam=first, encoder=nn.Linear(8, 8)), vision)
    assert token_stride(vlm) == 64
    with torch.no_grad():
        grid = first(torch.zeros(1, 3, 1024, 640)).shape[-2:]  # torch's own output grid
    assert tuple(grid) == (1024 // 64, 640 // 64)


def test_a_first_convolution_that_is_no_patch_embedding_gives_no_stride():
    vision = SimpleNamespace()
    vlm = _opened(_Part(vision, stem=nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3))), vision)
    assert token_stride(vlm) is None


def test_a_towers_learned_queries_are_named_with_their_counts():
    vision = SimpleNamespace()
    tower = _Part(vision, sam=sam_like(), query_768_resolution=nn.Embedding(144, 8),
                  query_1024_resolution=nn.Embedding(256, 8))
    assert tower_queries(_opened(tower, vision)) == (
        "its vision tower's learned queries over the patches (query_768_resolution: 144, query_1024_resolution: 256)")
    assert tower_queries(_opened(_Part(vision, sam=sam_like()), vision)) is None


def test_the_canvases_are_keyed_by_what_each_layout_reads():
    assert list(CANVASES) == ["vision_input_type", "image_grid_pinpoints", "view_separator"]


def test_the_merge_unit_and_leading_tokens_are_the_first_whole_ones_that_give_the_count():
    """Fast: the one search every reading of the counts shares (``_unit_and_lead``): the declared unit alone, else
    1, 2, ... to 16, each dividing every grid; a leading token per image only where ``leads`` allows it."""
    from vit.explain.language.vlm_read_layout import _unit_and_lead

    assert _unit_and_lead(0, [(4, 6)], 6) == (2, 0)  # 2x3 units of 2x2 patches
    assert _unit_and_lead(0, [(4, 6), (4, 6)], 14) == (2, 1)  # a leading token before each image's 6
    assert _unit_and_lead(0, [(4, 6)] * 2, 14, leads=(0,)) is None
    assert _unit_and_lead(2, [(4, 6)], 24) is None  # the declared unit alone: 24 tokens are units of 1
    assert _unit_and_lead(0, [(4, 6)], 24) == (1, 0)
    assert _unit_and_lead(0, [(4, 6), (3, 3)], 8) is None  # no unit but 1 divides both: 24 + 9 tokens
