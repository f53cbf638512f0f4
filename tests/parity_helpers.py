"""Shared pieces of the family parity tests: random weights, attention capture and the 1e-5 comparison.

With ``PARITY_TABLE=path`` in the environment every comparison appends a row
``family | entry point | size | max |output diff| | max |attention diff|`` to that file.
"""

import os

import torch

ATOL = 1e-5


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Noise on every parameter: biases, norms and layer scales are zeros or ones at init."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return model.eval()


def capture_inputs(modules, run):
    """``run()``'s result and the first input each of ``modules`` got during it, in call order."""
    captured = []
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append(i[0])) for m in modules]
    try:
        with torch.no_grad():
            result = run()
    finally:
        for hook in hooks:
            hook.remove()
    return result, captured


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
