"""``max_patches`` read as what the processor holding it counts (issue 113): tiles where it cuts the image into tiles
(GOT-OCR2's, InternVL's, Cohere 2 Vision's ``crop_to_patches`` and ``min_patches`` beside it; Llama 4's image
processor, which states no patch), the tower's patches where it states a ``patch_size`` and cuts no tiles
(Pix2Struct's and Kosmos-2.5's flattened patches, Kimi K2.5's NaViT resize, as transformers' image processors use it:
``Kosmos2_5ImageProcessor.extract_flattened_patches``, ``kimi_k25``'s ``navit_resize``), bounded at
``declared.MAX_MERGED_TOKENS`` image tokens. Read from the folder's small files alone, nothing built."""

import json

import pytest

from vit.sources.vlm import declared


def problem(tmp_path, settings: dict) -> str | None:
    (tmp_path / "processor_config.json").write_text(json.dumps(settings))
    return declared.files_problem(tmp_path, {"model_type": "kosmos-2.5"})


@pytest.mark.parametrize("settings", [
    {"image_processor": {"patch_size": {"height": 16, "width": 16}, "max_patches": 4096}},  # Kosmos-2.5's default
    {"image_processor": {"patch_size": {"height": 16, "width": 16}, "max_patches": 2048}},  # Pix2Struct's
    {"image_processor": {"patch_size": 14, "merge_size": 2, "max_patches": 16384},  # Kimi K2.5's defaults
     "video_processor": {"patch_size": 14, "merge_size": 2, "max_patches": 4096}}])
def test_a_count_of_the_towers_patches_is_not_read_as_tiles(tmp_path, settings):
    assert problem(tmp_path, settings) is None


@pytest.mark.parametrize("settings", [
    {"image_processor": {"crop_to_patches": True, "min_patches": 1, "max_patches": 4096, "patch_size": 16}},
    {"image_processor": {"max_patches": 4096}, "patch_size": 14}])  # Llama 4's: the processor's patch, not its own
def test_a_count_of_tiles_is_refused_past_the_tiles_read(tmp_path, settings):
    assert problem(tmp_path, settings) == ("its processor_config.json sets image_processor.max_patches = 4,096: an "
                                           "image cut into that many tiles; at most 64 are read")


def test_a_count_of_patches_past_an_images_most_is_refused(tmp_path):
    most = declared.MAX_MERGED_TOKENS * 4
    assert problem(tmp_path, {"image_processor": {"patch_size": 14, "merge_size": 2, "max_patches": most}}) is None
    assert problem(tmp_path, {"image_processor": {"patch_size": 14, "merge_size": 2, "max_patches": most + 1}}) == (
        f"its processor_config.json sets image_processor.max_patches = {most + 1:,} patches of the tower an image is "
        f"resized to; at most {most:,} are read ({declared.MAX_MERGED_TOKENS:,} image tokens)")
