"""The tower's widest steps in bounded memory (``vit.core.lean_tower``): each lean forward equals the library
module's own forward (timm's inverted-residual blocks, PyTorch's convolutions), the strips hold no activation wider
than their budget, a merger runs no convolution (whose weight copy set GLM-4.1V's peak), everything else runs its
own forward, and a VLM opened by ``vit.open_vlm`` answers through them with every token and map still transformers'
eager ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from timm.layers import GELUTanh, RmsNorm2d, SqueezeExcite
from timm.models._efficientnet_blocks import EdgeResidual, UniversalInvertedResidual
from torch import nn
from torch.overrides import TorchFunctionMode

import vit
from vit.core import lean_tower

sys.path.insert(0, str(Path(__file__).parent))
from test_vlm_answer import (  # noqa: E402
    ATOL,
    LAYOUT,
    NEW_TOKENS,
    QUESTION,
    by_hand,
    eager_image_rows,
    picture,
    processor_inputs,
    saved_whole,
)


def _noisy(module: nn.Module, seed: int = 0) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module.eval()


def _blocks():
    common = dict(act_layer=GELUTanh, norm_layer=RmsNorm2d, layer_scale_init_value=1.0)
    return {
        # MobileNetV5's stage openers: a "same"-padded 5 x 5 depthwise conv of stride 2 after a 3 x 3 one
        "uir, same, stride 2": UniversalInvertedResidual(8, 12, dw_kernel_size_start=3, dw_kernel_size_mid=5, stride=2,
                                                         exp_ratio=6, pad_type="same", **common),
        "uir, static, stride 1, skip": UniversalInvertedResidual(8, 8, dw_kernel_size_start=5, dw_kernel_size_mid=3,
                                                                 dw_kernel_size_end=3, exp_ratio=4, **common),
        "uir, no depthwise": UniversalInvertedResidual(8, 8, dw_kernel_size_mid=0, exp_ratio=2, **common),
        "er, same, stride 2": EdgeResidual(8, 12, exp_kernel_size=3, stride=2, exp_ratio=4, pad_type="same",
                                           act_layer=GELUTanh, norm_layer=RmsNorm2d),
        "er, batch norm, skip": EdgeResidual(8, 8, exp_kernel_size=3, exp_ratio=4, act_layer=nn.ReLU),
    }


class _Calls(TorchFunctionMode):
    """The names of the torch functions run inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(_blocks()))
@pytest.mark.parametrize("size", [(37, 29), (36, 30), (7, 5)])
def test_a_blocks_strips_equal_timms_own_forward_and_hold_no_wider_activation_than_the_budget(name, size):
    block = _noisy(_blocks()[name])
    x = torch.randn(1, 8, *size, generator=torch.Generator().manual_seed(1))
    chain = lean_tower.steps(block)
    assert chain is not None
    budget = 8 * 4 * 16  # 16 pixels of 8 channels: a strip of a row or two
    widest, norms = [], [m for m in chain if not isinstance(m, nn.Conv2d)]
    hooks = [m.register_forward_hook(lambda mod, args, out: widest.append(out.numel() * out.element_size()))
             for m in norms]
    with torch.no_grad():
        own = block(x)
        widest.clear()
        lean = lean_tower.strip_forward(block, chain, x, budget=budget)
    for hook in hooks:
        hook.remove()
    np.testing.assert_allclose(lean.numpy(), own.numpy(), rtol=0, atol=1e-5 * float(own.abs().max()))
    assert len(widest) >= 2 * len(norms)  # in two strips at least, not whole
    expanded = max(m.out_channels for m in chain if isinstance(m, nn.Conv2d))
    assert max(widest) <= max(budget, 4 * expanded * (3 + 2 * 6) * size[1])  # a strip's rows: its halo's at most


def test_a_strip_at_the_images_edge_pads_zeros_where_the_block_pads_them():
    """A mutation's check: the first and last strips read rows past the image, which must be the conv's zeros (the
    strip's neighbour rows there would be other pixels); one-row strips of a 5 x 5 "same" conv of stride 2 meet both
    edges' asymmetric padding."""
    block = _noisy(_blocks()["uir, same, stride 2"])
    x = torch.randn(1, 8, 10, 9, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        own = block(x)
        lean = lean_tower.strip_forward(block, lean_tower.steps(block), x, budget=1)
    assert own.shape == lean.shape == (1, 12, 5, 5)
    np.testing.assert_allclose(lean.numpy(), own.numpy(), rtol=0, atol=1e-5 * float(own.abs().max()))


def test_a_block_that_fits_its_budget_runs_its_own_forward():
    block = _noisy(_blocks()["er, same, stride 2"])
    x, calls = torch.randn(1, 8, 12, 12), []
    block.bn1.register_forward_hook(lambda m, a, out: calls.append(out.shape) and None)
    with torch.no_grad(), lean_tower.lean(block):
        assert torch.equal(block(x), type(block).forward(block, x))
    assert calls[0] == calls[1] == (1, 32, 6, 6)  # whole, once a forward: no strips


@pytest.mark.parametrize("conv, shape, order", [
    (nn.Conv2d(12, 20, 2, 2), (6, 2, 2, 12), (0, 3, 1, 2)),  # GLM-4V's downsample: a permuted view, not contiguous
    (nn.Conv3d(3, 16, (2, 4, 4), (2, 4, 4)), (5, 3, 2, 4, 4), (0, 1, 2, 3, 4)),  # Qwen-VL's patch embedding
])
def test_a_merger_is_one_matrix_product_equal_to_the_convolution(conv, shape, order, monkeypatch):
    monkeypatch.setattr(lean_tower, "BUDGET", 0)
    conv = _noisy(conv)
    x = torch.randn(*shape).permute(*order)
    with torch.no_grad():
        own = conv(x)
        with lean_tower.lean(conv), _Calls() as calls:
            lean = conv(x)
    assert lean.shape == own.shape
    np.testing.assert_allclose(lean.numpy(), own.numpy(), rtol=0, atol=1e-5 * float(own.abs().max()))
    assert not [n for n in calls.names if "conv" in n], calls.names


@pytest.mark.parametrize("budget, size", [(0, 6), (10**6, 2)])
def test_a_convolution_that_merges_nothing_whole_or_fits_the_budget_runs_its_own_forward(budget, size, monkeypatch):
    """A patch embedding over a whole image (many positions, not one); a merger whose weight fits the budget."""
    monkeypatch.setattr(lean_tower, "BUDGET", budget)
    conv = _noisy(nn.Conv2d(3, 4, 2, 2))
    with torch.no_grad(), lean_tower.lean(conv), _Calls() as calls:
        conv(torch.randn(1, 3, size, size))
    assert "conv2d" in calls.names


@pytest.mark.parametrize("how", ["gradient", "training"])
def test_under_autograd_or_in_training_every_module_runs_its_own_forward(how):
    block, conv = _noisy(_blocks()["uir, same, stride 2"]), _noisy(nn.Conv2d(12, 20, 2, 2))
    x, units = torch.randn(1, 8, 20, 20), torch.randn(6, 12, 2, 2)
    lean_tower.BUDGET, before = 1, lean_tower.BUDGET
    try:
        with lean_tower.lean(block), lean_tower.lean(conv), _Calls() as calls:
            if how == "training":
                block.train(), conv.train()
            with torch.set_grad_enabled(how == "gradient"):
                block(x), conv(units)
    finally:
        lean_tower.BUDGET = before
    assert calls.names.count("conv2d") == 5  # dw_start, pw_exp, dw_mid, pw_proj whole, then the merger's own


def test_a_block_with_a_step_not_per_pixel_or_accelerates_weights_is_left_as_it_is():
    squeezed = UniversalInvertedResidual(8, 8, dw_kernel_size_mid=3, exp_ratio=2, se_layer=SqueezeExcite)
    offloaded = _noisy(_blocks()["er, batch norm, skip"])
    offloaded.conv_exp._hf_hook = object()  # accelerate's hook: the weights are moved in by its own forward
    merger = nn.Conv2d(4, 4, 2, 2)
    merger.forward = own = merger.forward  # a forward of its own (accelerate's wrap) is put back after
    assert lean_tower.steps(squeezed) is None
    with lean_tower.lean(nn.Sequential(squeezed, offloaded, merger)):
        assert "forward" not in squeezed.__dict__ and "forward" not in offloaded.__dict__
        assert merger.forward is not own
    assert merger.forward is own and "forward" not in squeezed.__dict__


@pytest.fixture(scope="module")
def lean_vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, ["gemma3n", "glm4v"])


def eager_generate_with(folder, image: Image.Image, hooks: dict):
    """transformers' eager ``generate`` (``test_vlm_answer.eager_generate``), the tower's attention on sdpa as vit's
    runs it, with ``hooks`` (``{module name: forward hook}``) on its modules."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(
        folder, attn_implementation={"text_config": "eager", "vision_config": "sdpa"})
    for name, hook in hooks.items():
        model.get_submodule(name).register_forward_hook(hook)
    inputs = processor_inputs(folder, image)
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    return out, inputs, model.config.image_token_id


def product(conv, args, out):
    """A merger's output by hand: each unit flattened against the weight viewed as a matrix."""
    x = args[0]
    if tuple(x.shape[2:]) != tuple(conv.kernel_size):
        return None
    return torch.nn.functional.linear(x.flatten(1), conv.weight.flatten(1), conv.bias).view(out.shape)


@pytest.mark.parametrize("kind", ["gemma3n", "glm4v"])
def test_a_vlm_answers_through_its_lean_tower_with_generates_tokens_and_eager_rows(lean_vlms, kind, monkeypatch):
    """The budget made small. GLM-4V's downsample (and patch embedding) a matrix product: the answer is transformers'
    eager ``generate``'s with that product by hand in place of each convolution, token for token, and each map its
    eager row. Gemma 3n's MobileNetV5 in strips of a row or two: each block's output equals timm's own forward on
    the same input to float rounding (1e-5 of its largest value; this random tower's depth amplifies that to 2e-4 of
    the features'), and the answer and maps are the eager model's given the lean tower's features."""
    budget = 4096
    monkeypatch.setattr(lean_tower, "BUDGET", budget)
    vlm = vit.open_vlm(lean_vlms[kind])
    strips, features = [], {}  # strips: (block, its input, its lean output) as the answer ran it
    for module in vlm.model.modules():
        if type(module).__name__ in lean_tower.CHAINS:
            module.register_forward_hook(lambda m, a, out: strips.append((m, a[0].clone(), out.clone())) and None)
    merged = [name for name, module in vlm.model.named_modules()
              if getattr(module.__dict__.get("forward"), "__func__", None) is lean_tower._lean_merge]
    tower = "model.vision_tower"
    if kind == "gemma3n":
        # kept as it leaves the tower: Gemma 3n's model scales it in place after
        vlm.model.get_submodule(tower).register_forward_hook(
            lambda m, a, out: features.update(ours=out.last_hidden_state.clone()) and None)
    image = picture()
    with _Calls() as calls:
        answer = vit.ask_vlm(vlm, image, QUESTION, max_new_tokens=NEW_TOKENS)
    if kind == "gemma3n":
        def ours(module, args, out):
            features["timm"] = out.last_hidden_state
            out.last_hidden_state = features["ours"].clone()  # not an inference tensor
            return out
        hooks = {tower: ours}
    else:
        hooks = {name: product for name in merged}
    out, inputs, image_token = eager_generate_with(lean_vlms[kind], image, hooks)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    unit, lead = LAYOUT[kind]
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = eager_image_rows(out, i, layer, positions)
            np.testing.assert_allclose(answer.attention(i, layer), by_hand(rows.mean(0), answer.grid, unit, lead),
                                       rtol=0, atol=ATOL)
    if kind == "gemma3n":
        assert strips and calls.names.count("conv2d") > 3 * len(strips)  # every block's convs, strip by strip
        with torch.no_grad():
            for block, x, lean in strips:  # each block's strips equal timm's own forward on the same input
                own = type(block).forward(block, x)
                np.testing.assert_allclose(lean.numpy(), own.numpy(), rtol=0, atol=1e-5 * float(own.abs().max()))
        assert not torch.equal(features["timm"], features["ours"])  # the features handed over: the lean tower's
    else:
        assert "model.visual.downsample" in merged and "linear" in calls.names
