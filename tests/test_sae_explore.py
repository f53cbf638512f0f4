"""The explorer's Features view: the latents on the patch grid, the features at a token, and the intervention
that scales a latent at the SAE's layer and runs the rest of the model's forward on the edited stream."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vit.checkpoint import Preprocessing
from vit.features import explore
from vit.features.autoencoder import SAEError, SAEInfo, SparseAutoencoder, model_fingerprint
from vit.features.autoencoder_training import HeldOut
from vit.features.explore import FeatureTable, browse_order, edited_copy, exemplar_crop, image_features, intervene
from vit.model import ViT, ViTConfig


def by_hook(model, sae, images, scales):
    return intervene(model, sae, images, scales)


def by_copy(model, sae, images, scales):
    with torch.no_grad():
        return edited_copy(model, sae, scales).encode(images, output_attentions=True)


EDITS = pytest.mark.parametrize("edit", [by_hook, by_copy], ids=["run_with_hooks", "edited_copy"])


def model_and_sae(seed=0):
    torch.manual_seed(seed)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=3, hidden_size=16, num_layers=3, num_heads=2,
                          mlp_size=32, num_register_tokens=1)).eval()
    sae = SparseAutoencoder(16, 48, 6, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
        sae.b_dec.normal_(0, 0.1)
    return model, sae.eval()


def hand_stream(model, images):
    """Block 2's output, the SAE's hook point, by hand: the embedding and the first two blocks."""
    x = model.embed(images)
    for block in model.blocks[:2]:
        x = block(x, rope=None)[0]
    return x


def test_latents_are_the_sae_encoding_of_the_layer_output_on_a_non_square_grid():
    model, sae = model_and_sae()
    image = torch.randn(1, 3, 8, 12)  # a 2 x 3 grid after CLS and one register
    with torch.no_grad():
        x = hand_stream(model, image)
        expected = sae.encode(x[0])  # (2 + 6, 48)
    features = image_features(model, sae, image)
    torch.testing.assert_close(features.latents, expected)
    latent, value = features.strongest(1)[0]
    assert value == pytest.approx(float(expected[2:, latent].max()))
    torch.testing.assert_close(features.patch_map(latent), expected[2:, latent].reshape(2, 3))
    np.testing.assert_array_equal(features.patch_maps([latent, 0]),
                                  torch.stack([expected[2:, latent], expected[2:, 0]]).reshape(2, 2, 3).numpy())
    at = features.active_at(5)
    assert [i for i, _ in at] == expected[5].topk(len(at)).indices.tolist() and len(at) <= 6


@EDITS
def test_no_change_gives_back_the_model_exactly(edit):
    model, sae = model_and_sae()
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        logits, attentions = model(images, output_attentions=True)
    edited = edit(model, sae, images, {})
    torch.testing.assert_close(edited.logits, logits, rtol=0, atol=1e-5)
    scaled_by_one = edit(model, sae, images, {3: 1.0, 7: 1.0})
    torch.testing.assert_close(scaled_by_one.logits, logits, rtol=0, atol=1e-5)
    for a, b in zip(scaled_by_one.attentions, attentions, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@EDITS
def test_zeroing_a_feature_removes_its_decoder_direction_from_the_stream(edit):
    model, sae = model_and_sae()
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        x = hand_stream(model, images)
        z = sae.encode(x)
        latent = int(z.sum(dim=(0, 1)).argmax())
        edited_stream = x - z[..., latent:latent + 1] * sae.W_dec[latent]  # by hand: the latent's share taken out
        after, attentions = model.run_blocks(edited_stream, (2, 2), 2, output_attentions=True)
        expected = model.classify(after)
        _, clean_attentions = model(images, output_attentions=True)
    edited = edit(model, sae, images, {latent: 0.0})
    torch.testing.assert_close(edited.logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(edited.attentions[2], attentions[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(edited.attentions[1], clean_attentions[1])  # layers up to the SAE's are untouched
    assert not torch.allclose(edited.logits, model(images)[0])


def test_an_sae_of_another_model_or_a_bad_feature_is_refused():
    model, sae = model_and_sae()
    other, _ = model_and_sae(seed=1)
    with pytest.raises(SAEError, match="another model"):
        intervene(other, sae, torch.randn(1, 3, 8, 8), {0: 0.0})
    with pytest.raises(ValueError, match="out of range"):
        intervene(model, sae, torch.randn(1, 3, 8, 8), {48: 0.0})


def test_scaling_a_feature_adds_its_decoder_direction_times_the_change():
    model, sae = model_and_sae()
    images = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        x = hand_stream(model, images)
        z = sae.encode(x)
        latent = int(z.sum(dim=(0, 1)).argmax())
        expected = model.classify(model.run_blocks(x + 2.0 * z[..., latent:latent + 1] * sae.W_dec[latent], (2, 2),
                                                   2)[0])  # scale 3: twice the latent's share added
    torch.testing.assert_close(intervene(model, sae, images, {latent: 3.0}).logits, expected, rtol=0, atol=1e-5)


def test_an_edited_copy_leaves_the_model_alone_and_shares_its_weights():
    model, sae = model_and_sae()
    images = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        clean = model(images)[0]
        copy = edited_copy(model, sae, {0: 0.0, 5: 0.0})
        assert copy.blocks[0].attn.qkv.weight is model.blocks[0].attn.qkv.weight
        assert "blocks.1.hook_resid_post" in copy.hook_points()  # still a hook point: caches and hooks reach it
        assert model_fingerprint(copy) == model_fingerprint(model)  # the SAE is no part of its weights
        copy(images)
        torch.testing.assert_close(model(images)[0], clean, rtol=0, atol=0)


def test_features_npz_of_the_held_out_pass_reads_back(tmp_path):
    _, sae = model_and_sae()
    held = HeldOut(sae, exemplars=4)
    tokens = torch.randn(3, 5, 16)  # 3 images of 5 tokens
    held.add(tokens)
    (tmp_path / "features.npz").write_bytes(held.features(["cat/a.png", "dog/b.png", "c.png"]))
    table = explore.read_features(tmp_path / "features.npz", 48)
    z = sae.encode(tokens.reshape(15, 16))  # (image * 5 + token, latent)
    latent = int((z > 0).sum(dim=0).argmax())
    values, rows = z[:, latent].topk(4)
    fired = values > 0
    assert table.exemplars(latent) == [(["cat/a.png", "dog/b.png", "c.png"][r // 5], r % 5, pytest.approx(float(v)))
                                       for r, v in zip(rows[fired].tolist(), values[fired].tolist(), strict=True)]
    first = {}
    for r, v in zip(rows[fired].tolist(), values[fired].tolist(), strict=True):
        first.setdefault(r // 5, (r % 5, v))  # each image at its strongest token
    assert table.exemplars(latent, distinct=True) == [(["cat/a.png", "dog/b.png", "c.png"][i], t, pytest.approx(v))
                                                      for i, (t, v) in first.items()]
    assert table.frequency[latent] == pytest.approx(float((z[:, latent] > 0).float().mean()))
    with pytest.raises(SAEError, match="48 latents|the SAE has 40"):
        explore.read_features(tmp_path / "features.npz", 40)


def test_a_features_file_of_objects_or_past_its_bounds_is_refused(tmp_path):
    buffer = io.BytesIO()
    np.savez(buffer, exemplar_values=np.zeros((2, 1)), exemplar_images=np.zeros((2, 1), dtype=int),
             exemplar_tokens=np.zeros((2, 1), dtype=int), frequency=np.zeros(2),
             images=np.array([{"a": 1}], dtype=object), tokens_per_image=np.int32(5))
    (tmp_path / "features.npz").write_bytes(buffer.getvalue())
    with pytest.raises(SAEError, match="not a readable features file"):
        explore.read_features(tmp_path / "features.npz", 2)
    np.savez(tmp_path / "features.npz", exemplar_values=np.zeros((2, 1)), exemplar_images=np.full((2, 1), 7),
             exemplar_tokens=np.zeros((2, 1), dtype=int), frequency=np.zeros(2), images=np.array(["a.png"]),
             tokens_per_image=np.int32(5))
    with pytest.raises(SAEError, match="does not name"):
        explore.read_features(tmp_path / "features.npz", 2)


def table_of(classes_per_latent, frequency):
    """A FeatureTable whose latent i has one exemplar image per class name of ``classes_per_latent[i]``."""
    names = sorted({c for row in classes_per_latent for c in row})
    names = [f"{c}/x.png" for c in names]
    E = max(len(row) for row in classes_per_latent)
    images = np.full((len(classes_per_latent), E), -1)
    for i, row in enumerate(classes_per_latent):
        images[i, :len(row)] = [names.index(f"{c}/x.png") for c in row]
    return FeatureTable(np.where(images >= 0, 1.0, 0.0), images, np.where(images >= 0, 1, -1),
                        np.array(frequency, dtype=np.float32), names, 5)


def test_browser_orders_by_frequency_and_by_class():
    table = table_of([["dog", "dog", "cat"], ["cat", "cat"], [], ["dog", "dog"], ["cat", "dog"]],
                     [0.1, 0.3, 0.0, 0.05, 0.2])
    assert browse_order(table, "frequency") == [1, 4, 0, 3]  # latent 2 never fired: no exemplars, not shown
    assert browse_order(table, "rare") == [3, 0, 4, 1]
    assert table.dominant_class(0) == ("dog", pytest.approx(2 / 3))
    assert browse_order(table, "class") == [1, 4, 3, 0]  # cat: 1 (all cat) then 4 (cat, dog: a tie, first name)
    assert browse_order(table, "frequency", class_name="dog") == [0, 3]


def test_an_exemplar_is_cropped_from_the_pixels_the_model_saw():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    # 60 x 40 px, the short side resized to 12 (18 x 12), the centre 8 x 8 cropped from x 5, y 2: in the image's
    # pixels (x 10/3) the model sees x 16.7..43.3, y 6.7..33.3, rounded to 17..43, 7..33; each patch is 13 px
    pre = Preprocessing(8, 3, (0.5,) * 3, (0.5,) * 3, resize_size=12, resize_mode="shortest_edge")
    crop, patch = exemplar_crop(image, pre, (2, 2), 1, 1 + 3, context=0)  # patch row 2, col 2 (from 1)
    seen = image.crop((17, 7, 43, 33))
    np.testing.assert_array_equal(np.asarray(crop), np.asarray(seen.crop((13, 13, 26, 26))))
    assert patch == (0, 0, 13, 13)
    whole, none = exemplar_crop(image, pre, (2, 2), 1, 0)  # CLS: the whole seen image
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(seen))
    assert none is None
    around, patch = exemplar_crop(image, pre, (2, 2), 1, 1 + 3, context=1)
    assert around.size == (26, 26) and patch == (13, 13, 26, 26)


@pytest.mark.slow  # open_clip takes seconds to import
def test_nearest_words_read_the_decoder_through_clips_final_norm_and_projection(tmp_path):
    open_clip = pytest.importorskip("open_clip")
    from test_prompts import save_open_clip

    from vit.features.explore import nearest_words
    from vit.sources.open import open_source

    reference, folder = save_open_clip(tmp_path / "open_clip")
    model = open_source(folder).model
    sae = SparseAutoencoder(128, 20, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                     model_fingerprint=model_fingerprint(model)))
    words = ["a dog", "a cat", "a red ball", "a tree", "the sea"]
    with torch.no_grad():
        text = reference.encode_text(open_clip.get_tokenizer(f"local-dir:{folder}")(words), normalize=True)
        # by hand, on open_clip's own modules: a direction through ln_post without its bias (centred, times its
        # weight; the division by the scale does not change a cosine), then the projection
        ln = reference.visual.ln_post
        direction = (sae.W_dec - sae.W_dec.mean(dim=-1, keepdim=True)) * ln.weight
        cosines = torch.nn.functional.normalize(direction @ reference.visual.proj, dim=-1) @ text.T  # (20, 5)
    found = nearest_words(model, sae, text, [3, 11, 0], count=2)
    for latent in (3, 11, 0):
        values, index = cosines[latent].topk(2)
        assert [i for i, _ in found[latent]] == index.tolist()
        assert [c for _, c in found[latent]] == pytest.approx(values.tolist(), abs=1e-5)


@pytest.mark.slow  # transformers takes seconds to import
def test_nearest_words_read_the_decoder_through_siglips_post_layernorm_and_probe_value_path(tmp_path):
    transformers = pytest.importorskip("transformers")
    from parity_helpers import randomize
    from test_prompts import HF_TEXT, HF_VISION

    from vit.features.explore import decoder_embeddings, nearest_words
    from vit.sources.open import open_source

    config = transformers.SiglipConfig(vision_config=HF_VISION, text_config=dict(HF_TEXT, projection_size=32))
    torch.manual_seed(0)
    reference = randomize(transformers.SiglipModel(config)).eval()
    reference.save_pretrained(tmp_path / "siglip")
    model = open_source(tmp_path / "siglip").model
    sae = SparseAutoencoder(32, 20, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    vision, d = reference.vision_model, 32
    attention = vision.head.attention  # nn.MultiheadAttention: in_proj rows are q, k, v
    W_v, W_o = attention.in_proj_weight[2 * d:], attention.out_proj.weight
    with torch.no_grad():
        text = reference.get_text_features(input_ids=torch.randint(
            49408, (5, 16), generator=torch.Generator().manual_seed(1))).pooler_output  # (5, 32): SigLIP's joint space
        # Why the probe reads a direction through W_o W_v alone: added to every token, it moves every key by the
        # same W_k delta, so each head's scores shift by one constant and the softmax does not change; the values
        # move by W_v delta, and weights that sum to one carry that through unchanged. Biases cancel in the move.
        tokens, delta = torch.randn(2, 16, d), torch.randn(d)
        probe = vision.head.probe.expand(2, -1, -1)
        moved = attention(probe, tokens + delta, tokens + delta)[0] - attention(probe, tokens, tokens)[0]
        torch.testing.assert_close(moved, (W_o @ W_v @ delta).expand(2, 1, d), rtol=0, atol=1e-5)
        # by hand on transformers' modules: post_layernorm's linear part (centred, times its weight, as for CLIP's
        # ln_post), then the probe's value and output projections; head.layernorm + mlp is the non-linear branch
        post = vision.post_layernorm.weight
        reading = torch.eye(d) - 1 / d  # centring
        reading = W_o @ W_v @ (post[:, None] * reading)  # (32, 32): a decoder row -> SigLIP's pooled embedding
        torch.testing.assert_close(decoder_embeddings(model, sae),
                                   torch.nn.functional.normalize(sae.W_dec @ reading.T, dim=-1), rtol=0, atol=1e-6)
        # a latent planted along a text embedding's preimage under that reading names that text first
        sae.W_dec[7] = torch.linalg.pinv(reading) @ text[2]
        planted = torch.nn.functional.cosine_similarity(reading @ sae.W_dec[7], text[2], dim=0)
        everyone = decoder_embeddings(model, sae) @ torch.nn.functional.normalize(text[2], dim=0)  # (20,)
    found = nearest_words(model, sae, text, [7], count=5)[7]
    assert found[0][0] == 2 and found[0][1] == pytest.approx(planted.item(), abs=1e-5) and planted > 0.95
    assert everyone.argmax() == 7 and everyone.topk(2).values[1] < planted - 0.3


def test_an_edited_copy_with_factor_one_leaves_gradients_as_they_were():
    # gradient maps (class maps, LeGrad, AttnLRP) walk the copy's backward: the error term makes it the model's
    model, sae = model_and_sae()
    images = torch.randn(1, 3, 8, 8)

    def input_gradient(m):
        x = images.clone().requires_grad_(True)
        m(x)[0][0, 1].backward()
        return x.grad

    torch.testing.assert_close(input_gradient(edited_copy(model, sae, {0: 1.0, 9: 1.0})), input_gradient(model),
                               rtol=0, atol=1e-6)
    assert not torch.allclose(input_gradient(edited_copy(model, sae, {i: 0.0 for i in range(48)})),
                              input_gradient(model), atol=1e-6)
