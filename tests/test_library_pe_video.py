"""PE video by the library road (issue 91, item 4): transformers' ``PeVideoEncoder`` (a timm PE-Core trunk per frame,
then a temporal transformer over the CLS and one token a frame) built tiny with random weights by transformers, saved
with ``save_pretrained`` beside its ``PeVideoVideoProcessor``, never downloaded, and opened by path with ``vit.load``.
Its embeddings are transformers' forward; every temporal layer's attention is transformers' eager attention
(``output_attentions`` of the eager implementation), every trunk layer's timm's explicit path (the probabilities its
``attn_drop`` receives, hooked here); each is placed on the frames' grids, on frames of 4 x 6 patches (a transposed
grid has another shape, a column-major one other values), two clips in a batch of three frames each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from layer_reference import widened
from PIL import Image

import vit
from vit.checkpoint import CheckpointError

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")

FRAMES, HEIGHT, WIDTH, PATCH = 3, 32, 48, 8  # a 4 x 6 grid of patches a frame
GH, GW = HEIGHT // PATCH, WIDTH // PATCH
TRUNK = dict(architecture="vit_pe_core_tiny_patch16_384", num_classes=16, global_pool="map",
             model_args=dict(depth=2, embed_dim=32, num_heads=2, img_size=[HEIGHT, WIDTH], patch_size=PATCH,
                             attn_pool_num_heads=2, ref_feat_shape=[GH, GW]))
TEMPORAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16)


def save_pe_video(folder):
    config = transformers.PeVideoEncoderConfig(vision_config=TRUNK, **TEMPORAL)
    torch.manual_seed(0)
    model = transformers.PeVideoEncoder(config).eval()
    widened(model)  # weights wide enough that every head's attention differs from uniform
    model.save_pretrained(folder)
    fields = dict(size={"height": HEIGHT, "width": WIDTH}, image_mean=[0.5] * 3, image_std=[0.5] * 3, do_resize=True,
                  do_rescale=True, do_normalize=True)
    transformers.PeVideoVideoProcessor(**fields, num_frames=FRAMES).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_pe_video(tmp_path_factory.mktemp("pe_video"))


@pytest.fixture(scope="module")
def checkpoint(folder):
    return vit.load(folder, device="cpu")


@pytest.fixture(scope="module")
def reference(folder):
    """The saved model as transformers builds it, its attention the eager implementation's."""
    return transformers.PeVideoEncoder.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def clip():
    return torch.randn(2, FRAMES, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))  # (B, F, C, H, W)


def eager(reference, clip):
    """transformers' eager forward of ``clip``: its output, every temporal layer's attention (``output_attentions``),
    and every trunk layer's as timm's explicit path computes it (fused attention off, read at its ``attn_drop``)."""
    trunk = reference.embedder.vision_model.timm_model
    spatial = []
    hooks = []
    for block in trunk.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda m, i, o: spatial.append(i[0])))
    try:
        with torch.no_grad():
            out = reference(pixel_values_videos=clip, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    return out, out.attentions, spatial


@pytest.fixture(scope="module")
def theirs(reference, clip):
    return eager(reference, clip)


@pytest.fixture(scope="module")
def ours(checkpoint, clip):
    model = checkpoint.model
    return model.record(clip, layers=range(model.num_layers), frame_layers=range(model.num_frame_layers))


def test_pe_video_opens_by_path_through_the_library_road(checkpoint):
    model = checkpoint.model
    assert checkpoint.road == "library" and checkpoint.metadata["architecture"] == "hf:PeVideoEncoder"
    assert model.layout.grid == (GH, GW) and model.layout.num_prefix_tokens == 1  # PE-Core's CLS, then the patches
    assert model.num_frames == FRAMES and checkpoint.preprocessing.image_hw == (HEIGHT, WIDTH)
    assert (model.num_layers, model.num_heads, model.num_frame_layers) == (2, 2, 2)


def test_the_embeddings_are_transformers_forward(ours, theirs):
    out, _, _ = theirs
    torch.testing.assert_close(ours.output.pooler_output, out.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.output.last_hidden_state, out.last_hidden_state, atol=1e-5, rtol=0)


def test_every_temporal_layer_is_transformers_eager_attention(ours, theirs):
    _, temporal, _ = theirs
    assert len(ours.temporal) == len(temporal) == 2
    for layer, probabilities in ours.temporal.items():
        assert probabilities.shape == (2, 2, 1 + FRAMES, 1 + FRAMES)  # (B, H, CLS + frames, CLS + frames)
        torch.testing.assert_close(probabilities, temporal[layer], atol=1e-5, rtol=0)
    assert not torch.allclose(temporal[-1][0, 0, 0], torch.full((1 + FRAMES,), 1 / (1 + FRAMES)), atol=1e-3)


def test_every_trunk_layer_is_timms_explicit_attention_over_each_frame(ours, theirs):
    _, _, spatial = theirs
    assert len(ours.spatial) == len(spatial) == 2
    for layer, probabilities in ours.spatial.items():
        assert probabilities.shape == (2, FRAMES, 2, 1 + GH * GW, 1 + GH * GW)  # (B, F, H, T, T)
        # transformers runs the trunk on the clips' frames as one batch, clip after clip
        torch.testing.assert_close(probabilities, spatial[layer].reshape(2, FRAMES, *spatial[layer].shape[1:]),
                                   atol=1e-5, rtol=0)


def test_a_frames_attention_is_placed_row_major_on_its_own_frame(ours, theirs):
    """The CLS's row of every frame, and one patch's row on its own frame, laid on the 4 x 6 grid by hand: the
    trunk's batch is clip-major (a frame order of (F, B) fails) and its patches row-major (a transposed grid fails)."""
    _, _, spatial = theirs
    eager = spatial[1].reshape(2, FRAMES, *spatial[1].shape[1:])  # (B, F, H, T, T)
    expected = torch.zeros(2, FRAMES, GH, GW)
    for b in range(2):
        for f in range(FRAMES):
            for r in range(GH):
                for c in range(GW):
                    expected[b, f, r, c] = eager[b, f, 1, 0, 1 + r * GW + c]
    torch.testing.assert_close(ours.placed(1, 0, head=1), expected, atol=1e-6, rtol=0)
    one = torch.zeros(2, FRAMES, GH, GW)
    for r in range(GH):
        for c in range(GW):
            one[:, 2, r, c] = eager[:, 2, :, 1 + 1 * GW + 4, 1 + r * GW + c].mean(1)
    torch.testing.assert_close(ours.placed(1, (2, 1, 4)), one, atol=1e-6, rtol=0)


def test_the_temporal_attention_is_placed_on_each_frame_in_order(ours, theirs):
    """Token 1 + f is frame f: the CLS's row over the frames and frame 1's row, each frame's weight over its grid."""
    _, temporal, _ = theirs
    for query in (0, 2):
        placed = ours.placed(0, query, head=0, temporal=True)  # (B, F, GH, GW)
        for f in range(FRAMES):
            assert torch.allclose(placed[:, f], temporal[0][:, 0, query, 1 + f][:, None, None].expand(-1, GH, GW),
                                  atol=1e-6, rtol=0)
    mean = ours.placed(1, 0, temporal=True)[:, :, 0, 0]
    torch.testing.assert_close(mean, temporal[1][:, :, 0, 1:].mean(1), atol=1e-6, rtol=0)


def test_a_patch_of_the_image_is_the_token_the_layout_places_there(checkpoint, clip):
    """The pixels of frame 2's patch (1, 4) reach the trunk's patch embedding at token 1 * 6 + 4 of frame 2's image
    alone (the layout's row-major index after the prefix), so a transposed grid (4 * 4 + 1) or another frame fails."""
    trunk = checkpoint.model.frames.trunk
    seen = []
    hook = trunk.patch_embed.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        changed = clip.clone()
        changed[0, 2, :, 1 * PATCH:2 * PATCH, 4 * PATCH:5 * PATCH] += 1.0
        checkpoint.model.record(clip[:1])
        checkpoint.model.record(changed[:1])
    finally:
        hook.remove()
    differs = (seen[0] - seen[1]).abs().amax(-1)  # (F, GH*GW): patch tokens, no prefix yet
    assert differs.nonzero().tolist() == [[2, 1 * GW + 4]]


def test_open_source_without_the_library_road_refuses_it_in_one_line(folder):
    from vit.sources.open import open_source

    with pytest.raises(CheckpointError) as refused:
        open_source(folder)
    assert "opens as transformers builds it" in str(refused.value) and "\n" not in str(refused.value)


def test_a_video_processor_with_a_bad_frame_count_is_refused_in_one_line(folder, tmp_path):
    import shutil

    folder = shutil.copytree(folder, tmp_path / "copy")
    path = folder / "video_preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_frames": 0}))
    with pytest.raises(CheckpointError, match="num_frames 0 is not a frame count") as refused:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refused.value)


def test_a_video_processor_without_a_frame_count_samples_16_frames_and_says_so(folder, tmp_path):
    import shutil

    folder = shutil.copytree(folder, tmp_path / "copy")
    path = folder / "video_preprocessor_config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "num_frames"}))
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.model.num_frames == 16 and "16 frames" in checkpoint.metadata["preprocessing_guessed"]


def test_an_image_is_refused_in_one_line(checkpoint):
    with pytest.raises(ValueError, match="takes a clip") as refused:
        checkpoint.model.record(torch.zeros(1, 3, HEIGHT, WIDTH))
    assert "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def frames():
    """Three frames twice the model's size, so the processor's resize runs."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (2 * HEIGHT, 2 * WIDTH, 3), dtype=np.uint8)) for _ in range(FRAMES)]


@pytest.fixture(scope="module")
def processed(folder, frames):
    """The frames as transformers' PeVideoVideoProcessor (the folder's) prepares them: ``(1, F, C, H, W)``."""
    processor = transformers.PeVideoVideoProcessor.from_pretrained(folder)
    return processor(videos=[np.stack([np.asarray(f) for f in frames])], return_tensors="pt").pixel_values_videos


def test_the_frames_are_prepared_as_its_video_processor_prepares_them(checkpoint, frames, processed):
    from vit.core.clips import clip_pixels

    torch.testing.assert_close(clip_pixels(frames, checkpoint.preprocessing), processed, atol=1e-5, rtol=0)


def test_vit_explain_draws_a_patchs_trunk_attention_on_its_own_frame(checkpoint, reference, frames, processed):
    _, _, spatial = eager(reference, processed)
    explanation = vit.explain(checkpoint, frames, "attention", layer=-1, head=1, query=(2, 1, 4))
    expected = np.zeros((FRAMES, GH, GW), np.float32)
    for r in range(GH):
        for c in range(GW):
            expected[2, r, c] = spatial[-1][2, 1, 1 + 1 * GW + 4, 1 + r * GW + c]
    np.testing.assert_allclose(explanation.map, expected, atol=1e-5, rtol=0)
    assert explanation.heads.shape == (2, FRAMES, GH, GW) and explanation.grid == (FRAMES, GH, GW)
    assert len(explanation.overlays()) == FRAMES


def test_vit_explain_draws_the_temporal_attention_over_the_frames(checkpoint, reference, frames, processed):
    _, temporal, _ = eager(reference, processed)
    explanation = vit.explain(checkpoint, frames, "temporal", layer=0, query=2)  # frame 1's row over the frames
    expected = temporal[0][0, :, 2, 1:].mean(0).numpy()  # (F,): the heads' mean, the CLS key left out
    np.testing.assert_allclose(explanation.map, np.broadcast_to(expected[:, None, None], (FRAMES, GH, GW)),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize(("arguments", "message"), [
    (dict(method="flow"), "choose one of: attention, rollout, temporal, probe"),
    (dict(method="rollout", head=0), "leave head out"),
    (dict(method="temporal", query=(1, 2, 3)), "give a token index"),
    (dict(method="attention", query=(3, 0, 0)), "within 3 x 4 x 6"),
    (dict(method="attention", layer=5), "its frames trunk has 2 layers"),
    (dict(method="attention", target=1), "leave out target"),
])
def test_vit_explain_refuses_what_it_does_not_draw_in_one_line(checkpoint, frames, arguments, message):
    with pytest.raises(ValueError, match=message) as refused:
        vit.explain(checkpoint, frames, **arguments)
    assert "\n" not in str(refused.value)


def test_the_checkpoint_prints_in_one_line(checkpoint):
    assert repr(checkpoint).startswith("<Checkpoint") and "in patches of 8, no classifier" in repr(checkpoint)


def test_vit_methods_lists_the_map_it_draws_and_one_image_is_refused_in_one_line(checkpoint, frames):
    assert list(vit.methods(checkpoint)) == ["attention", "rollout", "probe"]
    with pytest.raises(ValueError, match="takes a clip, not one image") as refused:
        vit.explain(checkpoint, frames[0], "attention")
    assert "\n" not in str(refused.value)


def test_pe_video_models_video_encoder_opens_and_runs_as_its_forward_runs_it(tmp_path, clip):
    """A ``PeVideoModel`` folder (model_type ``pe_video``: the encoder beside a ModernBERT text model) opens its
    video encoder; the clip's outputs are what ``PeVideoModel.forward`` gives (``video_outputs``), and every temporal
    layer's attention its encoder's eager one."""
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    config = transformers.PeVideoConfig(text_config=text, video_config=dict(TEMPORAL, vision_config=TRUNK))
    torch.manual_seed(0)
    whole = transformers.PeVideoModel(config).eval()
    widened(whole)
    whole.save_pretrained(tmp_path)
    transformers.PeVideoVideoProcessor(size={"height": HEIGHT, "width": WIDTH}, num_frames=FRAMES, do_resize=True
                                       ).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.metadata["architecture"] == "hf:PeVideoModel" and checkpoint.model.layout.grid == (GH, GW)
    reference = transformers.PeVideoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = reference(input_ids=torch.tensor([[1, 5, 6, 2]] * 2), pixel_values_videos=clip).video_outputs
        attentions = reference.video_encoder(pixel_values_videos=clip, output_attentions=True).attentions
    ours = checkpoint.model.record(clip, layers=range(2))
    torch.testing.assert_close(ours.output.pooler_output, out.pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.output.last_hidden_state, out.last_hidden_state, atol=1e-5, rtol=0)
    for layer, probabilities in ours.temporal.items():
        torch.testing.assert_close(probabilities, attentions[layer], atol=1e-5, rtol=0)


def test_a_clip_is_sampled_as_its_video_processor_samples_it_first_frame_to_last(checkpoint):
    from transformers.video_utils import VideoMetadata

    from vit.core.clips import read_clip

    theirs = transformers.PeVideoVideoProcessor().sample_frames(VideoMetadata(total_num_frames=8, fps=8),
                                                                num_frames=FRAMES)
    assert list(theirs) == [0, 3, 7]
    assert read_clip([Image.new("RGB", (4, 4))] * 8, FRAMES, ends=True).indices == list(theirs)
    clip = [Image.new("RGB", (WIDTH, HEIGHT), (30 * i, 0, 0)) for i in range(8)]
    explanation = vit.explain(checkpoint, clip, "temporal")
    assert [frame.getpixel((0, 0))[0] for frame in explanation.frames] == [30 * i for i in theirs]


def probe_by_hand(reference, clip) -> torch.Tensor:
    """Each frame's attention-pooling probabilities ``(B*F, H, latents, T)`` as timm's ``AttentionPoolLatent``
    forms them, by hand from its own modules (its latent through ``q``, its input through ``kv``, ``q_norm`` and
    ``k_norm``) on the input it receives in transformers' forward of ``clip``."""
    pool = reference.embedder.vision_model.timm_model.attn_pool
    seen = []
    hook = pool.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    try:
        with torch.no_grad():
            reference(pixel_values_videos=clip)
            x = seen[0] if pool.pos_embed is None else seen[0] + pool.pos_embed
            n, tokens, _ = x.shape
            q = pool.q(pool.latent.expand(n, -1, -1)).reshape(n, pool.latent_len, pool.num_heads, pool.head_dim)
            k = pool.kv(x).reshape(n, tokens, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4)[0]
            q, k = pool.q_norm(q.transpose(1, 2)), pool.k_norm(k)
            return ((q * pool.scale) @ k.transpose(-2, -1)).softmax(-1)
    finally:
        hook.remove()


def test_each_frames_pooling_probe_is_what_timms_pooling_head_forms(checkpoint, reference, clip):
    recorded = checkpoint.model.record(clip, probe=True)
    expected = probe_by_hand(reference, clip)  # (B*F, H, 1, T)
    assert recorded.probe.shape == (2, FRAMES, 2, 1, 1 + GH * GW)
    torch.testing.assert_close(recorded.probe, expected.reshape(2, FRAMES, *expected.shape[1:]), atol=1e-6, rtol=0)
    placed = torch.zeros(2, FRAMES, GH, GW)
    for r in range(GH):
        for c in range(GW):
            placed[:, :, r, c] = expected.reshape(2, FRAMES, 2, 1 + GH * GW)[:, :, 1, 1 + r * GW + c]
    torch.testing.assert_close(recorded.placed_probe(head=1), placed, atol=1e-6, rtol=0)
    torch.testing.assert_close(recorded.output.pooler_output, checkpoint.model.record(clip).output.pooler_output,
                               atol=1e-6, rtol=0)  # its explicit path, recorded, gives the fused path's embedding


def test_vit_explain_draws_each_frames_pooling_probe(checkpoint, reference, frames, processed):
    explanation = vit.explain(checkpoint, frames, "probe", head=0)
    expected = probe_by_hand(reference, processed)[:, 0, 0, 1:].reshape(FRAMES, GH, GW)  # one clip: (F, ...)
    np.testing.assert_allclose(explanation.map, expected.numpy(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="reads head alone") as refused:
        vit.explain(checkpoint, frames, "probe", layer=0)
    assert "\n" not in str(refused.value)


def test_vit_explain_rolls_each_frames_trunk_attention_out_as_abnar_and_zuidema_do(checkpoint, reference, frames,
                                                                                    processed):
    """Each frame's CLS rollout over the trunk's two layers, by hand from timm's explicit attentions: the heads'
    mean with the identity added, rows normalised, the later layer on the left."""
    _, _, spatial = eager(reference, processed)  # (F, H, T, T) each: one clip
    factors = []
    for attention in spatial:
        a = attention.mean(1) + torch.eye(attention.shape[-1])
        factors.append(a / a.sum(-1, keepdim=True))
    rolled = factors[1] @ factors[0]  # (F, T, T)
    explanation = vit.explain(checkpoint, frames, "rollout")
    np.testing.assert_allclose(explanation.map, rolled[:, 0, 1:].reshape(FRAMES, GH, GW).numpy(), atol=1e-5, rtol=0)
    patch = vit.explain(checkpoint, frames, "rollout", layer=0, query=(1, 2, 5))
    expected = np.zeros((FRAMES, GH, GW), np.float32)
    expected[1] = factors[0][1, 1 + 2 * GW + 5, 1:].reshape(GH, GW).numpy()
    np.testing.assert_allclose(patch.map, expected, atol=1e-5, rtol=0)


def test_vit_predict_on_pe_video_says_in_one_line_to_draw_its_maps_with_vit_explain(folder, frames, tmp_path, capsys):
    from vit import predict as predict_cli

    path = tmp_path / "clip.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    assert predict_cli.main([str(folder), str(path), "--device", "cpu"]) != 0
    said = capsys.readouterr()
    message = (said.err or said.out).strip()
    assert "no classifier" in message and "vit.explain" in message and "\n" not in message


def test_vit_explain_checks_its_settings_before_any_frame_is_decoded(checkpoint, monkeypatch):
    import vit.core.clips

    monkeypatch.setattr(vit.core.clips, "read_clip", lambda *a, **k: pytest.fail("decoded before the check"))
    with pytest.raises(ValueError, match="its temporal encoder has 2 layers"):
        vit.explain(checkpoint, "clip.mp4", "temporal", layer=7)
    with pytest.raises(ValueError, match=r"not one of the 4 tokens"):  # the CLS and the 3 frames it samples
        vit.explain(checkpoint, "clip.mp4", "temporal", query=4)


def test_a_model_whose_temporal_layers_run_over_other_tokens_is_refused_in_one_line(folder, monkeypatch):
    # The check at opening traces the encoder on the meta device and counts each temporal layer's keys: the CLS and
    # one token a frame (the first 3 of the processor's frames, 4 at most). A road that expected another prefix
    # would place every row one token off: refused, naming what the layers ran over.
    from vit.sources.library_road import pe_video

    monkeypatch.setattr(pe_video, "TEMPORAL_PREFIX", 2)
    with pytest.raises(CheckpointError) as refused:
        vit.load(folder, device="cpu")
    assert str(refused.value).endswith("its temporal attention runs over [4] tokens, not the CLS and 3 frames the "
                                       "library road places")
