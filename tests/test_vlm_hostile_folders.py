"""A VLM's own files are counted before anything of it is built (issue 95, item 2): a hostile folder in the server's
HF cache, which a visitor without the token may ask, is refused in one line before the tower, the processor or the
model is built (each build is made to fail here, so a refusal after one fails the test, in milliseconds); its chat
template is rendered in a bounded child process, never in ours.

Measured on 2 busy cores, asking each hostile folder in a fresh process (``vit.ask_vlm``), before and after:
a text config of 10^6 layers ran past 40 s (refused in 5 s, the process at 554 MB, its imports); InternVL's
``max_patches`` 10^6 ran past 40 s (5 s); ``num_additional_image_tokens`` 10^8 grew the process to 2.1 GB in 13 s
(5 s, 554 MB); Qwen's ``min_pixels`` 2^26 to 1.5 GB in 14 s (5 s); ``{{ 'x' * 10**10 }}`` ran past 40 s (refused in
15 s at 796 MB, the model opened); three nested ``range(100000)`` ran past 40 s (the child killed at 20 s).

The folders are the tiny random VLMs of ``test_vlm_answer`` (saved whole with their processor), each edited to one
hostile value.
"""

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, picture, saved_whole  # noqa: E402

import vit  # noqa: E402
from vit.explain.language import chat_template  # noqa: E402
from vit.explain.language.chat_template import ChatTemplateError  # noqa: E402
from vit.sources.vlm.whole_vlm import VLMError  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``{kind: folder}``: tiny random VLMs saved whole with their processor."""
    return saved_whole(tmp_path_factory, ["llava", "internvl", "qwen2_5_vl", "llava_next", "gemma3", "glm4v"])


def hostile(base, tmp_path, kind: str, file: str, edit) -> str:
    """A copy of ``kind``'s folder whose ``file`` (JSON) ``edit`` changed in place."""
    folder = tmp_path / f"hostile_{kind}"
    shutil.copytree(base[kind], folder)
    values = json.loads((folder / file).read_text())
    edit(values)
    (folder / file).write_text(json.dumps(values))
    return str(folder)


@pytest.fixture
def nothing_built(monkeypatch):
    """Every way a VLM is built fails the test: our tower, transformers' processor and model."""
    import vit.sources.open

    def built(*args, **kwargs):
        raise AssertionError("the folder was built before its declared sizes were counted")

    monkeypatch.setattr(vit.sources.open, "open_source", built)
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", built)
    for name in ("LlavaForConditionalGeneration", "InternVLForConditionalGeneration",
                 "Qwen2_5_VLForConditionalGeneration", "LlavaNextForConditionalGeneration",
                 "Gemma3ForConditionalGeneration", "Glm4vForConditionalGeneration"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", built)


def refused(folder: str, match: str) -> str:
    with pytest.raises(VLMError, match=match) as refusal:
        vit.open_vlm(folder)
    message = str(refusal.value)
    assert "\n" not in message and message.startswith(f"{folder} is refused: ")
    return message


def test_a_text_config_of_a_million_layers_is_refused_before_it_is_built(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "llava", "config.json",
                     lambda c: c["text_config"].update(num_hidden_layers=10**6))
    refused(folder, r"declares 1,000,003 layers in all, more than any model this program opens")


def test_a_text_config_of_more_layers_than_any_language_model_is_refused(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "llava", "config.json", lambda c: c["text_config"].update(num_hidden_layers=300))
    refused(folder, r"declares a language model of 300 layers; at most 256 are built")


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 200), ("hidden_size", 10**6),
                                              ("intermediate_size", 10**9), ("vocab_size", 10**9)])
def test_a_text_config_wider_than_its_weights_is_refused_before_it_is_built(base, tmp_path, nothing_built, field,
                                                                            value):
    """Building it would allocate what the weights files do not hold (transformers fills missing weights at random):
    its parameters at least, counted from the config, against every tensor in the files' headers."""
    folder = hostile(base, tmp_path, "llava", "config.json", lambda c: c["text_config"].update({field: value}))
    refused(folder, r"declares a language model of at least [\d,]+ parameters, but its weights files hold [\d,]+ "
                    r"in all: the config does not describe these weights$")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("hidden_size", 10**5, r"declares a vision tower of at least [\d,]+ parameters, but its weights files hold [\d,]+ "
                           r"in all: the config does not describe these weights$"),
    ("depth", 10**6, r"declares 1,000,\d{3} layers in all, more than any model this program opens"),
    ("patch_size", 0, r"its processor_config.json sets video_processor.patch_size = 14 but its vision tower's "
                      r"patch_size is 0"),
    # transformers' config refuses the field's type (huggingface_hub's strict dataclass): one line all the same
    ("spatial_merge_size", "2", r"its config.json's language model cannot be read \(.*spatial_merge_size")])
def test_a_tower_no_port_reads_is_counted_from_its_config_before_it_is_built(base, tmp_path, nothing_built, field,
                                                                           value, match):
    """GLM-4.1V's tower is built by transformers from the config alone (no port reads it): its declared sizes are
    whole numbers and its parameters at least are held by the weights files, checked before anything is built."""
    folder = hostile(base, tmp_path, "glm4v", "config.json", lambda c: c["vision_config"].update({field: value}))
    refused(folder, match)


def test_internvls_million_tiles_are_refused_before_its_processor_loops(base, tmp_path, nothing_built):
    """``max_patches`` 10^6: transformers' processor (and ``get_optimal_tiled_canvas``) walk every aspect ratio of
    up to that many tiles, 10^12 steps."""
    folder = hostile(base, tmp_path, "internvl", "processor_config.json",
                     lambda c: c["image_processor"].update(max_patches=10**6, crop_to_patches=True))
    refused(folder, r"sets image_processor.max_patches = 1,000,000: an image cut into that many tiles; at most 64")


def test_a_hundred_million_additional_image_tokens_are_refused_before_the_prompt_grows(base, tmp_path,
                                                                                         nothing_built):
    folder = hostile(base, tmp_path, "llava", "processor_config.json",
                     lambda c: c.update(num_additional_image_tokens=10**8))
    refused(folder, r"sets num_additional_image_tokens = 100,000,000 image tokens; at most 4,096 a view")


def test_gemmas_image_tokens_per_image_are_counted(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "gemma3", "processor_config.json", lambda c: c.update(image_seq_length=10**8))
    refused(folder, r"sets image_seq_length = 100,000,000 image tokens")


def test_a_processor_of_other_patches_than_its_tower_is_refused(base, tmp_path, nothing_built):
    """LLaVA's processor counts an image's tokens with its own patch size: 1 px made every pixel a token."""
    folder = hostile(base, tmp_path, "llava", "processor_config.json", lambda c: c.update(patch_size=1))
    refused(folder, r"sets patch_size = 1 but its vision tower's patch_size is 8")


def test_a_canvas_of_a_million_tiles_is_refused(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "llava_next", "processor_config.json",
                     lambda c: c["image_processor"].update(image_grid_pinpoints=[[32, 64], [32000, 32000]]))
    refused(folder, r"image_grid_pinpoints to a 32,000x32,000-px canvas, 1,000,000 tiles of 32 px; at most 64")


def test_qwens_least_pixels_past_a_views_tokens_are_refused(base, tmp_path, nothing_built):
    """Every image, the smallest too, is resized to at least ``min_pixels``: 2^26 grew a 90 x 70 image to 1.5 GB."""
    folder = hostile(base, tmp_path, "qwen2_5_vl", "processor_config.json",
                     lambda c: c["image_processor"].update(min_pixels=2**26, size={"shortest_edge": 2**26,
                                                                                   "longest_edge": 2**26}))
    refused(folder, r"resizes every image to at least 67,108,864 pixels \(min_pixels\), 85,598 image tokens")


@pytest.mark.parametrize("flag", ["output_attentions", "output_hidden_states", "output_scores", "output_logits"])
def test_a_generation_config_that_keeps_every_steps_attention_is_refused(base, tmp_path, nothing_built, flag):
    folder = hostile(base, tmp_path, "llava", "generation_config.json",
                     lambda c: c.update({flag: True, "return_dict_in_generate": True}))
    refused(folder, rf"generation_config.json sets {flag} = True, which keeps every layer's")


def test_a_config_that_keeps_every_layers_attention_is_refused(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "llava", "config.json", lambda c: c["text_config"].update(output_attentions=True))
    refused(folder, r"its config.json sets text_config.output_attentions = True")


@pytest.mark.parametrize(("setting", "message"), [({"num_return_sequences": 8}, "asks for 8 answers at once"),
                                                  ({"guidance_scale": 3.0}, "sets guidance_scale"),
                                                  ({"prompt_lookup_num_tokens": 10}, "sets prompt_lookup_num_tokens")])
def test_a_generation_config_that_generates_otherwise_than_counted_is_refused(base, tmp_path, nothing_built,
                                                                              setting, message):
    folder = hostile(base, tmp_path, "llava", "generation_config.json", lambda c: c.update(setting))
    refused(folder, message)


def test_a_huge_generation_config_is_refused_unread(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "llava", "generation_config.json",
                     lambda c: c.update(bad_words_ids=[[7]] * 2_000_000))
    refused(folder, r"its generation_config.json is \d+ MB, over the 4 MB such a file may have \(a few kB\)$")


def test_a_huge_tokenizer_is_refused_unread(base, tmp_path, nothing_built):
    folder = tmp_path / "hostile_tokenizer"
    shutil.copytree(base["llava"], folder)
    with open(folder / "tokenizer.json", "r+b") as f:
        f.truncate(41 * 2**20)  # sparse: its size alone is read
    refused(str(folder), r"its tokenizer.json is 41 MB, over the 40 MB such a file may have \(Gemma 3's is 33 MB\)$")


# --- the chat template -------------------------------------------------------------------------------------------

def with_template(base, tmp_path, template: str) -> str:
    folder = tmp_path / "hostile_template"
    shutil.copytree(base["llava"], folder)
    (folder / "chat_template.jinja").write_text(template)
    return str(folder)


@pytest.fixture
def rendered_here(monkeypatch):
    """The processor's own rendering, in this process, fails the test."""
    def here(*args, **kwargs):
        raise AssertionError("the chat template was rendered in the server's process")

    monkeypatch.setattr(transformers.ProcessorMixin, "apply_chat_template", here)


def test_the_bounded_rendering_is_the_processors_own(base):
    vlm = vit.open_vlm(base["llava"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    expected = vlm.processor.apply_chat_template(messages, add_generation_prompt=True)
    assert chat_template.render(vlm.processor, messages) == expected == f"user: <image> {QUESTION} assistant: "


def test_every_rendering_is_a_child_of_one_server_that_imported_transformers_once(base):
    """A fresh interpreter per rendering spent 1.3 s of CPU importing transformers, at every new question."""
    vlm = vit.open_vlm(base["llava"])
    servers = []
    for question in ("a first question", "a second question"):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        assert chat_template.render(vlm.processor, messages) == vlm.processor.apply_chat_template(
            messages, add_generation_prompt=True)
        servers.append(chat_template._server._process.pid)
    assert servers[0] == servers[1]
    with open(f"/proc/{servers[0]}/cmdline", "rb") as f:
        assert chat_template._IMPORTS.encode() in f.read()


def test_a_template_that_builds_ten_gigabytes_is_refused_in_one_line(base, tmp_path, rendered_here):
    vlm = vit.open_vlm(with_template(base, tmp_path, "{{ 'x' * 10**10 }}<image>"))
    with pytest.raises(ChatTemplateError, match=r"^the model's chat template took more than the 256 MB a template "
                                                r"may take; fix its chat_template, or give prompt="):
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=2)


def test_a_chat_template_with_no_video_entry_is_one_line_saying_it_cannot_take_a_clip(base, tmp_path):
    """Qwen2.5-VL's template with its video entry taken out writes nothing for the clip: one line saying so, not
    transformers' "The total number of <|video_pad|> tokens in the prompts should be ..."."""
    folder = tmp_path / "no_video_entry"
    shutil.copytree(base["qwen2_5_vl"], folder)
    for name in ("chat_template.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% for c in m.content %}{% if c.type == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}"
        "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    vlm = vit.open_vlm(folder)
    frames = [picture(), picture().rotate(3)]
    with pytest.raises(ChatTemplateError, match=r"^this model's chat template cannot take a clip: it writes nothing "
                                                r"for a video \(no <\|video_pad\|> in its prompt\); ask about "
                                                r"images instead$"):
        vit.ask_vlm(vlm, video=frames, question=QUESTION, frames=2, max_new_tokens=2)
    assert vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=1).tokens  # its images still asked


def test_a_template_that_loops_without_end_is_stopped_in_time(base, tmp_path, rendered_here, monkeypatch):
    """Three nested ``range(100000)``: the sandbox bounds each range, not their product (10^15 steps)."""
    monkeypatch.setattr(chat_template, "TEMPLATE_SECONDS", 4)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
    vlm = vit.open_vlm(with_template(base, tmp_path, loops + "{% endfor %}{% endfor %}{% endfor %}<image>"))
    with pytest.raises(ChatTemplateError, match=r"^the model's chat template ran past 4 s of CPU without giving a "
                                                r"prompt"):
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=2)


def test_a_child_slowed_by_a_busy_machine_still_renders_a_correct_template(base, monkeypatch):
    """The bound is the child's CPU, not the clock: a child that waits 3 s (as one starved of the cores waits for its
    imports) renders under a bound of 1 s of CPU, where a wall clock of 1 s refused it."""
    monkeypatch.setattr(chat_template, "TEMPLATE_SECONDS", 1)
    monkeypatch.setattr(chat_template, "_CHILD", "import time\ntime.sleep(3)\n" + chat_template._CHILD)
    vlm = vit.open_vlm(base["llava"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a slow machine"}]}]
    assert chat_template.render(vlm.processor, messages) == vlm.processor.apply_chat_template(
        messages, add_generation_prompt=True)


def test_a_template_that_gives_a_long_prompt_is_refused(base, tmp_path, rendered_here):
    vlm = vit.open_vlm(with_template(base, tmp_path, "{{ 'x' * 10**6 }}<image>"))
    with pytest.raises(ChatTemplateError, match=r"gives a prompt of 1,000,007 characters, more than the 100,000"):
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=2)


def test_a_template_that_fails_is_refused_in_one_line(base, tmp_path, rendered_here):
    vlm = vit.open_vlm(with_template(base, tmp_path, "{{ raise_exception('no images here') }}"))
    with pytest.raises(ChatTemplateError, match=r"^the model's chat template fails: TemplateError: no images here; "):
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=2)


@pytest.mark.parametrize(("template", "error"), [
    ("{% set kept = [] %}{{ kept.append(1) }}<image>", "SecurityError: access to attribute 'append' of 'list' object"),
    ("{% for m in messages %}<image>", "TemplateSyntaxError: Unexpected end of template"),
])
def test_a_template_the_sandbox_refuses_or_that_does_not_parse_is_one_line_in_the_api_and_the_cli(
        base, tmp_path, rendered_here, capsys, template, error):
    """jinja's sandbox (an immutable list changed) and parser raise their own errors, of several lines for a syntax
    error (the template's line under the message): each is the one line of a ChatTemplateError, which the CLI
    prints as the image's one line and the explorer as its error (a ValueError, as every refusal of ``prepare``)."""
    from vit.predict import main

    folder = with_template(base, tmp_path, template)
    with pytest.raises(ChatTemplateError, match=rf"^the model's chat template fails: {error}") as refusal:
        vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=2)
    assert "\n" not in str(refusal.value) and "give prompt=" in str(refusal.value)
    picture().save(tmp_path / "photo.png")
    capsys.readouterr()
    assert main([folder, str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "2",
                 "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"chat template fails: {error}" in err and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "chat template" in line] == err.strip().splitlines()[-1:], err


# --- the weights -------------------------------------------------------------------------------------------------

def with_weights(base, tmp_path, kind: str, edit) -> str:
    """A copy of ``kind``'s folder whose weights ``edit`` changed (``{name: tensor}`` in, out), shard by shard, and
    its index rewritten to list what the shards then hold."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / f"weights_{kind}"
    shutil.copytree(base[kind], folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    held = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors = edit(load_file(folder / shard))
        save_file(tensors, folder / shard, metadata={"format": "pt"})
        held.update(dict.fromkeys(tensors, shard))
    index["weight_map"] = held
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(folder)


def test_a_folder_without_its_language_models_layers_is_refused_instead_of_answering_with_random_ones(base, tmp_path):
    """Issue 95, item 6: every layer of the language model left out of the shards (its embeddings and head kept, so
    the files still hold more parameters than the config declares at least); transformers filled them at random and
    the model answered without a word said."""
    folder = with_weights(base, tmp_path, "llava", lambda tensors: {
        name: t for name, t in tensors.items() if not name.startswith("language_model.model.layers.")})
    message = refused(folder, r"its weights files lack 18 of the model's weights, 18 of them the language model's "
                              r"\(model\.language_model\.layers\.0\.")
    assert message.endswith("copy every weights file of the model into the folder (model.safetensors, or each shard "
                            "model.safetensors.index.json names)")


def test_a_language_model_without_attention_layers_is_refused_naming_what_the_answer_reads():
    """The refusal names every kind of layer the answer can read (a self_attn, a token mixer asking the interface,
    a cross-attention), not only the self_attn modules it once named."""
    import types

    import torch

    from vit.sources.vlm.whole_vlm import attention_problem

    stack = torch.nn.Module()
    stack.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    wrong = attention_problem(types.SimpleNamespace(model=torch.nn.Module(), language_model=stack))
    assert "self-attention" in wrong and "token mixer" in wrong and "cross-attention" in wrong, wrong
    assert "\n" not in wrong


def test_weights_of_another_size_than_the_config_are_one_line_in_the_api_and_the_cli(base, tmp_path, capsys):
    """transformers' own refusal is a RuntimeError ("You set `ignore_mismatched_sizes` to `False`, thus raising an
    error. For details look at the above report!"), which reached the explorer as a traceback."""
    from vit.predict import main

    shrunk = "language_model.model.layers.0.mlp.down_proj.weight"
    folder = with_weights(base, tmp_path, "llava", lambda tensors: {
        name: t[:-1] if name == shrunk else t for name, t in tensors.items()})
    refused(folder, r"its weights do not match its config.json \(size mismatch for model\.language_model\.layers\.0\."
                    r"mlp\.down_proj\.weight: \(31, 48\) in the weights, \(32, 48\) in the config\); give the folder "
                    r"the config.json saved with these weights$")
    picture().save(tmp_path / "photo.png")
    capsys.readouterr()
    assert main([folder, str(tmp_path / "photo.png"), "--ask", QUESTION, "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1 and "size mismatch for model.language_model.layers.0.mlp.down_proj.weight" in lines[0], lines


def test_a_question_asked_again_renders_no_second_child_but_a_late_one_is_tried_again(base, tmp_path, monkeypatch):
    """The explorer prepares the question at each rerun: its rendering is kept; one stopped by the wall clock is not
    (a busy machine may have slowed the child)."""
    children = []
    run = chat_template._server.run
    monkeypatch.setattr(chat_template._server, "run", lambda *a, **k: children.append(1) or run(*a, **k))
    vlm = vit.open_vlm(base["llava"])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a question kept"}]}]
    assert chat_template.render(vlm.processor, messages) == chat_template.render(vlm.processor, messages)
    assert len(children) == 1
    monkeypatch.setattr(chat_template, "TEMPLATE_WALL_SECONDS", 0.001)
    late = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a question too late"}]}]
    for _ in range(2):
        with pytest.raises(ChatTemplateError, match=r"gave no prompt within 0.001 s \(this machine may be too busy"):
            chat_template.render(vlm.processor, late)
    assert len(children) == 3


def test_qwens_most_pixels_past_its_published_bound_are_refused(base, tmp_path, nothing_built):
    folder = hostile(base, tmp_path, "qwen2_5_vl", "processor_config.json",
                     lambda c: c["image_processor"].update(max_pixels=2**26, size={"shortest_edge": 3136,
                                                                                   "longest_edge": 2**26}))
    refused(folder, r"resizes an image to up to 67,108,864 pixels \(max_pixels\), 85,598 image tokens; at most 16,384")


@pytest.mark.parametrize(("file", "edit", "message"), [
    ("processor_config.json", lambda c: c["image_processor"].update(image_grid_pinpoints=[[float("inf"), 32]]),
     r"its processor_config.json sets image_processor.image_grid_pinpoints = inf, which is no size"),
    ("config.json", lambda c: c["text_config"].update(num_hidden_layers=float("nan")),
     r"its config.json sets text_config.num_hidden_layers = nan, which is no size"),
    ("generation_config.json", lambda c: c.update(max_length=float("inf")), r"sets max_length = inf"),
])
def test_a_size_that_is_no_number_is_refused_in_one_line(base, tmp_path, nothing_built, file, edit, message):
    """JSON as Python reads it allows NaN and infinities, which no size is (``math.ceil(inf)`` raised)."""
    refused(hostile(base, tmp_path, "llava_next", file, edit), message)

