"""Sink diagnostics (``vit.explain.mechanism.sink_diagnostics``) against the authors' own code.

Reference: KempnerInstitute/attention_sink @ a83cd59, ``vit_causal/diagnose_heads.py`` ``collect_diagnostics`` and
``common.py`` ``event_class`` (MIT, kept in ``tests/reference/attention_sink``), run on the library's own model:
a tiny random transformers ViT and DINOv2 with registers, seen through the few attributes the authors' DINOv2 code
reads (``blocks``, ``norm1``, ``attn.qkv`` / ``proj`` / ``num_heads`` / ``scale``, ``ls1.gamma``,
``prepare_tokens_with_masks``), each block run by transformers itself. Ours runs on the same model opened by our
loader. Layer 0 is made to have a sink on the CLS token in both heads (its key favoured by a large query bias), head 0's
values blind to it (a NOP sink) and head 1's left as they are (a broadcast sink), so every verdict is exercised.
"""

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image
from torch import nn

import vit
from vit.core.inference import InputSize, preprocess
from vit.costs.bounds import ANALYSIS_MEMORY_ENV, TooManyTokens
from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism.sink_diagnostics import VERDICTS, sink_diagnostics, verdicts

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchvision")  # the authors' common.py imports it

HF_TINY = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=2)
AUTHORS_CLASS = {"none": "not a sink", "other": "other sink", "nop": "NOP sink", "broadcast": "broadcast sink"}
# ours -> the authors' per_image_diagnostics keys
KEYS = {"mass": "mass", "value_ratio": "ratio_out", "head_value_ratio": "ratio_head", "stable_rank": "stable_rank",
        "rank1_energy": "rank1_energy", "routed": "routed_frac", "update_norm": "update_norm",
        "value_norm": "sink_value_norm", "min_attention": "min_a"}


class LayerScale(nn.Module):
    def __init__(self, gamma: torch.Tensor | None) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, x):
        return x if self.gamma is None else x * self.gamma


class AuthorsAttention(nn.Module):
    """transformers' attention under the names ``common.attention_internals`` reads: q, k and v in one qkv."""

    def __init__(self, attention) -> None:
        super().__init__()
        self.num_heads, self.scale = attention.num_attention_heads, attention.scaling
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        self.qkv = nn.Linear(q.in_features, 3 * q.out_features)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            self.qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
        self.proj = attention.o_proj


class AuthorsBlock(nn.Module):
    def __init__(self, layer) -> None:
        super().__init__()
        self.layer = layer
        self.attn = AuthorsAttention(layer.attention)
        self.norm1 = getattr(layer, "norm1", None) or layer.layernorm_before
        self.norm2 = getattr(layer, "norm2", None) or layer.layernorm_after
        self.mlp = layer.mlp
        scales = [getattr(layer, f"layer_scale{i}", None) for i in (1, 2)]
        self.ls1, self.ls2 = (LayerScale(None if s is None else s.lambda1) for s in scales)

    def forward(self, x):  # transformers' own block
        return self.layer(x)


class AuthorsBackbone(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.embeddings = model.embeddings
        self.blocks = nn.ModuleList(AuthorsBlock(layer) for layer in layers(model))

    def prepare_tokens_with_masks(self, images):
        return self.embeddings(images)


def layers(model) -> nn.ModuleList:
    """The blocks: ``layers`` in transformers' ViT, ``encoder.layer`` in its DINOv2."""
    return model.layers if hasattr(model, "layers") else model.encoder.layer


def sink_on_cls(model, strength: float) -> None:
    """Layer 0: both heads' queries favour the CLS token's key (a query bias along it; CLS's layer-0 input is the
    same for every image), and head 0's values are blind to CLS's input (a NOP sink)."""
    layer = layers(model)[0]
    norm = getattr(layer, "norm1", None) or layer.layernorm_before
    attention = layer.attention
    hd = attention.head_dim
    with torch.no_grad():
        c = norm(model.embeddings(torch.zeros(1, 3, 32, 32))[0, 0])  # (D,): CLS's input to layer 0
        key = attention.k_proj(c)  # (H * hd,)
        for h in range(attention.num_attention_heads):
            k = key[h * hd:(h + 1) * hd]
            attention.q_proj.bias[h * hd:(h + 1) * hd] = strength * k / k.norm()
        v = attention.v_proj
        v.weight[:hd] -= torch.outer(v.weight[:hd] @ c, c) / c.dot(c)
        v.bias[:hd] = 0


def tiny(tmp_path, name: str, config_name: str, strength: float = 30.0, **options):
    config = getattr(transformers, config_name)(**HF_TINY, **options)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(getattr(transformers, name)(config))
    sink_on_cls(model, strength)
    model.save_pretrained(tmp_path)
    return model, vit.load(tmp_path, device="cpu")


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def authors(model, x: torch.Tensor):
    from reference.attention_sink.common import event_class
    from reference.attention_sink.diagnose_heads import collect_diagnostics

    arrays, sink_idx, _, errors = collect_diagnostics(AuthorsBackbone(model).eval(), [(x, torch.zeros(len(x)))],
                                                      len(x), torch.device("cpu"))
    assert max(errors.values()) < 1e-5  # their explicit block is transformers' block
    classes = event_class(arrays["routed_frac"], arrays["ratio_out"], arrays["stable_rank"])
    return arrays, sink_idx, np.vectorize(AUTHORS_CLASS.get)(classes)


@pytest.mark.parametrize("family", [
    ("ViTModel", "ViTConfig", {}),
    ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", dict(num_register_tokens=4, layerscale_value=0.5)),
], ids=["HF ViT", "HF DINOv2 with registers"])
def test_sink_diagnostics_equal_the_authors_diagnose_heads(tmp_path, family):
    name, config_name, options = family
    reference, checkpoint = tiny(tmp_path, name, config_name, **options)
    ours = checkpoint.model
    x = images()
    arrays, sink_idx, classes = authors(reference, x)
    with torch.no_grad():
        mine = sink_diagnostics(ours, mechanism.hidden_states(ours, x), (4, 4))
    np.testing.assert_array_equal(mine.token.numpy(), sink_idx)
    for key, theirs in KEYS.items():
        torch.testing.assert_close(getattr(mine, key), torch.from_numpy(arrays[theirs]), rtol=1e-5, atol=1e-6, msg=key)
    np.testing.assert_array_equal(mine.verdict, classes)
    # layer 0 as built: CLS the sink of both heads, head 0 a NOP, head 1 a broadcast; layer 1 no sink
    assert (mine.token[:, 0] == 0).all()
    assert list(mine.verdict[0, 0]) == ["NOP sink", "broadcast sink"]
    assert "not a sink" in mine.verdict[:, 1]


def test_verdicts_follow_the_authors_event_class_at_its_thresholds():
    from reference.attention_sink.common import event_class

    routed, ratio, rank = np.meshgrid([0.0, 0.89, 0.9, 1.0, np.nan], [0.0, 0.2, 0.21, 0.49, 0.5, 3.0],
                                      [1.0, 1.5, 1.51, 9.0, np.nan], indexing="ij")
    expected = np.vectorize(AUTHORS_CLASS.get)(event_class(routed, ratio, rank))
    np.testing.assert_array_equal(verdicts(routed, ratio, rank), expected)
    assert set(expected.flat) == set(VERDICTS)


def test_the_notebook_api_gives_one_row_per_layer_and_head_as_the_engine(tmp_path):
    _, checkpoint = tiny(tmp_path, "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", num_register_tokens=4,
                         layerscale_value=0.5)
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    table = vit.sinks(checkpoint, picture, size=48)
    x = preprocess([picture], checkpoint.preprocessing, InputSize(48), 8)  # 6 x 6 patches
    with torch.no_grad():
        expected = sink_diagnostics(checkpoint.model, mechanism.hidden_states(checkpoint.model, x), (6, 6))
    rows = table.rows()
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # from 0, as vit.ablate
    assert [r["verdict"] for r in rows] == list(expected.verdict[0].flat)
    for r in rows:  # a row's numbers index the engine's arrays as the API counts
        assert r["stable rank"] == pytest.approx(float(expected.stable_rank[0, r["layer"], r["head"]]), rel=1e-6)
    assert [(r["layer"], r["head"]) for r in table.rows(first=1)] == [(1, 1), (1, 2), (2, 1), (2, 2)]  # the page's
    assert (table.grid, table.num_prefix_tokens) == ((6, 6), 5)


def test_an_input_over_the_memory_limit_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch):
    _, checkpoint = tiny(tmp_path, "ViTModel", "ViTConfig")
    monkeypatch.setenv(ANALYSIS_MEMORY_ENV, "0.01")  # 10 kB: less than the hidden states of 17 tokens x 2 layers
    monkeypatch.setattr(mechanism, "hidden_states", lambda *a: pytest.fail("the forward ran before the refusal"))
    with pytest.raises(TooManyTokens) as refused:
        vit.sinks(checkpoint, Image.new("RGB", (32, 32)))
    message = str(refused.value)
    assert "\n" not in message
    assert "sink diagnostics need about" in message and ANALYSIS_MEMORY_ENV in message

