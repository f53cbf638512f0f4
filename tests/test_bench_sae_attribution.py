"""``bench/bench_sae_attribution.py``'s deletion does what it says: zeroing latents at the SAE's layer gives the logits
of the model run by hand on ``decode(f with them zeroed) + (x - decode(f))`` (the figures themselves are measured in
bench/, not here)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from vit.features.autoencoder import SAEInfo, SparseAutoencoder, model_fingerprint
from vit.model import ViT, ViTConfig

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_sae_attribution.py"
LAYER = 2  # the SAE reads block 2's output of 3


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sae_attribution", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_and_sae():
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=5, hidden_size=16, num_layers=3, num_heads=2,
                          mlp_size=32, num_register_tokens=1)).eval()
    sae = SparseAutoencoder(16, 48, 6, info=SAEInfo(hook_name=f"blocks.{LAYER - 1}.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
        sae.b_dec.normal_(0, 0.1)
    return model, sae.eval().requires_grad_(False)


def by_hand_stream(model, image):
    """Block LAYER's output ``(T, D)`` by hand: the embedding and the first LAYER blocks."""
    with torch.no_grad():
        h = model.embed(image)
        for block in model.blocks[:LAYER]:
            h = block(h, rope=None)[0]
        return h[0]


def by_hand(model, image, edit=None):
    """The model's logits by hand, block by block, with ``edit`` applied to block LAYER's output ``(T, D)``."""
    with torch.no_grad():
        h = by_hand_stream(model, image)
        h = (h if edit is None else edit(h))[None]
        for block in model.blocks[LAYER:]:
            h = block(h, rope=None)[0]
        return model.head(model.norm(h)[:, 0])[0]  # (classes,): the CLS token's, as the config pools


def test_deleting_latents_gives_the_models_output_on_the_edited_reconstruction_plus_error(bench):
    model, sae = model_and_sae()
    image = torch.randn(1, 3, 8, 8)
    clean = by_hand(model, image)
    torch.testing.assert_close(clean, model(image)[0][0], rtol=0, atol=1e-6)  # the hand-run model is the model
    z = sae.encode(by_hand_stream(model, image))  # (T, 48)
    deleted = z.sum(dim=0).topk(3).indices.tolist()  # three latents active on this image

    def edit(x):
        f = sae.encode(x)
        kept = f.clone()
        kept[:, deleted] = 0  # at every token
        return kept @ sae.W_dec + sae.b_dec + (x - (f @ sae.W_dec + sae.b_dec))

    expected = by_hand(model, image, edit)
    got = bench.deleted_logits(model, sae, image, deleted)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (got - clean).abs().max() > 1e-3  # the deletion moved the logits
    torch.testing.assert_close(bench.deleted_logits(model, sae, image, []), clean, rtol=0, atol=1e-5)  # error kept


def test_a_row_deletes_the_top_attributed_latents_and_random_ones_among_the_active(bench):
    model, sae = model_and_sae()
    image = torch.randn(1, 3, 8, 8)
    rows, splice_error, sum_error = bench.image_rows(model, sae, image, "x.png", [1, 2], draws=3,
                                                     generator=torch.Generator().manual_seed(0))
    from vit.features.attribution import feature_attribution

    result = feature_attribution(model, sae, image)
    clean = by_hand(model, image)
    for row, k in zip(rows, [1, 2], strict=True):
        top = [latent for latent, _ in result.top(k)]
        assert row["k"] == k and row["deleted"] == len(top) > 0 and row["target"] == result.target
        after = bench.deleted_logits(model, sae, image, top)
        assert row["drop_top"] == pytest.approx(float(clean[result.target] - after[result.target]), abs=1e-5)
    active = (sae.encode(by_hand_stream(model, image)) > 0).any(dim=0).nonzero()[:, 0]
    drawn = bench.random_latents(active, 4, torch.Generator().manual_seed(1))
    assert len(set(drawn)) == 4 and set(drawn) <= set(active.tolist())
    assert splice_error < 1e-5 and sum_error < 1e-5
