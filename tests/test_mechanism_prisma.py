"""Direct logit attribution against ViT-Prisma's ``HookedViT`` (vit-prisma 0.1.4 from PyPI) on the same weights.

Prisma converts timm's plain ViT (``convert_timm_weights``); both models get the same random timm weights and
Prisma's ``ActivationCache`` splits the class logit as TransformerLens does: ``stack_head_results`` /
``decompose_resid(mode="mlp")`` at the CLS position, ``apply_ln_to_stack`` (centre, divide by the final norm's
cached scale), then the final norm's weight times the head's class column. Prisma 0.1.4 covers timm's plain
CLS-pooled ViT only (no registers, layer scale, distillation, average pooling), so only that family is compared.
"""

import pytest
import torch

from vit.explain.mechanism.components import direct_logit_attribution
from vit.model import ViT
from vit.sources.ports.libraries.import_timm import config_from_timm, state_dict_from_timm

timm = pytest.importorskip("timm")
pytest.importorskip("vit_prisma", reason="install it with: pip install --no-deps -r requirements-test-nodeps.txt")
pytestmark = pytest.mark.slow  # importing Prisma (and transformers under it) takes seconds


def test_head_and_mlp_attribution_match_prisma():
    from vit_prisma.configs.HookedViTConfig import HookedViTConfig
    from vit_prisma.models.base_vit import HookedViT
    from vit_prisma.prisma_tools.loading_from_pretrained import convert_timm_weights

    torch.manual_seed(0)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                                  embed_dim=16, num_heads=2, num_classes=5).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    config = HookedViTConfig(n_layers=3, d_model=16, d_head=8, n_heads=2, d_mlp=64, activation_name="gelu", eps=1e-6,
                             n_channels=3, patch_size=8, image_size=32, n_classes=5, return_type="class_logits",
                             use_attn_result=True, use_wandb=False)
    prisma = HookedViT(config)
    prisma.load_state_dict(convert_timm_weights(reference.state_dict(), config), strict=True)
    prisma.eval()
    state = reference.state_dict()
    ours = ViT(config_from_timm("vit_base_patch16_224", state, {"num_heads": 2, "img_size": 32}))
    ours.load_state_dict(state_dict_from_timm(state), strict=True)
    ours.eval()

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 4])
    with torch.no_grad():
        logits, cache = prisma.run_with_cache(x)
        heads = cache.stack_head_results(layer=-1, pos_slice=0)  # (L * H, B, D) at CLS
        mlps = cache.decompose_resid(layer=-1, mode="mlp", incl_embeds=False, pos_slice=0)  # (L, B, D)
        directions = (prisma.ln_final.w[:, None] * prisma.head.W_H)[:, classes].T  # (B, D)
        expected_heads = (cache.apply_ln_to_stack(heads, layer=-1, pos_slice=0) * directions).sum(-1)  # (L * H, B)
        expected_mlps = (cache.apply_ln_to_stack(mlps, layer=-1, pos_slice=0) * directions).sum(-1)  # (L, B)
    dla = direct_logit_attribution(ours, x, classes)
    torch.testing.assert_close(dla.logit, logits[torch.arange(2), classes], rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.heads, expected_heads.T.reshape(2, 3, 2), rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.mlps, expected_mlps.T, rtol=0, atol=1e-5)
