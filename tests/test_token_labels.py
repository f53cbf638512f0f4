"""Prefix tokens are named in the query picker, the matrix caption and the map captions: CLS, DIST, REG 1…R."""

from vit.app import drawing
from vit.explain.views.map_captions import token_label
from vit.model import ViTConfig

SIZES = dict(image_size=16, patch_size=4, num_classes=3, hidden_size=8, num_layers=1, num_heads=2, mlp_size=16)


def test_configs_name_their_prefix_tokens_in_token_order():
    assert ViTConfig(**SIZES).prefix_token_names == ("CLS",)
    assert ViTConfig(**SIZES, distillation_token=True).prefix_token_names == ("CLS", "DIST")
    assert ViTConfig(**SIZES, num_register_tokens=2).prefix_token_names == ("CLS", "REG 1", "REG 2")


def test_token_labels_use_the_prefix_names_then_count_patches_after_them():
    grid, names = (4, 4), ("CLS", "REG 1", "REG 2")
    assert [token_label(t, grid, 3, names) for t in range(4)] == ["CLS", "REG 1", "REG 2",
                                                                          "patch row 1, col 1"]
    assert drawing.token_option(18, grid, 3, names) == "18 · patch row 4, col 4"
    assert token_label(1, grid, 2) == "prefix token 1"  # unnamed: still distinct from patches


def test_the_matrix_caption_lists_every_prefix_token_and_the_patch_range():
    text = drawing.tokens_caption((2, 3), 2, ("CLS", "DIST"))
    assert text == "token 0 is CLS, 1 is DIST; tokens 2–7 the patches row by row"
