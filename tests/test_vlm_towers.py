"""The vision towers inside vision-language models, opened from the VLM's own folder: LLaVA (1.5, NeXT, OneVision),
PaliGemma and Gemma 3 (issue 68).

References are transformers' own models with random weights (σ 0.05 noise on every parameter, eager attention),
saved whole with ``save_pretrained`` in several shards: every tower layer's attention (``output_attentions``) and
the projector's output (``get_image_features``) equal to 1e-5.
"""

import pytest
import torch

from vit.model import ViT, ViTConfig

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5


def noisy(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """σ 0.05 noise on every parameter (norms, biases and the projector's zeros included), eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


# -- the projector block against transformers' own ----------------------------------------------------------------

def _tower(**projector) -> ViT:
    config = ViTConfig(32, 8, 3, 0, hidden_size=32, num_layers=1, num_heads=2, mlp_size=48, pooling="avg",
                       **projector)
    return ViT(config).eval()


def test_the_mlp_projector_is_llavas():
    config = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(hidden_size=32, num_attention_heads=2),
                                      text_config=transformers.LlamaConfig(hidden_size=24, num_attention_heads=2))
    theirs = noisy(transformers.models.llava.modeling_llava.LlavaMultiModalProjector(config))
    model = _tower(projector="mlp", projector_dim=24, projector_skip=1)
    model.projector.load_state_dict({"fc1.weight": theirs.linear_1.weight, "fc1.bias": theirs.linear_1.bias,
                                     "fc2.weight": theirs.linear_2.weight, "fc2.bias": theirs.linear_2.bias})
    tokens = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.projector(tokens, (4, 4)), theirs(tokens), rtol=0, atol=ATOL)


def test_the_gemma3_projector_pools_norms_and_projects_as_gemma3s():
    config = transformers.Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", image_size=64, patch_size=8, hidden_size=32, num_attention_heads=2),
        text_config=dict(model_type="gemma3_text", hidden_size=24, num_attention_heads=2, head_dim=12), mm_tokens_per_image=4)
    theirs = noisy(transformers.models.gemma3.modeling_gemma3.Gemma3MultiModalProjector(config))
    model = _tower(projector="gemma3", projector_dim=24, projector_pool=4, class_token=False)
    model.projector.load_state_dict({"fc1.weight": theirs.mm_input_projection_weight.t(),
                                     "norm.weight": 1 + theirs.mm_soft_emb_norm.weight})
    tokens = torch.randn(2, 64, 32)  # an 8 x 8 grid, pooled 4 x 4 to 2 x 2
    with torch.no_grad():
        torch.testing.assert_close(model.projector(tokens, (8, 8)), theirs(tokens), rtol=0, atol=ATOL)


def test_the_gemma3_pool_refuses_a_grid_it_does_not_tile_in_one_line():
    model = _tower(projector="gemma3", projector_dim=24, projector_pool=4, class_token=False)
    with pytest.raises(ValueError, match="not made of whole 4x4 cells") as e:
        model.projector(torch.randn(1, 30, 32), (5, 6))
    assert "\n" not in str(e.value)
