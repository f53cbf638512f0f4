"""One traced forward on the meta device serves both passes of a library-road opening
(``transformers_models.one_open``): ``vit.load`` of a folder builds it on the meta device, then for real, and
the real pass reads the query batches the meta pass's layout trace noted instead of tracing the same model again. The
forwards are counted by a hook on the model's own class; a module in hand (no meta pass) still traces its own."""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules.module import register_module_forward_pre_hook

import vit
from vit.sources.files import SourceError
from vit.sources.library_road import transformers_models as tm

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8,
             image_size=32)


def tiny():
    torch.manual_seed(0)
    return transformers.IJepaModel(transformers.IJepaConfig(**SMALL))


def meta_forwards(load) -> int:
    """How many whole-model forwards of the IJepaModel ``load()`` runs with its weights on the meta device."""
    count = 0

    def hook(module, args):
        nonlocal count
        if isinstance(module, transformers.IJepaModel) and next(module.parameters()).is_meta:
            count += 1

    handle = register_module_forward_pre_hook(hook)
    try:
        load()
    finally:
        handle.remove()
    return count


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ijepa")
    tiny().save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def test_a_folders_opening_traces_its_model_on_the_meta_device_once(folder):
    opened = []
    assert meta_forwards(lambda: opened.append(vit.load(folder, device="cpu"))) == 1  # two before: one a pass
    layout = opened[0].model.layout
    assert opened[0].road == "library" and layout.grid == (4, 4) and opened[0].model.num_layers == 2


def test_an_opening_on_the_meta_device_is_its_meta_pass_alone(folder):
    """The catalog's check (``map_location="meta"``): the meta pass is the opening asked for, not built twice."""
    from vit.sources.open import open_source

    opened = []
    assert meta_forwards(lambda: opened.append(open_source(folder, map_location="meta", library_road=True))) == 1
    assert opened[0].road == "library" and next(opened[0].model.parameters()).is_meta


def test_a_module_in_hand_has_no_meta_pass_and_traces_its_own():
    model = tiny()
    assert meta_forwards(lambda: vit.load(model, mean=(0.5,) * 3, std=(0.5,) * 3)) == 1


def test_notes_live_only_inside_one_opening():
    tm.note_traced("key", [(0, 1)])  # outside an opening: kept nowhere
    assert tm.noted_traced("key") is None
    with tm.one_open():
        assert tm.noted_traced("key") is None
        tm.note_traced("key", [(0, 1), (1, 3)])
        assert tm.noted_traced("key") == [(0, 1), (1, 3)] and tm.noted_traced("other") is None
    assert tm.noted_traced("key") is None


def test_a_refusal_read_from_the_meta_pass_is_the_one_its_own_trace_gives():
    """Depth Pro's patch encoder attends over its crops in one batch: the real pass refuses it from the meta pass's
    notes (no forward of its own) in the words its own trace gives alone."""
    from pathlib import Path

    from test_depth_pro import tiny as depth_pro

    processor = {"size": {"height": 64, "width": 64}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}

    def refusal(meta: bool) -> str:
        model = depth_pro().to("meta") if meta else depth_pro()
        with pytest.raises(SourceError) as refused:
            tm.library_checkpoint(model, processor, Path("folder"), "origin", meta)
        return str(refused.value)

    alone = refusal(False)
    assert "attends over 35 pieces of one image at once" in alone  # 5x5 + 3x3 + 1 crops of its three scales
    with tm.one_open():
        tm.library_checkpoint(depth_pro().to("meta"), processor, Path("folder"), "origin", True)  # the meta pass
        traced = []
        handle = register_module_forward_pre_hook(lambda module, args: traced.append(module))
        try:
            assert refusal(False) == alone
        finally:
            handle.remove()
        assert not [m for m in traced if isinstance(m, transformers.DepthProForDepthEstimation)]
