"""One numbering per surface (issue 116, item 5): the API counts layers and heads from 0 (``vit.explain``'s
arguments, ``vit.ablate``'s pairs, ``vit.sinks(...).rows()``: test_sink_diagnostics); a caption counts them from 1,
as the explorer's sidebar, and an export beside it says which it uses. Each surface is read against the API's
own numbers: the map the caption names is the map of the arguments given."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

import vit

transformers = pytest.importorskip("transformers")


def picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def settings_table(html: str) -> dict[str, str]:
    return dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", html.split("id='settings'")[1]))


@pytest.fixture(scope="module")
def library_checkpoint(tmp_path_factory):
    from test_library_path import save_family

    return vit.load(save_family(tmp_path_factory.mktemp("vit_msn"), "vit_msn"), device="cpu")


@pytest.fixture(scope="module")
def port_checkpoint(tmp_path_factory):
    from vit.checkpoint import save_checkpoint
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_layers=3, num_heads=4, mlp_size=64,
                       num_classes=2)
    path = tmp_path_factory.mktemp("port") / "m.pt"
    save_checkpoint(path, ViT(config).eval(), ["cat", "dog"])
    return vit.load(path, device="cpu")


@pytest.mark.parametrize("road", ["library", "port"])
def test_a_captions_layer_and_head_count_from_1_and_its_export_says_so(road, library_checkpoint, port_checkpoint):
    checkpoint = library_checkpoint if road == "library" else port_checkpoint
    explained = vit.explain(checkpoint, picture(), "attention", layer=1, head=2, query=0)
    every = vit.explain(checkpoint, picture(), "attention", layer=1, query=0)
    np.testing.assert_array_equal(explained.map, every.heads[2])  # head=2 from 0: the API's third head
    assert re.search(r"Layer 2\b.*\bhead 3\b", explained.description), explained.description
    table = settings_table(explained.html())
    assert table["layer (from 1)"] == "2" and table["head (from 1)"] == "3", table
    assert "layer" not in table and "head" not in table
