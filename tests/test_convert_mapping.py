"""Any other from-scratch ViT: the refusal says what the file looks like and the command that opens it;
``vit.convert --inspect`` drafts a mapping, ``--map`` applies it strictly and exactly (logits and attentions
equal to the model's own code), ``--verify`` compares with the user's class.

The reference model is the CIFAR-10 notebook's ``VisionTransformer``, built from the tutorial's code in the
shared seed-models folder (see tests/test_scratch_parity.py) and saved inside a wrapper module, so that its keys
(``net.encoder.0.attn.qkv.weight``) are no layout this program knows.
"""

import json

import pytest
import torch
from test_scratch_parity import SEEDS, assert_same, pytestmark, randomize, seed  # noqa: F401

from vit.checkpoint import load_checkpoint
from vit.convert import main
from vit.sources.open import SourceError, open_source


class Wrapper(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net


def notebook_model():
    return randomize(seed("seed004_cifar_vit").VisionTransformer(embed_dim=64, num_heads=4, depth=2))


def notebook_reference(model, images):
    """The notebook's logits and the probabilities its attention computes (they pass through attn_drop)."""
    attentions = []
    hooks = [block.attn.attn_drop.register_forward_hook(lambda m, a, out: attentions.append(out))
             for block in model.encoder]
    with torch.no_grad():
        logits = model(images)
    for hook in hooks:
        hook.remove()
    return logits, attentions


def inspected(capsys, path) -> tuple[dict, str]:
    assert main([str(path), "--inspect"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


def test_unknown_weights_are_refused_with_what_they_look_like_and_the_command_to_open_them(tmp_path):
    torch.save(Wrapper(notebook_model()).state_dict(), tmp_path / "mine.pt")
    with pytest.raises(SourceError) as error:
        open_source(tmp_path / "mine.pt")
    message = str(error.value)
    assert "a state dict of 32 tensors, a ViT with 2 blocks of width 64, keys like `net.encoder.0.attn.qkv.weight`" \
        in message
    assert f"python -m vit.convert {tmp_path / 'mine.pt'} --inspect" in message
    assert "\n" not in message and len(message) < 400


def test_inspect_drafts_the_mapping_and_map_converts_exactly(tmp_path, capsys):
    model = notebook_model()
    torch.save(Wrapper(model).state_dict(), tmp_path / "mine.pt")
    draft, described = inspected(capsys, tmp_path / "mine.pt")
    assert "2 blocks of width 64" in described
    assert draft["config"]["num_heads"] == "?"
    assert "?" not in draft["keys"].values()  # every key of this layout is guessed
    draft["config"]["num_heads"] = 4
    (tmp_path / "mapping.json").write_text(json.dumps(draft))
    assert main([str(tmp_path / "mine.pt"), "--map", str(tmp_path / "mapping.json"),
                 "--out", str(tmp_path / "ours.pt")]) == 0
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = load_checkpoint(tmp_path / "ours.pt").model(images, output_attentions=True)
    assert_same(ours, *notebook_reference(model, images))


def test_map_names_a_key_no_rule_matches(tmp_path, capsys):
    torch.save(Wrapper(notebook_model()).state_dict(), tmp_path / "mine.pt")
    draft, _ = inspected(capsys, tmp_path / "mine.pt")
    draft["config"]["num_heads"] = 4
    del draft["keys"]["^net\\.norm\\.bias$"]
    (tmp_path / "mapping.json").write_text(json.dumps(draft))
    assert main([str(tmp_path / "mine.pt"), "--map", str(tmp_path / "mapping.json"),
                 "--out", str(tmp_path / "ours.pt")]) == 2
    err = capsys.readouterr().err
    assert "net.norm.bias is matched by no rule" in err and err.count("\n") == 1
    assert not (tmp_path / "ours.pt").exists()


def test_map_names_a_shape_that_does_not_fit(tmp_path, capsys):
    torch.save(Wrapper(notebook_model()).state_dict(), tmp_path / "mine.pt")
    draft, _ = inspected(capsys, tmp_path / "mine.pt")
    draft["config"].update(num_heads=4, mlp_size=128)  # the notebook's MLP is 256 wide
    (tmp_path / "mapping.json").write_text(json.dumps(draft))
    assert main([str(tmp_path / "mine.pt"), "--map", str(tmp_path / "mapping.json"),
                 "--out", str(tmp_path / "ours.pt")]) == 2
    assert "net.encoder.0.mlp.0.weight has shape (256, 64), which does not fit blocks.0.mlp.fc1.weight (128, 64)" \
        in capsys.readouterr().err


def test_verify_compares_with_the_users_own_class(tmp_path, capsys, monkeypatch):
    torch.save(notebook_model().state_dict(), tmp_path / "vit.pt")
    monkeypatch.chdir(SEEDS)  # --verify imports the user's module from the current folder
    assert main([str(tmp_path / "vit.pt"), "--arch", "scratch:num_heads=4", "--out", str(tmp_path / "ours.pt"),
                 "--verify", "seed004_cifar_vit:VisionTransformer",
                 "--verify-args", json.dumps({"embed_dim": 64, "num_heads": 4, "depth": 2})]) == 0
    report = json.loads(capsys.readouterr().out)["verify"]
    assert report["max_logit_difference"] < 1e-5
    assert report["max_attention_difference"] is None  # the notebook's forward returns no attentions


def test_verify_compares_attentions_when_the_users_forward_returns_them(tmp_path, capsys, monkeypatch):
    from test_scratch_parity import TINTN_CONFIG, tintn_experiment

    folder, _ = tintn_experiment(tmp_path, faster=True)
    monkeypatch.chdir(SEEDS)
    config = {**TINTN_CONFIG, "use_faster_attention": True}
    assert main([str(folder), "--out", str(tmp_path / "ours.pt"), "--verify", "seed000_tintn_vit:ViTForClassfication",
                 "--verify-args", json.dumps({"config": config})]) == 0
    report = json.loads(capsys.readouterr().out)["verify"]
    assert report["max_logit_difference"] < 1e-5 and report["max_attention_difference"] < 1e-5


def hf_vit():
    """HF transformers' ViT: separate query / key / value layers with biases, the layout most hand-written ViTs have
    (as a bare state dict, the keys are no layout this program opens)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                                    image_size=32, patch_size=8, num_labels=10)
    config._attn_implementation = "eager"  # the path that returns attention probabilities
    return randomize(transformers.ViTForImageClassification(config)).eval()


def test_separate_q_k_v_layers_are_drafted_as_thirds_and_stacked_exactly(tmp_path, capsys):
    model = hf_vit()
    torch.save(model.state_dict(), tmp_path / "mine.pt")
    draft, _ = inspected(capsys, tmp_path / "mine.pt")
    keys = draft["keys"]
    assert {f"blocks.\\1.attn.qkv.{kind}:{role}" for kind in ("weight", "bias") for role in "qkv"} <= set(keys.values())
    assert "?" not in keys.values()
    assert draft["config"]["qkv_bias"] is True
    assert "layer_norm_eps" in draft["guessed"] and "image_size" in draft["guessed"]
    draft["config"].update(num_heads=4, layer_norm_eps=1e-12)  # HF's eps, as "guessed" tells the user to check
    (tmp_path / "mapping.json").write_text(json.dumps(draft))
    assert main([str(tmp_path / "mine.pt"), "--map", str(tmp_path / "mapping.json"),
                 "--out", str(tmp_path / "ours.pt")]) == 0
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        theirs = model(pixel_values=images, output_attentions=True)
        ours = load_checkpoint(tmp_path / "ours.pt").model(images, output_attentions=True)
    assert_same(ours, theirs.logits, list(theirs.attentions))


def test_map_names_a_missing_third_of_qkv(tmp_path, capsys):
    torch.save(hf_vit().state_dict(), tmp_path / "mine.pt")
    draft, _ = inspected(capsys, tmp_path / "mine.pt")
    draft["config"]["num_heads"] = 4
    key_rule = next(rule for rule, target in draft["keys"].items() if target == "blocks.\\1.attn.qkv.weight:k")
    draft["keys"][key_rule] = None
    (tmp_path / "mapping.json").write_text(json.dumps(draft))
    assert main([str(tmp_path / "mine.pt"), "--map", str(tmp_path / "mapping.json"),
                 "--out", str(tmp_path / "ours.pt")]) == 2
    err = capsys.readouterr().err
    assert "no key is mapped to blocks.0.attn.qkv.weight:k" in err and err.count("\n") == 1


def test_verify_names_the_keys_and_shapes_that_differ_in_one_line(tmp_path, capsys, monkeypatch):
    torch.save(notebook_model().state_dict(), tmp_path / "vit.pt")
    monkeypatch.chdir(SEEDS)
    assert main([str(tmp_path / "vit.pt"), "--arch", "scratch:num_heads=4", "--out", str(tmp_path / "ours.pt"),
                 "--verify", "seed004_cifar_vit:VisionTransformer",
                 "--verify-args", json.dumps({"embed_dim": 64, "num_heads": 4, "depth": 3, "num_classes": 5})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the weights do not fit it: they lack encoder.2." in err
    assert "mlp_head.0.weight is (10, 64) in the weights, (5, 64) in it" in err
    assert not (tmp_path / "ours.pt").exists()


def test_verify_says_when_the_users_forward_fails_at_our_image_size(tmp_path, capsys, monkeypatch):
    torch.save(notebook_model().state_dict(), tmp_path / "vit.pt")
    (tmp_path / "mine.py").write_text(  # a user's model that crops its input: it fails inside its own forward
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('notebook', {str(SEEDS / 'seed004_cifar_vit.py')!r})\n"
        "notebook = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(notebook)\n"
        "class Cropping(notebook.VisionTransformer):\n"
        "    def forward(self, x):\n        return super().forward(x[..., :16, :16])\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(tmp_path / "vit.pt"), "--arch", "scratch:num_heads=4", "--out", str(tmp_path / "ours.pt"),
                 "--verify", "mine:Cropping", "--verify-args", json.dumps({"embed_dim": 64, "num_heads": 4,
                                                                           "depth": 2})]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--verify mine:Cropping: its forward fails on 3x32x32 images, the size the weights give ours " \
           "(RuntimeError: The size of tensor a" in err


def test_inspect_says_when_the_program_already_opens_the_weights(tmp_path, capsys):
    from test_scratch_parity import tintn_experiment

    folder, _ = tintn_experiment(tmp_path, faster=True)
    for source in (folder, folder / "model_final.pt"):
        assert main([str(source), "--inspect"]) == 0
        out, err = capsys.readouterr()
        assert out == "" and f"{source} already opens as scratch:tintn, with no mapping" in err
