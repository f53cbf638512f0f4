"""A model without a CLS token explains what its classifier reads (issue 116, item 1): rollout and the class map of a
mean-pooling classifier start from the mean of the patch tokens' rows, as Abnar & Zuidema's rollout and Chefer et
al.'s gradient rollout read a pooled head, not from token 0 (a register, or the top-left patch); one token's
attention defaults to the centre patch; each caption says which. References: the library's own model (timm's
register + average-pool ViT on the port road, transformers' I-JEPA classifier on the library road), its attention
probabilities and their gradients taken by autograd, the rules applied by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vit

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

from test_app import dirs  # noqa: E402,F401 (a fixture: the app's folders, for the page's test)

GRID = (4, 6)  # a non-square grid: 32 x 48 px inputs of 8 px patches


def photo() -> Image.Image:
    rng = np.random.default_rng(7)
    return Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8))


def chefer_from_pooled_readout(attentions, gradients, prefix: int) -> torch.Tensor:
    """Chefer et al. 2021b by hand: ``Ā = mean_heads(clamp(grad * attn, 0))``, ``R = I`` then ``R = R + Ā R`` layer by
    layer; the pooled readout's row is the mean of the patch tokens' rows of ``R``; its patch columns, ``GRID``."""
    T = attentions[0].shape[-1]
    R = torch.eye(T, dtype=torch.float64)
    for a, g in zip(attentions, gradients, strict=True):
        R = R + (g * a).clamp(min=0).mean(dim=1)[0].double() @ R
    return R[prefix:].mean(dim=0)[prefix:].reshape(GRID)


def rollout_from_pooled_readout(attentions, prefix: int) -> torch.Tensor:
    """Abnar & Zuidema's rollout by hand: ``Â = (mean_heads(A) + I) / rowsum``, ``R = Â_L ... Â_1``; the mean of the
    patch tokens' rows of ``R``, its patch columns."""
    T = attentions[0].shape[-1]
    R = torch.eye(T, dtype=torch.float64)
    for a in attentions:
        f = a[0].double().mean(dim=0) + torch.eye(T, dtype=torch.float64)
        R = (f / f.sum(dim=-1, keepdim=True)) @ R
    return R[prefix:].mean(dim=0)[prefix:].reshape(GRID)


@pytest.fixture(scope="module")
def register_gap(tmp_path_factory):
    """timm's ViT with two registers, no CLS token and average pooling, saved natively: ``(folder, model)``."""
    from timm.models import _hub

    args = dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=3, num_heads=4, num_classes=3,
                class_token=False, reg_tokens=2, global_pool="avg", no_embed_class=True)
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, **args).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    folder = tmp_path_factory.mktemp("register_gap")
    _hub.save_for_hf(model, folder, model_args=args)
    return folder, model


def timm_attentions_and_gradients(model, x: torch.Tensor, class_index: int):
    """timm's own forward on its explicit path, each block's softmax output kept with its gradient of the class
    score (a hook on ``attn_drop``, which its explicit path applies to the probabilities)."""
    kept, hooks = [], []

    def keep(module, inputs, out) -> None:
        out.retain_grad()
        kept.append(out)

    for block in model.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(keep))
    try:
        logits = model(x)
        logits[0, class_index].backward()
    finally:
        for hook in hooks:
            hook.remove()
    return logits.detach(), [a.detach() for a in kept], [a.grad for a in kept]


def test_a_register_gap_vits_class_map_is_chefers_rule_from_its_pooled_readout(register_gap):
    folder, model = register_gap
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.road == "port" and checkpoint.model.num_prefix_tokens == 2
    from vit.core.inference import preprocess

    x = preprocess([photo()], checkpoint.preprocessing)
    logits, attentions, gradients = timm_attentions_and_gradients(model, x, class_index=1)
    explained = vit.explain(checkpoint, photo(), "class", target=1)
    np.testing.assert_allclose(explained.map, chefer_from_pooled_readout(attentions, gradients, 2).numpy(),
                               rtol=1e-4, atol=1e-6)
    assert explained.query is None and "the mean of the patch tokens (what the classifier reads" in \
        explained.description
    rolled = vit.explain(checkpoint, photo(), "rollout")
    np.testing.assert_allclose(rolled.map, rollout_from_pooled_readout(attentions, 2).numpy(), rtol=1e-4, atol=1e-6)
    assert rolled.query is None and "the mean of the patch tokens" in rolled.description
    one = vit.explain(checkpoint, photo(), "attention")  # one token's attention: the centre patch, not a register
    assert one.query == 2 + 2 * 6 + 3 and "patch row 3, col 4" in one.description
    expected = attentions[-1][0, :, one.query, 2:].mean(0).reshape(GRID)
    np.testing.assert_allclose(one.map, expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def ijepa(tmp_path_factory):
    """transformers' I-JEPA classifier (its head reads the mean of its tokens; no CLS), saved natively."""
    torch.manual_seed(0)
    config = transformers.IJepaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                      intermediate_size=64, patch_size=8, image_size=[32, 48], num_labels=3,
                                      id2label={0: "cat", 1: "dog", 2: "fox"})
    model = transformers.IJepaForImageClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    folder = tmp_path_factory.mktemp("ijepa")
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 48}).save_pretrained(folder)
    return folder


def test_ijepas_class_map_and_rollout_start_from_its_pooled_readout(ijepa):
    from vit.core.inference import preprocess

    checkpoint = vit.load(ijepa, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == 0
    library = transformers.IJepaForImageClassification.from_pretrained(ijepa, attn_implementation="eager").eval()
    x = preprocess([photo()], checkpoint.preprocessing)
    out = library(pixel_values=x, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.logits[0, 2].backward()
    attentions = [a.detach() for a in out.attentions]
    explained = vit.explain(checkpoint, photo(), "class", target=2)
    np.testing.assert_allclose(explained.map, chefer_from_pooled_readout(attentions, [a.grad for a in out.attentions],
                                                                         0).numpy(), rtol=1e-4, atol=1e-6)
    assert explained.query is None and "the mean of the patch tokens (what the classifier reads)" in \
        explained.description
    rolled = vit.explain(checkpoint, photo(), "rollout")
    np.testing.assert_allclose(rolled.map, rollout_from_pooled_readout(attentions, 0).numpy(), rtol=1e-4, atol=1e-6)
    assert rolled.query is None and "the mean of the patch tokens" in rolled.description
    one = vit.explain(checkpoint, photo(), "attention")  # the centre patch, not the top-left one
    assert one.query == 2 * 6 + 3
    np.testing.assert_allclose(one.map, attentions[-1][0, :, one.query].mean(0).reshape(GRID).numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.slow
@pytest.mark.usefixtures("dirs")
def test_the_pages_rollout_of_a_register_gap_vit_starts_from_its_pooled_readout(register_gap):
    """The explorer's query picker opens rollout and the class map of a mean-pooling model without CLS on the pooled
    readout (not the first register), and their captions name it; the attention map opens on the centre patch."""
    from test_app import sidebar_widget
    from test_app_families import open_by_path

    from app_pages.explorer_sections.map_settings import READOUT, READOUT_OPTION

    at = open_by_path(register_gap[0])
    query = sidebar_widget(at, "selectbox", "Query token")
    assert query.value == 2 + 2 * 6 + 3  # the centre patch (row 3, col 4 of 4 x 6)
    sidebar_widget(at, "radio", "Map").set_value("rollout")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    query = sidebar_widget(at, "selectbox", "Query token")
    assert query.value == READOUT and query.options[0] == READOUT_OPTION
    texts = [e.value for e in (*at.main.caption, *at.main.markdown) if isinstance(e.value, str)]
    assert any("how much of the mean of the patch tokens (what the classifier reads" in t for t in texts), texts
    sidebar_widget(at, "radio", "Map").set_value("class")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert sidebar_widget(at, "selectbox", "Query token (for the class map)").value == READOUT
    texts = [e.value for e in (*at.main.caption, *at.main.markdown) if isinstance(e.value, str)]
    assert any("as read by the mean of the patch tokens (what the classifier reads" in t for t in texts), texts


def test_the_class_map_formed_in_chunks_starts_from_the_same_pooled_readout(register_gap, monkeypatch):
    """Past the memory bound the class map's row is formed in chunks (``LayerInputs.gradient_rollout_row``): from the
    pooled readout too, equal to Chefer's rule by hand."""
    from vit.core.inference import preprocess
    from vit.costs import plan
    from vit.explain.methods.chunked import LayerInputs

    folder, model = register_gap
    checkpoint = vit.load(folder, device="cpu")
    x = preprocess([photo()], checkpoint.preprocessing)
    _, attentions, gradients = timm_attentions_and_gradients(model, x, class_index=0)
    decide, class_map = plan.decide, plan.class_map
    monkeypatch.setattr(plan, "class_map", lambda *a: ("chunked", class_map(*a)))
    monkeypatch.setattr(plan, "decide", lambda p: "chunks" if isinstance(p, tuple) else decide(p))
    rows, chunked = [], LayerInputs.gradient_rollout_row
    monkeypatch.setattr(LayerInputs, "gradient_rollout_row", lambda self, *a, **k: rows.append(k) or chunked(self, *a,
                                                                                                             **k))
    explained = vit.explain(checkpoint, photo(), "class", target=0)
    assert len(rows) == 1 and rows[0]["row"] is not None  # the path in chunks, from a row of weights
    np.testing.assert_allclose(explained.map, chefer_from_pooled_readout(attentions, gradients, 2).numpy(),
                               rtol=1e-4, atol=1e-6)
