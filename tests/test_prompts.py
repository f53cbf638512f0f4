"""Asking CLIP and SigLIP in words, against the libraries and the authors' code (issue 22).

References, each on tiny random models built by the library itself and saved natively:

- zero-shot: open_clip's ``encode_image`` / ``encode_text`` (normalised, ``logit_scale.exp()``, softmax) and
  transformers' ``CLIPModel`` / ``SiglipModel`` forward (``logits_per_image``; softmax / sigmoid);
- gradient rollout: Transformer-MM-Explainability @ 58eaea85 ``CLIP_explainability.ipynb`` ``interpret`` on the
  repository's own hooked CLIP (``tests/reference/chefer_clip``);
- LeGrad: WalBouss/LeGrad wrapper.py @ 8c2ca901 / utils.py @ c5c7b20d: ``compute_legrad_clip`` with its hooks on
  the open_clip model (``tests/reference/legrad/clip_reference.py``; its hooked attention's return wrapped in a
  tuple, without which the hooked model no longer computes the model: see ``hook_legrad``) and
  ``compute_legrad_siglip`` with its timm hooks on a timm SigLIP (``siglip_reference.py``);
- AttnLRP: lxt's rules patched onto transformers' ``CLIPModel`` (eager attention);
- Grad-ECLIP: Cyang-Zhao/Grad-Eclip @ 5c1b5cc1 ``generate_emap.py`` ``clip_encode_dense`` + ``grad_eclip``
  (``tests/reference/grad_eclip``).
"""

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import lxt_norms
from parity_helpers import randomize
from safetensors.torch import save_file

from vit.explain.language import prompts
from vit.explain.methods.relevance import attnlrp
from vit.sources.open import open_source
from vit.sources.vlm.text_tower import TextTowerError, check_labels, open_text_tower, split_labels

open_clip = pytest.importorskip("open_clip")
open_clip_hub = pytest.importorskip("open_clip.push_to_hf_hub")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # open_clip and transformers take seconds to import

LABELS = ["a dog", "a cat", "a red ball"]
TEXT_CFG = dict(context_length=16, vocab_size=49408, width=64, heads=1, layers=1)  # the bundled BPE's ids


def save_open_clip(folder, quick_gelu=True, seed=0, layers=3):
    """A tiny random OpenAI-layout CLIP saved as open_clip saves for the Hub; (model, folder)."""
    model_cfg = dict(embed_dim=16, quick_gelu=quick_gelu, text_cfg=TEXT_CFG,
                     vision_cfg=dict(image_size=32, patch_size=8, width=128, layers=layers))
    torch.manual_seed(seed)
    model = open_clip.model.CLIP(**model_cfg)
    randomize(model, seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.0)  # a finite scale: the default log(1/0.07) too, but check it is read
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    return model.eval(), folder


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return save_open_clip(tmp_path_factory.mktemp("clip") / "open_clip")


@functools.cache
def open_clip_tokenizer(folder):
    """open_clip's own tokenizer of the saved ``folder`` (``get_tokenizer("local-dir:…")``), the references' side,
    built once a folder: each build reads CLIP's whole BPE vocabulary (~0.2 s of CPU; issue 112)."""
    return open_clip.get_tokenizer(f"local-dir:{folder}")


def image_batch(n=1, size=32, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --- the text side and zero-shot scores -----------------------------------------------------------------------

def test_open_clip_zero_shot_equals_open_clips_own_pipeline(clip_folder):
    model, folder = clip_folder
    checkpoint = open_source(folder)
    tower = open_text_tower(checkpoint)
    assert tower.kind == "softmax" and tower.library == "open_clip"
    texts = [prompts.fill(prompts.DEFAULT_TEMPLATE, label) for label in LABELS]
    x = image_batch(2)
    with torch.no_grad():
        tokenizer = open_clip_tokenizer(folder)
        image = model.encode_image(x, normalize=True)
        text = model.encode_text(tokenizer(texts), normalize=True)
        expected_logits = model.logit_scale.exp() * image @ text.T
    logits, probs = prompts.zero_shot(checkpoint.model, x, tower.encode(texts), tower.logit_scale,
                                      tower.logit_bias, tower.kind)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs, expected_logits.softmax(dim=-1), rtol=1e-5, atol=1e-5)


def test_the_imagenet_ensemble_is_open_clips_zero_shot_classifier(clip_folder):
    model, folder = clip_folder
    tower = open_text_tower(open_source(folder))
    templates = prompts.imagenet_templates()
    assert len(templates) == 80 and templates[0] == "a bad photo of a {}."
    from open_clip.zero_shot_classifier import build_zero_shot_classifier
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    with torch.no_grad():
        expected = build_zero_shot_classifier(model, open_clip_tokenizer(folder), LABELS,
                                              OPENAI_IMAGENET_TEMPLATES)  # (E, n)
    ours = prompts.prompt_embeddings(tower.encode, LABELS, templates)
    torch.testing.assert_close(ours, expected.T, rtol=1e-5, atol=1e-6)


def bpe_tokenizer_files(folder):
    """open_clip's bundled BPE vocabulary, cut to its first ``BPE_MERGES`` merges, written as HF CLIPTokenizer files
    (nothing can be downloaded)."""
    for name, data in _bpe_tokenizer_bytes().items():
        (folder / name).write_bytes(data)


# The merges of CLIP's BPE the tests' tokenizer files keep, of 48,894: each token keeps its id in the whole
# vocabulary (the 512 bytes, the first merges in rank order, the start and end of text at 49406 and 49407, where
# CLIP's and SigLIP's configs and the pooling at the end token look for them), and a word the first merges do not
# join is split into more of its pieces, the same way by whoever reads the files (every test tokenizes from them on
# both sides). The whole vocabulary's tokenizer.json took transformers 5 ~0.4 s of CPU to parse at each load, ten
# loads in this module alone; this one, ~0.01 s (issue 112).
BPE_MERGES = 4096


@functools.cache
def _bpe_tokenizer_bytes() -> dict[str, bytes]:
    """The files ``bpe_tokenizer_files`` writes, built once a process, each test still given its own copy."""
    bpe = open_clip.tokenizer.SimpleTokenizer()
    renamed = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}  # HF's names of the two
    merges = sorted(bpe.bpe_ranks, key=bpe.bpe_ranks.get)[:BPE_MERGES]
    kept = {*list(bpe.encoder)[:512], *("".join(m) for m in merges), *renamed}  # the bytes come first
    with tempfile.TemporaryDirectory() as built:
        folder = Path(built)
        (folder / "vocab.json").write_text(json.dumps({renamed.get(k, k): v for k, v in bpe.encoder.items()
                                                       if k in kept}))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
        tokenizer = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
        assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (49406, 49407)
        (folder / "vocab.json").unlink()
        (folder / "merges.txt").unlink()
        tokenizer.save_pretrained(folder)
        return {path.name: path.read_bytes() for path in folder.iterdir()}


HF_TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, vocab_size=49408,
               max_position_embeddings=16)
HF_VISION = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=2)


@pytest.mark.parametrize("architecture", ["CLIPModel", "SiglipModel", "MetaClip2Model"])
def test_hf_zero_shot_equals_the_models_own_forward(tmp_path, architecture):
    """MetaCLIP 2 (issue 91) is CLIP's architecture under its own name: it opens by CLIP's port and its text tower is
    transformers' own MetaClip2Model, held to that model's own forward."""
    if architecture == "CLIPModel":
        config = transformers.CLIPConfig(vision_config=HF_VISION, text_config=HF_TEXT, projection_dim=16)
    elif architecture == "MetaClip2Model":
        config = transformers.MetaClip2Config(vision_config=HF_VISION, text_config=HF_TEXT, projection_dim=16)
    else:
        config = transformers.SiglipConfig(vision_config=HF_VISION, text_config=dict(HF_TEXT, projection_size=32))
    torch.manual_seed(0)
    model = randomize(getattr(transformers, architecture)(config)).eval()
    model.save_pretrained(tmp_path / "m")
    checkpoint = open_source(tmp_path / "m")
    with pytest.raises(TextTowerError, match="no usable tokenizer files") as error:
        open_text_tower(checkpoint)
    assert "\n" not in str(error.value)
    bpe_tokenizer_files(tmp_path / "m")
    tower = open_text_tower(checkpoint)
    assert tower.kind == ("sigmoid" if architecture == "SiglipModel" else "softmax")
    x = image_batch(2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    padding = "max_length" if architecture == "SiglipModel" else True
    tokens = tokenizer(LABELS, padding=padding, max_length=16, truncation=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(pixel_values=x, **tokens).logits_per_image  # (images, texts)
    logits, probs = prompts.zero_shot(checkpoint.model, x, tower.encode(LABELS), tower.logit_scale,
                                      tower.logit_bias, tower.kind)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    reference = expected.sigmoid() if architecture == "SiglipModel" else expected.softmax(-1)
    torch.testing.assert_close(probs, reference, rtol=1e-5, atol=1e-5)


def test_a_text_tower_opens_asking_the_hub_nothing_and_leaving_the_environment_alone(tmp_path, fake_hub, monkeypatch):
    """A tower reads its own folder only: a request made while it opens is refused, in its own thread alone, and the
    process's environment is left as it was. It set HF_HUB_OFFLINE for the process: huggingface_hub reads that once,
    at its import, so it refused nothing (imported already), while every process another visitor started meanwhile
    inherited it (a run the Train page started, on a Hub model the cache lacked, failed offline)."""
    import os
    import threading

    from huggingface_hub import constants, get_session
    from huggingface_hub.errors import OfflineModeIsEnabled

    config = transformers.CLIPConfig(vision_config=HF_VISION, text_config=HF_TEXT, projection_dim=16)
    transformers.CLIPModel(config).save_pretrained(tmp_path / "m")
    bpe_tokenizer_files(tmp_path / "m")
    checkpoint = open_source(tmp_path / "m")
    url = f"{constants.ENDPOINT}/api/models/someone/model"
    seen = {}
    original = transformers.CLIPModel.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):  # the library's own call, with a look around first
        seen["environment"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        try:
            seen["own thread"] = get_session().get(url).status_code
        except OfflineModeIsEnabled as e:
            seen["own thread"] = str(e)
        other = threading.Thread(target=lambda: seen.update({"other thread": get_session().get(url).status_code}))
        other.start()
        other.join()
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.CLIPModel, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert open_text_tower(checkpoint).kind == "softmax"
    assert seen["environment"] == {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
    assert "opening a text tower reads local files only" in str(seen["own thread"])
    assert seen["other thread"] == 404  # the other thread asked the Hub meanwhile, and the Hub answered
    assert [r.path for r in fake_hub.requests] == ["/api/models/someone/model"]  # only the other thread's request


def test_a_vision_only_model_has_no_text_tower(tmp_path):
    model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**HF_VISION))
    model.save_pretrained(tmp_path / "v")
    with pytest.raises(TextTowerError, match="has no text tower"):
        open_text_tower(open_source(tmp_path / "v"))


def test_labels_and_templates_are_plain_bounded_text():
    assert split_labels(" a dog, a cat ;a ball\n") == ["a dog", "a cat", "a ball"]
    assert prompts.fill("a photo of {}", "{0.__class__}") == "a photo of {0.__class__}"  # never str.format
    for bad, message in ((",, ,", "at least one label"), (",".join(map(str, range(65))), "at most 64"),
                         ("x" * 201, "at most 200"), ("a, a", "twice")):
        with pytest.raises(ValueError, match=message):
            split_labels(bad)
    with pytest.raises(ValueError, match="exactly once"):
        prompts.check_template("a photo")
    assert check_labels(["<b>x</b>"]) == ["<b>x</b>"]


def test_text_embeddings_are_cached_per_text(clip_folder):
    tower = open_text_tower(open_source(clip_folder[1]))
    calls = []
    encode = tower.encode_batch
    tower.encode_batch = lambda texts, between=None: calls.append(list(texts)) or encode(texts, between)
    first = tower.encode(["a", "b"])
    again = tower.encode(["b", "c", "a"])
    assert calls == [["a", "b"], ["c"]]
    torch.testing.assert_close(again[[2, 0]], first)


# --- maps for words, against the authors' code ------------------------------------------------------------------

@pytest.fixture(scope="module")
def chefer_clip(clip_folder):
    """The same weights in the authors' hooked CLIP (Transformer-MM-Explainability's CLIP/clip/model.py)."""
    from tests.reference.chefer_clip.model import build_model

    model, _ = clip_folder
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reference = build_model(dict(state)).float()  # build_model converts to float16: load float32 again
    reference.load_state_dict(state)
    return reference.eval()


def tokens_for(folder, labels):
    return open_clip_tokenizer(folder)(labels)


@pytest.mark.parametrize("start_layer", [-1, 1])
def test_prompt_rollout_equals_the_notebooks_interpret(clip_folder, chefer_clip, start_layer):
    from tests.reference.chefer_clip.interpret import interpret

    _, folder = clip_folder
    checkpoint = open_source(folder)
    tower = open_text_tower(checkpoint)
    x = image_batch(1)
    _, expected = interpret(x, tokens_for(folder, LABELS), chefer_clip, "cpu", start_layer=start_layer)
    ours = torch.stack([prompts.prompt_rollout(checkpoint.model, x, tower.encode(LABELS), tower.logit_scale, i,
                                               start_layer=start_layer)[0] for i in range(len(LABELS))])
    torch.testing.assert_close(ours.reshape(len(LABELS), -1), expected.float(), rtol=1e-5, atol=1e-6)


def hook_legrad(model, ref, as_tuple=True):
    """LeGrad's ``_activate_self_attention_hooks`` on an open_clip model, on open_clip 3's sequence-first switch.

    LeGrad's hooked attention returns a tensor where open_clip's ``ResidualAttentionBlock.attention`` takes ``[0]``
    of ``nn.MultiheadAttention``'s tuple (in open_clip 2.23, which LeGrad pins, as in 3.x): verbatim, every token
    then gets the CLS token's attention output. ``as_tuple`` wraps the hook's return in a tuple, the one change."""
    import types

    visual = model.visual
    visual.transformer.batch_first = False  # the blocks see (L, N, D), as LeGrad's hooks expect
    for block in visual.transformer.resblocks:
        if as_tuple:
            block.attn.forward = types.MethodType(
                lambda self, *args, **kwargs: (ref.hooked_attention_forward(self, *args, **kwargs), None), block.attn)
        else:
            block.attn.forward = types.MethodType(ref.hooked_attention_forward, block.attn)
        block.forward = types.MethodType(ref.hooked_resblock_forward, block)


def test_legrads_verbatim_hooks_change_open_clips_forward():
    """Why the wrapper's hook is wrapped: verbatim, the hooked model no longer computes the model."""
    from tests.reference.legrad import clip_reference as ref

    model, _ = save_open_clip(Path(tempfile.mkdtemp()) / "open_clip")
    x = image_batch(2)
    with torch.no_grad():
        expected = model.encode_image(x)
        hook_legrad(model, ref, as_tuple=True)
        wrapped = model.encode_image(x)
        hook_legrad(model, ref, as_tuple=False)
        verbatim = model.encode_image(x)
    torch.testing.assert_close(wrapped, expected, rtol=1e-5, atol=1e-5)
    assert (verbatim - expected).abs().max() > 0.1


@pytest.mark.parametrize("start_layer", [-2, 0])
def test_prompt_legrad_equals_the_authors_clip_wrapper(start_layer):
    """LeGrad's own ``compute_legrad_clip`` with its hooks on the open_clip model (see ``hook_legrad``), the image
    repeated once per prompt as its README does."""
    import types

    from tests.reference.legrad import clip_reference as ref

    model, folder = save_open_clip(Path(tempfile.mkdtemp()) / "open_clip")  # hooked below: a model of its own
    checkpoint = open_source(folder)
    text = open_text_tower(checkpoint).encode(LABELS)  # LeGrad's text_embedding: encode_text(normalize=True)
    x = image_batch(1).repeat(len(LABELS), 1, 1, 1)
    hook_legrad(model, ref)
    wrapper = types.SimpleNamespace(visual=model.visual, starting_depth=start_layer % 3, patch_size=8,
                                    encode_image=model.encode_image)
    expected = ref.compute_legrad_clip(wrapper, text, x)  # (1, prompts, 32, 32)
    ours = prompts.prompt_legrad(checkpoint.model, x, text, torch.arange(len(LABELS)), start_layer=start_layer)
    upsampled = ref.min_max(F.interpolate(ours[None], scale_factor=8, mode="bilinear"))
    torch.testing.assert_close(upsampled, expected.detach(), rtol=1e-4, atol=1e-5)


def test_grad_eclip_equals_generate_emap(clip_folder, chefer_clip):
    from tests.reference.grad_eclip import emap

    _, folder = clip_folder
    checkpoint = open_source(folder)
    tower = open_text_tower(checkpoint)
    text = tower.encode(LABELS)
    x = image_batch(1)
    emap.clipmodel = chefer_clip
    with torch.enable_grad():
        outputs, _, _, v, q_out, k_out, _, att_output, map_size = emap.clip_encode_dense(x)
        cosines = (F.normalize(outputs[:, 0], dim=-1) @ text.T)[0]
        expected = [emap.grad_eclip(c, q_out, k_out, v, att_output, map_size) for c in cosines]
    for i in range(len(LABELS)):
        ours = prompts.grad_eclip(checkpoint.model, x, text, i)[0]
        torch.testing.assert_close(ours, expected[i].float(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["legrad", "grad_eclip"])
def test_every_prompts_map_from_one_forward_equals_the_authors(clip_folder, chefer_clip, method):
    """``prompt_maps`` runs the image once per chunk of prompts (here 2, then 1) and takes a backward per prompt (the
    rollout's case is checked through ``--save-maps``); the authors' maps of every label of the same image."""
    import types

    from tests.reference.grad_eclip import emap
    from tests.reference.legrad import clip_reference as ref

    model, folder = clip_folder
    checkpoint = open_source(folder)
    asked = prompts.ask(open_text_tower(checkpoint), LABELS, ["{}"])
    x = image_batch(1)
    ours = prompts.prompt_maps(checkpoint.model, x, asked, method, chunk=2)
    if method == "legrad":
        hooked = save_open_clip(Path(tempfile.mkdtemp()) / "open_clip")[0]  # the same seed: the same weights
        hook_legrad(hooked, ref)
        wrapper = types.SimpleNamespace(visual=hooked.visual, starting_depth=1, patch_size=8,
                                        encode_image=hooked.encode_image)
        expected = ref.compute_legrad_clip(wrapper, asked.embeddings, x.repeat(len(LABELS), 1, 1, 1)).detach()
        ours = ref.min_max(F.interpolate(ours[None], scale_factor=8, mode="bilinear"))
    else:
        emap.clipmodel = chefer_clip
        with torch.enable_grad():
            outputs, _, _, v, q_out, k_out, _, att_output, map_size = emap.clip_encode_dense(x)
            cosines = (F.normalize(outputs[:, 0], dim=-1) @ asked.embeddings.T)[0]
            expected = torch.stack([emap.grad_eclip(c, q_out, k_out, v, att_output, map_size) for c in cosines])
    torch.testing.assert_close(ours, expected.float(), rtol=1e-4, atol=1e-5 if method == "legrad" else 1e-6)


def test_attnlrp_for_a_prompt_equals_lxts_rules_on_hf_clip(tmp_path, monkeypatch):
    """lxt's AttnLRP rules (LayerNorm, element-wise activation, attention) patched into transformers' CLIPModel,
    its ``logits_per_image`` as the target. The L2 norm of the image embedding gets the rule lxt gives
    LayerNorm's scale (a constant in the backward pass): ``_get_vector_norm`` detached, as ``PromptHead`` does."""
    import transformers.models.clip.modeling_clip as modeling_clip
    from transformers.activations import QuickGELUActivation

    from tests.reference.lxt.patches import wrap_attention_forward

    config = transformers.CLIPConfig(vision_config=HF_VISION, text_config=HF_TEXT, projection_dim=16)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.CLIPModel(config)).eval()
    model.save_pretrained(tmp_path / "m")
    bpe_tokenizer_files(tmp_path / "m")
    checkpoint = open_source(tmp_path / "m")
    tower = open_text_tower(checkpoint)
    tokens = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))(LABELS, padding=True,
                                                                            return_tensors="pt")
    x = image_batch(1, seed=4)
    expected = {}
    with monkeypatch.context() as m:  # lxt patches classes; undone before anything else runs
        lxt_norms(m, QuickGELUActivation)
        m.setattr(modeling_clip, "eager_attention_forward",
                  wrap_attention_forward(modeling_clip.eager_attention_forward))
        m.setattr(modeling_clip, "_get_vector_norm", lambda t: t.norm(p=2, dim=-1, keepdim=True).detach())
        for c in (0, 2):
            xr = x.clone().requires_grad_(True)
            model(pixel_values=xr, **tokens).logits_per_image[0, c].backward()
            expected[c] = (xr * xr.grad).sum(1).detach()
    wrapped = prompts.prompt_model(checkpoint.model, tower.encode(LABELS), tower.logit_scale)
    for c in (0, 2):
        scale = expected[c].abs().max()
        torch.testing.assert_close(attnlrp(wrapped, x, c) / scale, expected[c] / scale, rtol=1e-5, atol=1e-5)


def test_the_prompt_model_leaves_the_image_tower_as_it_was(clip_folder):
    checkpoint = open_source(clip_folder[1])
    model = checkpoint.model
    before = model.encode(image_batch(1)).embedding
    wrapped = prompts.prompt_model(model, torch.nn.functional.normalize(torch.randn(2, 16), dim=-1), 3.0)
    assert wrapped.config.num_classes == 2 and model.head is None and model.projection is not None
    torch.testing.assert_close(model.encode(image_batch(1)).embedding, before)
    with pytest.raises(prompts.PromptError, match="another model"):
        prompts.prompt_model(model, torch.randn(2, 7), 1.0)


def test_map_difference_is_of_normalised_maps():
    a = torch.tensor([[[0.0, 2.0], [4.0, 2.0]]])
    b = torch.tensor([[[1.0, 1.0], [1.0, 3.0]]])
    torch.testing.assert_close(prompts.map_difference(a, b), torch.tensor([[[0.0, 0.5], [1.0, -0.5]]]))



# --- vit.predict --labels -----------------------------------------------------------------------------------

def image_file(path, seed=3, size=32):
    """A random RGB PNG at the model's own size, so that resize and crop leave it as it is in every pipeline."""
    pixels = torch.randint(0, 256, (size, size, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    from PIL import Image

    Image.fromarray(pixels.numpy()).save(path)
    return path


def open_clip_input(path):
    """The image as open_clip's own evaluation transform makes it (the reference for the input)."""
    from PIL import Image

    transform = open_clip.image_transform(32, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN,
                                          std=open_clip.OPENAI_DATASET_STD)
    return transform(Image.open(path))[None]


def predict_json(capsys, *argv):
    from vit import predict as predict_cli

    capsys.readouterr()  # what saving the model printed
    status = predict_cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, (json.loads(captured.out) if status == 0 else None), captured.err


@pytest.mark.parametrize("template", [None, "{}", "imagenet"])
def test_predict_labels_prints_open_clips_zero_shot(clip_folder, tmp_path, capsys, template):
    model, folder = clip_folder
    path = image_file(tmp_path / "x.png")
    argv = [folder, path, "--labels", "a dog, a cat;a red ball"] + (["--template", template] if template else [])
    status, records, _ = predict_json(capsys, *argv)
    assert status == 0
    from open_clip.zero_shot_classifier import build_zero_shot_classifier
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    templates = {None: ["a photo of a {}."], "{}": ["{}"], "imagenet": OPENAI_IMAGENET_TEMPLATES}[template]
    with torch.no_grad():
        classifier = build_zero_shot_classifier(model, open_clip_tokenizer(folder), LABELS,
                                                templates)  # (E, n)
        expected = (model.logit_scale.exp() * model.encode_image(open_clip_input(path), normalize=True)
                    @ classifier).softmax(dim=-1)[0]
    got = {p["label"]: p["probability"] for p in records[0]["predictions"]}
    assert list(got) == [LABELS[i] for i in expected.argsort(descending=True)]  # the typed labels, best first
    assert [got[label] for label in LABELS] == pytest.approx(expected.tolist(), abs=1e-5)


def test_predict_labels_save_maps_writes_every_prompts_maps(clip_folder, chefer_clip, tmp_path, capsys):
    from tests.reference.chefer_clip.interpret import interpret

    _, folder = clip_folder
    path = image_file(tmp_path / "x.png")
    status, records, _ = predict_json(capsys, folder, path, "--labels", ",".join(LABELS), "--template", "{}",
                                      "--save-maps", tmp_path / "maps")
    assert status == 0
    listed = records[0]["maps"]["prompts"]
    assert [entry["label"] for entry in listed] == LABELS
    # the dense maps but CLIP Surgery, which changes six blocks (this CLIP has three)
    assert set(listed[0]) == {"label", "rollout", "legrad", "attnlrp", "grad_eclip", "sclip", "naclip", "clearclip",
                              "maskclip"}
    assert all(Path(p).is_file() for entry in listed for key, p in entry.items() if key != "label")
    with np.load(records[0]["maps"]["npz"]) as arrays:
        assert list(arrays["class_names"]) == LABELS and str(arrays["probability_kind"]) == "softmax"
        assert arrays["prompt_legrad"].shape == (3, 4, 4)
        _, expected = interpret(open_clip_input(path), tokens_for(folder, LABELS), chefer_clip, "cpu")
        np.testing.assert_allclose(arrays["prompt_rollout"].reshape(3, -1), expected.numpy(), rtol=1e-4, atol=1e-6)


def test_predict_labels_of_a_siglip_are_sigmoids(tmp_path, capsys):
    config = transformers.SiglipConfig(vision_config=HF_VISION, text_config=dict(HF_TEXT, projection_size=32))
    torch.manual_seed(0)
    model = randomize(transformers.SiglipModel(config)).eval()
    model.save_pretrained(tmp_path / "m")
    bpe_tokenizer_files(tmp_path / "m")
    path = image_file(tmp_path / "x.png")
    status, records, _ = predict_json(capsys, tmp_path / "m", path, "--labels", ",".join(LABELS), "--template",
                                      "{}", "--save-maps", tmp_path / "maps")
    assert status == 0
    checkpoint = open_source(tmp_path / "m")
    from vit.core.inference import preprocess

    x = preprocess([__import__("PIL.Image").Image.open(path)], checkpoint.preprocessing)
    tokens = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))(
        LABELS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(pixel_values=x, **tokens).logits_per_image.sigmoid()[0]
    got = {p["label"]: p["probability"] for p in records[0]["predictions"]}
    assert [got[label] for label in LABELS] == pytest.approx(expected.tolist(), abs=1e-5)
    assert sum(got.values()) != pytest.approx(1.0)  # per label, not a softmax
    assert set(records[0]["maps"]["prompts"][0]) == {"label", "legrad", "attnlrp"}  # what reads SigLIP's pooling


@pytest.mark.parametrize("argv, message", [
    (["--labels", ",,"], "at least one label"),
    (["--labels", "a,b", "--template", "no slot"], "exactly once"),
    (["--template", "{}"], "goes with --labels"),
])
def test_predict_labels_refuses_bad_text_in_one_line(clip_folder, tmp_path, capsys, argv, message):
    status, _, err = predict_json(capsys, clip_folder[1], image_file(tmp_path / "x.png"), *argv)
    assert status == 2 and message in err and err.count("\n") == 1


def test_predict_labels_on_a_model_without_text_is_one_line(tmp_path, capsys):
    model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**HF_VISION))
    model.save_pretrained(tmp_path / "v")
    status, _, err = predict_json(capsys, tmp_path / "v", image_file(tmp_path / "x.png"), "--labels", "a dog")
    assert status == 2 and "has no text tower" in err and err.count("\n") == 1


# --- vit.evaluate --zero-shot ---------------------------------------------------------------------------------

@pytest.mark.parametrize("template", [None, "imagenet"])
def test_evaluate_zero_shot_is_open_clips_zero_shot_accuracy(clip_folder, tmp_path, capsys, template):
    from open_clip.zero_shot_classifier import build_zero_shot_classifier
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    from vit import evaluate as evaluate_cli

    model, folder = clip_folder
    folders = ["a_cat", "dog", "red_ball"]  # sorted, as the subfolders are read
    files = []
    for c, name in enumerate(folders):
        (tmp_path / "data" / name).mkdir(parents=True)
        files += [(image_file(tmp_path / "data" / name / f"{i}.png", seed=10 * c + i), c) for i in range(4)]
    templates = OPENAI_IMAGENET_TEMPLATES if template else ["a photo of a {}."]
    with torch.no_grad():
        classifier = build_zero_shot_classifier(model, open_clip_tokenizer(folder),
                                                [n.replace("_", " ") for n in folders], templates)
        images = torch.cat([open_clip_input(path) for path, _ in files])
        predicted = (model.encode_image(images, normalize=True) @ classifier).argmax(dim=-1)
    right = [int(predicted[i]) == c for i, (_, c) in enumerate(files)]
    capsys.readouterr()
    status = evaluate_cli.main([str(folder), "--data", str(tmp_path / "data"), "--zero-shot"]
                               + (["--template", template] if template else []))
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["count"] == 12
    assert result["accuracy"] == pytest.approx(sum(right) / 12)
    for c, name in enumerate(folders):
        got = result["per_class"][name]["accuracy"]
        assert got == pytest.approx(sum(r for r, (_, k) in zip(right, files, strict=True) if k == c) / 4)


def test_evaluate_zero_shot_needs_a_text_tower_and_its_flag(clip_folder, tmp_path, capsys):
    from vit import evaluate as evaluate_cli

    (tmp_path / "data" / "dog").mkdir(parents=True)
    image_file(tmp_path / "data" / "dog" / "0.png")
    capsys.readouterr()
    assert evaluate_cli.main([str(clip_folder[1]), "--data", str(tmp_path / "data"), "--template", "{}"]) == 2
    assert "goes with --zero-shot" in capsys.readouterr().err
    model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**HF_VISION))
    model.save_pretrained(tmp_path / "v")
    capsys.readouterr()
    assert evaluate_cli.main([str(tmp_path / "v"), "--data", str(tmp_path / "data"), "--zero-shot"]) == 2
    err = capsys.readouterr().err
    assert "has no text tower" in err and err.count("\n") == 1


def test_deletion_and_insertion_score_the_prompts_similarity(clip_folder):
    model, folder = clip_folder
    checkpoint = open_source(folder)
    asked = prompts.ask(open_text_tower(checkpoint), LABELS)
    x, map2d = image_batch(1), torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(5))
    fractions, deletion, insertion = prompts.prompt_curves(checkpoint.model, x, asked, map2d, 2, "zero", steps=2)
    top = torch.zeros(16)
    top[map2d.flatten().argsort(descending=True)[:8]] = 1  # the most relevant half, by hand
    mask = top.reshape(4, 4).repeat_interleave(8, 0).repeat_interleave(8, 1)  # (32, 32)
    steps_deleted = torch.cat([x, x * (1 - mask), torch.zeros_like(x)])  # 0, 8, 16 patches at 0
    steps_inserted = torch.cat([torch.zeros_like(x), x * mask, x])
    with torch.no_grad():
        text = model.encode_text(tokens_for(folder, [prompts.fill(prompts.DEFAULT_TEMPLATE, LABELS[2])]),
                                 normalize=True)[0]
        expected_deletion = model.encode_image(steps_deleted, normalize=True) @ text
        expected_insertion = model.encode_image(steps_inserted, normalize=True) @ text
    assert fractions.tolist() == [0.0, 0.5, 1.0]
    np.testing.assert_allclose(deletion[0], expected_deletion.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(insertion[0], expected_insertion.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("correction", [True, False])
def test_prompt_legrad_equals_the_authors_siglip_readout(tmp_path, correction):
    """LeGrad's ``compute_legrad_siglip`` on a hooked timm SigLIP, against ours on the same weights opened from
    the timm folder. One prompt: with several, the reference sums their similarities into one map."""
    import types

    from parity_helpers import timm_random
    from test_siglip_parity import TIMM_SIGLIP

    from tests.reference.legrad import siglip_reference as ref

    trunk = timm_random(TIMM_SIGLIP, num_classes=0)
    timm_module = pytest.importorskip("timm")
    timm_module.models.save_for_hf(trunk, tmp_path / "timm", model_args=dict(num_heads=2, img_size=32),
                                   safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    generator = torch.Generator().manual_seed(7)
    text = F.normalize(torch.randn(1, 32, generator=generator), dim=-1)
    empty = F.normalize(torch.randn(32, generator=generator), dim=-1)
    x = image_batch(1)
    for block in trunk.blocks:
        block.forward = types.MethodType(ref.hooked_resblock_timm_forward, block)
    trunk.attn_pool.forward = types.MethodType(ref.hooked_attentional_pooler_timm_forward, trunk.attn_pool)
    wrapper = types.SimpleNamespace(visual=types.SimpleNamespace(trunk=trunk), starting_depth=len(trunk.blocks) - 2,
                                    patch_size=8, zero_grad=trunk.zero_grad, encode_image=trunk,
                                    empty_embedding=empty[:, None], _init_empty_embedding=lambda: None)
    expected = ref.compute_legrad_siglip(wrapper, text, x, apply_correction=correction)  # (1, 1, 32, 32)
    ours = prompts.prompt_legrad(checkpoint.model, x, text, 0, start_layer=-2, empty=empty if correction else None)
    upsampled = F.interpolate(ours[:, None], scale_factor=8, mode="bilinear")
    torch.testing.assert_close(upsampled, expected.detach(), rtol=1e-4, atol=1e-5)
