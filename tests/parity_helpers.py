"""Shared pieces of the family parity tests: random weights, the tiny reference models their libraries build and
save natively, attention capture and the 1e-5 comparison.

With ``PARITY_TABLE=path`` in the environment every comparison appends a row
``family | entry point | size | max |output diff| | max |attention diff|`` to that file.
"""

import os
from pathlib import Path

import torch

ATOL = 1e-5
# A tiny HF vision tower (2 layers of 2 heads, 4x4 patches at 32 px) and the text tower a two-tower model needs.
HF_VISION = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=2)
HF_TEXT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
               max_position_embeddings=8)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Noise on every parameter: biases, norms and layer scales are zeros or ones at init."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return model.eval()


def hf_random(model_class, config) -> torch.nn.Module:
    """``model_class(config)`` (an HF model) with eager attention (the path that returns attention probabilities),
    built from seed 0 with noise on every parameter."""
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(model_class(config))


def timm_random(name: str, dynamic: bool = False, **kwargs) -> torch.nn.Module:
    """A tiny random timm ``name`` (32 px, patch 8, width 32, 2 blocks of 2 heads; ``kwargs`` override or add) with
    fused attention off, so each block's ``attn_drop`` receives its probabilities; ``dynamic``: timm's
    ``dynamic_img_size`` (any input size, the table resampled). Built from seed 0 with noise on every parameter."""
    import timm

    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, **{
            **dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, dynamic_img_size=dynamic),
            **kwargs})
    finally:
        timm.layers.set_fused_attn(True)
    return randomize(model)


def timm_pair(name: str, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``timm_random(name)`` and its ``dynamic_img_size`` twin with the same weights (the reference at other sizes)."""
    model, dynamic = timm_random(name, **kwargs), timm_random(name, dynamic=True, **kwargs)
    dynamic.load_state_dict(model.state_dict())
    return model, dynamic


def save_timm(model: torch.nn.Module, folder: Path, **model_args) -> Path:
    """``model`` saved as timm saves for the Hub (``config.json`` + safetensors), with the model arguments a tiny
    one needs to be built again (``num_heads=2, img_size=32``, which ``model_args`` extend or override); returns
    ``folder``."""
    import timm

    timm.models.save_for_hf(model, folder, model_args={"num_heads": 2, "img_size": 32, **model_args},
                            safe_serialization=True)
    return folder


def run_hooked(hooks, run):
    """``run()``'s result without gradients, the hook handles ``hooks`` removed after it whatever happens."""
    try:
        with torch.no_grad():
            return run()
    finally:
        for hook in hooks:
            hook.remove()


def capture_inputs(modules, run):
    """``run()``'s result and the first input each of ``modules`` got during it, in call order."""
    captured = []
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append(i[0])) for m in modules]
    return run_hooked(hooks, run), captured


def timm_outputs(model, images):
    """A timm model's output on ``images`` and each block's attention, read where timm applies attention dropout."""
    return capture_inputs([b.attn.attn_drop for b in model.blocks], lambda: model(images))


def assert_timm_parity(row: str, checkpoint, references) -> None:
    """``assert_parity`` of ``checkpoint``'s embedding and attentions against each ``(label, timm model, (H, W))``
    of ``references`` on two random images of that size (row ``"{row} | {label}"``)."""
    for label, reference, size in references:
        images = torch.randn(2, 3, *size)
        expected, attentions = timm_outputs(reference, images)
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"{row} | {label}", ours.embedding, expected, ours.attentions, attentions)


def assert_parity(row: str, output: torch.Tensor, expected_output: torch.Tensor, attentions, expected_attentions
                  ) -> None:
    """Output and every attention equal to 1e-5 (shapes too); the measured differences go to the parity table."""
    assert output.shape == expected_output.shape
    out_diff = (output - expected_output).abs().max().item()
    assert len(attentions) == len(expected_attentions)
    attn_diff = 0.0
    for mine, theirs in zip(attentions, expected_attentions, strict=True):
        assert mine.shape == theirs.shape, (mine.shape, theirs.shape)
        attn_diff = max(attn_diff, (mine - theirs).abs().max().item())
    table = os.environ.get("PARITY_TABLE")
    if table:
        with open(table, "a", encoding="utf-8") as f:
            f.write(f"{row} | {out_diff:.1e} | {attn_diff:.1e}\n")
    assert out_diff <= ATOL, f"{row}: output differs by {out_diff}"
    assert attn_diff <= ATOL, f"{row}: attention differs by {attn_diff}"
