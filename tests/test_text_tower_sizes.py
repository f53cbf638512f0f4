"""Text towers are sized before they are built (issue 39, item 3): the declared model on the meta device, compared
with the weights file, refused in one line before a byte of it is allocated.

Each hostile file is tiny; what it declares would take tens of GB. The spies below stand in for the allocation:
they refuse to build the declared model anywhere but on the meta device, so a check that came too late fails
here instead of filling the machine's memory.
"""

import gzip
import json
from unittest import mock

import pytest
import torch
from test_prompts import HF_TEXT, HF_VISION, bpe_tokenizer_files, save_open_clip

from vit.sources.files import MAX_TOKENIZER_BYTES
from vit.sources.open import open_source
from vit.sources.vlm.text_tower import TextTowerError, open_text_tower

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # open_clip and transformers take seconds to import

HUGE_TEXT = dict(context_length=16, vocab_size=49408, width=8192, heads=64, layers=64)  # ~52 B parameters


def built_on_meta_only(cls):
    """A spy on ``cls.__init__``: the devices it was built on; building it anywhere but on meta raises."""
    devices, original = [], cls.__init__

    def init(self, *args, **kwargs):
        devices.append(torch.get_default_device().type)
        if devices[-1] != "meta":
            raise AssertionError(f"{cls.__name__} built on {devices[-1]} before its size was checked")
        original(self, *args, **kwargs)

    return devices, mock.patch.object(cls, "__init__", init)


def test_an_open_clip_config_declaring_a_huge_text_tower_is_refused_before_it_is_built(tmp_path):
    _, folder = save_open_clip(tmp_path / "clip")
    config = json.loads((folder / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"] = HUGE_TEXT
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    checkpoint = open_source(folder)  # the image side is the file's: it opens
    devices, spy = built_on_meta_only(open_clip.model.CLIP)
    with spy, pytest.raises(TextTowerError, match="declares a text tower of [0-9,]+ parameters") as error:
        open_text_tower(checkpoint)
    assert devices == ["meta"] and "\n" not in str(error.value)


def test_an_open_clip_config_naming_a_vocabulary_file_is_refused_before_open_clip_reads_it(tmp_path):
    """Issue 114, finding 5's kind: open_clip's tokenizer takes ``text_cfg.tokenizer_kwargs`` from the folder's
    ``open_clip_config.json``, and its ``bpe_path`` is a .gz ``SimpleTokenizer`` inflates whole, from anywhere on the
    server. Here 16 MB of zeros in a 16 KB file: read whole before, refused in one line now."""
    _, folder = save_open_clip(tmp_path / "clip")
    with gzip.open(folder / "vocab.txt.gz", "wb") as f:
        f.write(bytes(16 * 2**20))
    config = json.loads((folder / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"]["tokenizer_kwargs"] = {"bpe_path": str(folder / "vocab.txt.gz")}
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    checkpoint = open_source(folder)
    with mock.patch.object(gzip, "open", side_effect=AssertionError("read")), \
            pytest.raises(TextTowerError, match=r"names a vocabulary file \(text_cfg.tokenizer_kwargs.bpe_path\)") as e:
        open_text_tower(checkpoint)
    assert "\n" not in str(e.value)


def flat_openai_state(tmp_path):
    model, _ = save_open_clip(tmp_path / "clip")
    state = dict(model.state_dict())
    state.update(input_resolution=torch.tensor(32), context_length=torch.tensor(16), vocab_size=torch.tensor(49408))
    return state


def test_a_flat_openai_file_whose_tiny_tensors_declare_a_huge_tower_is_refused_before_it_is_built(tmp_path):
    state = flat_openai_state(tmp_path)
    state["ln_final.weight"] = torch.ones(4096)  # open_clip's reader takes the width from it
    for layer in range(64):  # ... and the depth from the block names
        state[f"transformer.resblocks.{layer}.ln_1.weight"] = torch.ones(4)
    torch.save(state, tmp_path / "ViT-B-16.pt")
    checkpoint = open_source(tmp_path / "ViT-B-16.pt", arch="open_clip:quickgelu")
    devices, spy = built_on_meta_only(open_clip.model.CLIP)
    # Its strict load on the meta device refuses it, the reason kept on the one line (it was cut off before it).
    reason = r"Error\(s\) in loading state_dict for CLIP: (Missing key|size mismatch)"
    with spy, pytest.raises(TextTowerError, match=reason) as error:
        open_text_tower(checkpoint)
    assert devices == ["meta"] and "\n" not in str(error.value)


def test_a_whole_flat_openai_file_still_opens_its_text_tower(tmp_path):
    torch.save(flat_openai_state(tmp_path), tmp_path / "ViT-B-16.pt")
    tower = open_text_tower(open_source(tmp_path / "ViT-B-16.pt", arch="open_clip:quickgelu"))
    assert tower.encode(["a dog"]).shape == (1, 16)


def hf_clip_folder(tmp_path):
    config = transformers.CLIPConfig(vision_config=HF_VISION, text_config=HF_TEXT, projection_dim=16)
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(tmp_path / "m")
    bpe_tokenizer_files(tmp_path / "m")
    return tmp_path / "m"


def test_an_hf_config_declaring_a_text_tower_its_file_does_not_hold_is_refused_before_from_pretrained(tmp_path,
                                                                                                     capfd):
    folder = hf_clip_folder(tmp_path)
    checkpoint = open_source(folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"].update(hidden_size=8192, num_hidden_layers=64, num_attention_heads=64)
    (folder / "config.json").write_text(json.dumps(config))
    devices, spy = built_on_meta_only(transformers.CLIPModel)
    with spy, mock.patch.object(transformers.CLIPModel, "from_pretrained", side_effect=AssertionError("allocated")), \
            pytest.raises(TextTowerError, match="declares a text tower of [0-9,]+ parameters") as error:
        open_text_tower(checkpoint)
    assert devices == ["meta"] and "\n" not in str(error.value)
    config["text_config"].update(hidden_size=64, num_hidden_layers=1, num_attention_heads=2)  # small, not the file's
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TextTowerError, match=r"declares text_model\..* of shape .* but the weights file holds"):
        open_text_tower(checkpoint)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err, "transformers' multi-line report came before our one line"


def test_a_tokenizer_file_over_the_bound_is_refused_before_it_is_read(tmp_path):
    folder = hf_clip_folder(tmp_path)
    checkpoint = open_source(folder)
    with open(folder / "tokenizer.json", "r+b") as file:
        file.truncate(MAX_TOKENIZER_BYTES + 1)  # sparse: no disk, and never read
    with mock.patch.object(transformers.AutoTokenizer, "from_pretrained", side_effect=AssertionError("read")), \
            pytest.raises(TextTowerError, match="tokenizer.json is 40 MB, over the 40 MB"):
        open_text_tower(checkpoint)


def test_a_config_transformers_refuses_is_one_line_saying_why(tmp_path):
    """Issue 114, finding 6: ``attn_implementation`` beside ``output_attentions`` is said as the other openers say it
    (``library_error_line``), its reason without huggingface_hub's "Class validation error for validator" prefix."""
    folder = hf_clip_folder(tmp_path)
    checkpoint = open_source(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(attn_implementation="sdpa", output_attentions=True)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TextTowerError, match=r"transformers cannot read its config \(its config is refused by "
                                             r"transformers \(The `output_attentions` attribute is not supported") as e:
        open_text_tower(checkpoint)
    assert "\n" not in str(e.value)


def test_the_tokenizer_is_read_once_per_model_not_each_time_a_tower_opens(tmp_path):
    checkpoint = open_source(hf_clip_folder(tmp_path))
    with mock.patch.object(transformers.AutoTokenizer, "from_pretrained",
                           side_effect=transformers.AutoTokenizer.from_pretrained) as read:
        first, second = open_text_tower(checkpoint), open_text_tower(checkpoint)
    assert read.call_count == 1
    torch.testing.assert_close(first.encode(["a dog"]), second.encode(["a dog"]))


@pytest.mark.parametrize("library", ["hf", "open_clip"])
def test_a_text_config_of_a_million_layers_is_refused_before_even_its_meta_model_is_built(tmp_path, library):
    """Building a layer on the meta device takes ~3.5 ms (a million: ~1 hour of a core, extrapolated from 5,000;
    issue 95): the layers are counted in the config first."""
    if library == "hf":
        folder, cls, name = hf_clip_folder(tmp_path), transformers.CLIPModel, "config.json"
        checkpoint = open_source(folder)
        config = json.loads((folder / name).read_text())
        config["text_config"]["num_hidden_layers"] = 10**6
    else:
        _, folder = save_open_clip(tmp_path / "clip")
        cls, name = open_clip.model.CLIP, "open_clip_config.json"
        checkpoint = open_source(folder)
        config = json.loads((folder / name).read_text())
        config["model_cfg"]["text_cfg"]["layers"] = 10**6
    (folder / name).write_text(json.dumps(config))
    never = mock.patch.object(cls, "__init__", side_effect=AssertionError("built before its layers were counted"))
    refused = pytest.raises(TextTowerError, match=r"declares 1,00\d,\d{3} layers in all, more than any model")
    with never, refused as error:
        open_text_tower(checkpoint)
    assert "\n" not in str(error.value)
