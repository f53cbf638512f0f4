"""SAM 3's concept prompts (issue 94, item 3): ``vit.segment(vit.open_sam3(folder), image, text=..., box=...)`` on a
tiny random ``Sam3Model`` built and saved by transformers with its ``Sam3Processor`` (a CLIP tokenizer of open_clip's
bundled vocabulary): its instances' scores, boxes and masks are transformers' (the eager model and the processor's
``post_process_instance_segmentation``, run here alone); the explained instance's decoder attention is the vision
cross-attention ``output_attentions`` returns, every layer and head, placed row-major on the DETR grid; its
gradient x input is autograd's, by hand, and its AttnLRP lxt's own rules patched into transformers' model (as
test_sam_attnlrp_lxt patches them into SAM's); the exemplar box is read as (x0, y0, x1, y1): transposed, other
answers."""

import functools
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from test_prompts import bpe_tokenizer_files  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

SIDE, PATCH = 64, 8  # the input, square (SAM 3's RoPE grid is its config's): an 8 x 8 DETR grid
TEXT, BOX = "a red dog", (12.0, 8.0, 70.0, 40.0)  # a box whose transpose is another box inside the 90 x 70 image
VISION = dict(fpn_hidden_size=16, backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]],
              backbone_config=dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2, image_size=SIDE, patch_size=PATCH,
                                   window_size=2, global_attn_indexes=[1], pretrain_image_size=SIDE))
SMALL = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32)


def picture() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, (70, 90, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_sam3(tmp_path_factory.mktemp("sam3"))


def build_sam3(path):
    """A tiny random SAM 3 (seed 0, its weights spread) saved whole in ``path`` with its processor."""
    config = transformers.Sam3Config(
        vision_config=VISION,
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=49408, max_position_embeddings=32, projection_dim=32),
        geometry_encoder_config=dict(num_layers=1, **SMALL), detr_encoder_config=dict(num_layers=1, **SMALL),
        detr_decoder_config=dict(num_layers=2, num_queries=6, **SMALL),
        mask_decoder_config=dict(hidden_size=16, num_attention_heads=2))
    torch.manual_seed(0)
    model = transformers.Sam3Model(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # scores and masks that differ from query to query
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    bpe_tokenizer_files(path)
    processor = transformers.Sam3Processor(
        image_processor=transformers.Sam3ImageProcessor(size={"height": SIDE, "width": SIDE}),
        tokenizer=transformers.CLIPTokenizer.from_pretrained(path))
    processor.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sam3(folder):
    return vit.open_sam3(folder)


@functools.lru_cache(maxsize=2)
def library_model(folder: str, attention: str):
    """transformers' own Sam3Model (with ``attention``) and Sam3Processor read from ``folder``, once a module (each
    read ~0.6 s of CPU, the tokenizer's 49,408-token vocabulary most of it; 13 asks): the module's folder is never
    changed, and no test changes the model (hooks and lxt's patches are undone, gradients are asked of the input)."""
    model = transformers.Sam3Model.from_pretrained(folder, attn_implementation=attention).eval()
    return model, transformers.Sam3Processor.from_pretrained(folder)


def by_transformers(folder, text, box, threshold=0.0, attention="sdpa"):
    """transformers alone: the model (its SDPA attention, as the library road runs it; or ``attention`` "eager",
    whose ``output_attentions`` are the probabilities) on the processor's inputs, and the processor's kept
    instances."""
    model, processor = library_model(str(folder), attention)
    boxes = {} if box is None else dict(input_boxes=[[list(box)]], input_boxes_labels=[[1]])
    inputs = processor(images=picture(), text=text, return_tensors="pt", **boxes)
    with torch.no_grad():
        out = model(**inputs, output_attentions=attention == "eager")
    [kept] = processor.post_process_instance_segmentation(out, threshold=threshold, mask_threshold=0.5,
                                                          target_sizes=[(70, 90)])
    return model, inputs, out, kept


def split(out) -> float:
    """A threshold in the widest gap between the queries' scores: some kept, some not, far from either (0: every
    one, where the scores lie within 1e-4 of each other)."""
    scores = np.sort((out.pred_logits.sigmoid() * out.presence_logits.sigmoid())[0].numpy())
    gap = int(np.argmax(np.diff(scores)))
    return float(scores[gap] + scores[gap + 1]) / 2 if scores[gap + 1] - scores[gap] > 1e-4 else 0.0


@pytest.mark.parametrize("text, box", [(TEXT, None), (None, BOX), (TEXT, BOX)], ids=["text", "box", "both"])
def test_the_instances_are_transformers_own(sam3, folder, text, box):
    _, _, out, _ = by_transformers(folder, text, box, 0.0)
    threshold = split(out)
    done = vit.segment(sam3, picture(), text=text, box=box, threshold=threshold)
    _, _, out, kept = by_transformers(folder, text, box, threshold)
    if box is None or text is None:  # (text and box: this model scores every query alike, within 1e-4)
        assert 0 < len(done.scores) < 6  # some queries kept, not all: the threshold matters
    np.testing.assert_array_equal(done.scores, kept["scores"].numpy())
    np.testing.assert_array_equal(done.boxes, kept["boxes"].numpy())
    np.testing.assert_array_equal(done.masks, kept["masks"].bool().numpy())
    all_scores = (out.pred_logits.sigmoid() * out.presence_logits.sigmoid())[0].numpy()
    np.testing.assert_array_equal(all_scores[done.queries], done.scores)  # each instance's own query
    assert done.presence == pytest.approx(float(out.presence_logits.sigmoid()), abs=0)
    assert done.instance == int(np.argmax(done.scores)) and done.masks.shape[1:] == (70, 90)


def test_the_exemplar_box_is_read_as_x0_y0_x1_y1(sam3, folder):
    done = vit.segment(sam3, picture(), box=BOX, threshold=0.0)
    _, _, _, kept = by_transformers(folder, None, BOX, 0.0)
    np.testing.assert_array_equal(done.scores, kept["scores"].numpy())
    x0, y0, x1, y1 = BOX
    _, _, _, transposed = by_transformers(folder, None, (y0, x0, y1, x1), 0.0)
    assert not np.allclose(done.scores, transposed["scores"].numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("text, box", [(TEXT, None), (TEXT, BOX)], ids=["text", "both"])
def test_each_decoder_layers_attention_of_the_instance_is_output_attentions_placed_row_major(sam3, folder, text,
                                                                                            box):
    """``output_attentions`` gives each decoder layer's self, text and vision cross-attention in turn; the vision
    one's row 1 + query (row 0: the presence token) over the 8 x 8 grid's tokens, row-major."""
    done = vit.segment(sam3, picture(), text=text, box=box, threshold=0.0)
    _, _, out, _ = by_transformers(folder, text, box, 0.0, "eager")
    query = int(done.queries[done.instance])
    assert list(done.attention) == ["decoder layer 1", "decoder layer 2"]
    for layer in range(2):
        vision = out.detr_decoder_attentions[3 * layer + 2]
        assert vision.shape[-1] == (SIDE // PATCH) ** 2
        rows = vision[0, :, 1 + query].numpy()  # (heads, 64)
        mine = done.attention[f"decoder layer {layer + 1}"]
        np.testing.assert_allclose(mine, rows.reshape(2, 8, 8), rtol=0, atol=1e-5)
        assert not np.allclose(mine, rows.reshape(2, 8, 8).transpose(0, 2, 1), rtol=0, atol=1e-4)
    assert done.overlay("decoder layer 2", head=1).size == done.seen.size == (SIDE, SIDE)


def test_the_decoder_attention_comes_from_the_one_forward_that_found_the_instances(sam3):
    """Issue 116, item 12: the explained query's rows were recorded by a second run of the DETR encoder, decoder and
    mask decoder; every query's call is kept in the first now. Counted at each part's forward (the vision encoder
    once, as before); the rows are transformers' (the test above)."""
    model, ran = sam3.model, []
    parts = {"vision": model.vision_encoder, "encoder": model.detr_encoder, "decoder": model.detr_decoder,
             "mask decoder": model.mask_decoder}
    handles = [m.register_forward_hook(lambda *_, name=name: ran.append(name)) for name, m in parts.items()]
    try:
        done = vit.segment(sam3, picture(), text=TEXT, threshold=0.0)
    finally:
        for handle in handles:
            handle.remove()
    assert sorted(ran) == sorted(parts) and list(done.attention) == ["decoder layer 1", "decoder layer 2"]


def test_the_instances_gradient_x_input_is_autograds_by_hand(sam3, folder):
    done = vit.segment(sam3, picture(), text=TEXT, threshold=0.0, instance=0, methods=["gradient_x_input"])
    model, inputs, _, _ = by_transformers(folder, TEXT, None, 0.0)
    query = int(done.queries[0])
    x = inputs["pixel_values"].clone().requires_grad_(True)
    out = model(pixel_values=x, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    logits = out.pred_masks[0, query]
    logits[logits.detach() > 0].sum().backward()  # the mask: probability over 0.5
    want = (x.grad * x.detach()).sum(1)[0].numpy()
    np.testing.assert_allclose(done.maps["gradient_x_input"], want, rtol=1e-4, atol=1e-6)
    assert np.abs(want).max() > 0


def lxt_relevance(folder, query: int, monkeypatch) -> torch.Tensor:
    """lxt's AttnLRP of query ``query``'s mask logits (summed where > 0) on transformers' whole eager Sam3Model,
    lxt's rules patched in as its ``efficient`` module patches a generic model's classes: ``layer_norm_forward`` on
    ``torch.nn.LayerNorm``, ``non_linear_forward`` on every activation class, ``wrap_attention_forward`` on the
    modelling file's ``eager_attention_forward`` (every attention module's function); the masks' product (the mask
    embedder's output times the instance projection's) under the uniform rule with lxt's ``divide_gradient``."""
    import transformers.models.sam3.modeling_sam3 as modeling
    from transformers import activations

    from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward, wrap_attention_forward
    from tests.reference.lxt.rules import divide_gradient

    model, inputs, _, _ = by_transformers(folder, TEXT, None, 0.0, "eager")
    decoder = model.mask_decoder
    hooks = [m.register_forward_hook(lambda module, args, out: divide_gradient(out, 2))
             for m in (decoder.mask_embedder, decoder.instance_projection)]
    kinds = {type(m) for m in model.modules()
             if type(m).__module__ == activations.__name__ or isinstance(m, (torch.nn.GELU, torch.nn.ReLU))}
    try:
        with monkeypatch.context() as m:  # lxt patches classes; undone before ours runs
            m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
            for kind in kinds:
                m.setattr(kind, "original_forward", kind.forward, raising=False)
                m.setattr(kind, "forward", non_linear_forward)
            m.setattr(modeling, "eager_attention_forward", wrap_attention_forward(modeling.eager_attention_forward))
            x = inputs["pixel_values"].clone().requires_grad_(True)
            with torch.enable_grad():
                out = model(pixel_values=x, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
                logits = out.pred_masks[0, query]
                [grad] = torch.autograd.grad(logits[logits.detach() > 0].sum(), x)
    finally:
        for hook in hooks:
            hook.remove()
    return (x.detach() * grad).sum(dim=1)[0]


def test_the_instances_attnlrp_is_lxts_rules_on_the_librarys_model(sam3, folder, monkeypatch):
    done = vit.segment(sam3, picture(), text=TEXT, threshold=0.0, instance=0,
                       methods=["attnlrp", "gradient_x_input"])
    theirs = lxt_relevance(folder, int(done.queries[0]), monkeypatch)
    scale = float(theirs.abs().max())
    assert scale > 0 and done.maps["attnlrp"].shape == tuple(theirs.shape)
    assert np.abs(done.maps["attnlrp"] - theirs.numpy()).max() / scale <= 1e-5
    assert np.abs(done.maps["gradient_x_input"] - theirs.numpy()).max() / scale > 1e-2  # the rules changed the map
    assert done.overlay("attnlrp").size == done.seen.size  # drawn around 0 over the input


def test_the_seen_pixels_are_the_processors_input_undone(sam3, folder):
    done = vit.segment(sam3, picture(), text=TEXT, threshold=0.0)
    _, inputs, _, _ = by_transformers(folder, TEXT, None, 0.0)
    undone = ((inputs["pixel_values"][0] * 0.5 + 0.5) * 255).round().clamp(0, 255).byte().permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(np.asarray(done.seen), undone)


def test_saved_as_npz_and_png(sam3, tmp_path):
    done = vit.segment(sam3, picture(), text=TEXT, box=BOX, threshold=0.0)
    saved = np.load(done.save(tmp_path / "concept.npz"))
    assert {"scores", "boxes", "masks", "queries", "presence", "instance", "text", "box",
            "attention/decoder layer 1"} <= set(saved.files)
    assert str(saved["text"]) == TEXT and saved["box"].tolist() == list(BOX)
    assert done.save(tmp_path / "concept.png").stat().st_size > 0


def test_a_tokenizer_over_its_bound_is_refused_before_the_processor_reads_it(folder, tmp_path, monkeypatch):
    """Issue 114, finding 3: a SAM 3 whose tokenizer.json was 191 MB killed the server through a concept link (the
    text towers and VLMs refuse over 40 MB; SAM 3 read it unbounded). A sparse one of 41 MB: refused unread."""
    hostile = tmp_path / "sam3"
    shutil.copytree(folder, hostile)
    with open(hostile / "tokenizer.json", "wb") as f:
        f.truncate(41 * 2**20)  # sparse: its size alone is read
    monkeypatch.setattr(transformers.Sam3Processor, "from_pretrained", AssertionError)
    with pytest.raises(ValueError, match=r"is refused: its tokenizer.json is 41 MB, over the 40 MB such a file may "
                                         r"have \(Gemma 3's is 33 MB\)$") as e:
        vit.open_sam3(hostile)
    assert "\n" not in str(e.value)


def test_the_picker_lists_a_sam3_with_an_oversize_tokenizer_as_refused(folder, tmp_path):
    """The explorer's picker asks of a listed SAM 3 what its opener refuses first (its files' sizes), so a folder whose
    page would be refused is listed as refused in one line (issue 114, finding 3)."""
    from vit.app import catalog

    hostile = tmp_path / "sam3"
    shutil.copytree(folder, hostile)
    with open(hostile / "tokenizer.json", "wb") as f:
        f.truncate(191 * 2**20)  # the size, sparse
    entry = catalog.describe(catalog.Candidate(hostile, "hf-cache", "evil/sam3"), library_road=True)
    assert entry.error == f"{hostile} is refused: its tokenizer.json is 191 MB, over the 40 MB such a file may have " \
                          "(Gemma 3's is 33 MB)"


def test_a_method_asked_twice_is_drawn_once(sam3, monkeypatch):
    """Issue 114, finding 6: duplicates in ``methods=`` are merged (each was a backward pass)."""
    from vit.explain.methods import concepts

    ran, backward = [], concepts.gradient_x_input
    monkeypatch.setattr(concepts, "gradient_x_input", lambda *args, **kwargs: ran.append(1) or backward(*args,
                                                                                                        **kwargs))
    done = vit.segment(sam3, picture(), text=TEXT, threshold=0.0, methods=["gradient_x_input"] * 50)
    assert len(ran) == 1 and list(done.maps) == ["gradient_x_input"]


def test_the_weights_headers_are_read_once_on_open(folder, monkeypatch):
    """Issue 114: SAM 3's opener read every weights file's header twice (checked, then looked up against the model
    built on the meta device); once now, and the shapes looked up are those read. Counted where a header is read."""
    from vit import checkpoint
    from vit.sources import weights_files

    read, real = [], checkpoint.safetensors_shapes
    monkeypatch.setattr(weights_files, "safetensors_shapes", lambda path: read.append(path) or real(path))
    vit.open_sam3(folder)
    assert [p.name for p in read] == ["model.safetensors"], read


def test_an_absurd_weights_header_is_one_line(folder, tmp_path):
    """Issue 114, finding 6: a header declaring a 10^6 x 10^6 tensor came out as safetensors' raw SafetensorError."""
    hostile = tmp_path / "sam3"
    shutil.copytree(folder, hostile)
    raw = (hostile / "model.safetensors").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    name = next(key for key in header if key != "__metadata__")
    header[name]["shape"] = [10**6, 10**6]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (hostile / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length:])
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file \(tensor .*: its "
                                         r"data \(.*\) does not match its shape \[1000000, 1000000\]") as e:
        vit.open_sam3(hostile)
    assert "\n" not in str(e.value)


def test_what_sam3_does_not_take_is_one_line(sam3, folder, tmp_path):
    image = picture()
    cases = [
        (dict(points=[(3, 4)], text=TEXT), r"^SAM 3 segments a concept: give text= and / or an exemplar box="),
        (dict(), r"^give SAM 3 a concept: text="),
        (dict(text=" "), r"^a concept is a noun phrase of 1 to 200 characters"),
        (dict(text="dog " * 40), r"^the concept is \d+ tokens, more than the 32 SAM 3's text encoder reads"),
        (dict(text=TEXT, threshold=1.0), r"^threshold must be a number from 0 to below 1, got 1.0$"),
        (dict(text=TEXT, threshold=0.0, instance=6), r"^instance 6 is not one of the 6 kept"),
        (dict(text=TEXT, methods=["legrad"]), r"^no method 'legrad' for SAM 3's concepts; choose from "
                                              r"gradient_x_input, attnlrp$"),
        (dict(box=(0, 0, 200, 10)), r"box"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            vit.segment(sam3, image, **kwargs)
    config = json.loads((folder / "config.json").read_text())
    config["detr_decoder_config"]["num_queries"] = 5000
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"is refused: its decoder declares 5000 object queries, not 1 to 1024$"):
        vit.open_sam3(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "sam"}))
    with pytest.raises(ValueError, match=r"is a sam model, not SAM 3 \(transformers' Sam3Model\)"):
        vit.open_sam3(tmp_path)


def test_attnlrps_rule_hooks_leave_another_threads_gradient_map_as_it_was(sam3):
    """SAM 3's AttnLRP rules are hooks on the whole model's modules, which every session shares: while visitor A's
    rules are on, visitor B's gradient x input, computed in another thread, is its map alone."""
    import threading

    from vit.explain.methods.concepts import attnlrp_rules

    def gradient_map():
        return vit.segment(sam3, picture(), text=TEXT, threshold=0.0, instance=0,
                           methods=["gradient_x_input"]).maps["gradient_x_input"]

    alone, seen = gradient_map(), []
    with attnlrp_rules(sam3.model):  # A's rules on the model
        other = threading.Thread(target=lambda: seen.append(gradient_map()))
        other.start()
        other.join(120)
    assert seen, "B's map was computed while A's rules were on"
    np.testing.assert_array_equal(seen[0], alone)
