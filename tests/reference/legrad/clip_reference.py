# Verbatim from https://github.com/WalBouss/LeGrad (MIT licence, see LICENSE here):
#   legrad/wrapper.py @ 8c2ca901a0dd185fba22314c32fa7857e24c5425: LeWrapper.compute_legrad_clip
#   legrad/utils.py   @ c5c7b20d3bfc20169471f4a123abd0636c6a16e1: hooked_attention_forward, hooked_resblock_forward
# compute_legrad_clip is a method of LeWrapper (a copy of an open_clip model); it is kept as a function of
# ``self`` and the test builds a ``self`` with what it reads (visual, starting_depth, patch_size, encode_image).
# The hooks assume open_clip 2's sequence-first blocks (L, N, D); open_clip 3 runs them batch-first, so the test
# sets the vision transformer's ``batch_first = False`` (open_clip 3's own switch) before hooking, and wraps the
# hooked attention's return in a tuple (see tests/test_prompts.py hook_legrad): nothing here is changed.
import math
from typing import Optional

import torch
import torch.nn.functional as F
from einops import rearrange

from tests.reference.legrad.siglip_reference import min_max


# ------------ Hooked Multi-Head Attention ------------
# from https://github.com/mlfoundations/open_clip/blob/73fa7f03a33da53653f61841eb6d69aef161e521/src/open_clip/transformer.py#L129
def hooked_attention_forward(self, x, x_k, x_v, attn_mask: Optional[torch.Tensor] = None, need_weights: bool=False,):
    L, N, C = x.shape
    q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
    q = q.contiguous().view(L, N * self.num_heads, -1).transpose(0, 1)
    k = k.contiguous().view(L, N * self.num_heads, -1).transpose(0, 1)
    v = v.contiguous().view(L, N * self.num_heads, -1).transpose(0, 1)

    head_dim = q.shape[-1]
    scale = float(head_dim) ** -0.5
    q = q * scale
    attn = torch.bmm(q, k.transpose(-1, -2))

    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            new_attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype)
            new_attn_mask.masked_fill_(attn_mask, float("-inf"))
            attn_mask = new_attn_mask
        attn += attn_mask

    attn = attn.softmax(dim=-1)
    # Hook for attention maps
    self.attention_map = attn

    x = torch.bmm(attn, v)
    x = x.transpose(0, 1).reshape(L, N, C)
    x = self.out_proj(x)
    return x


# ------------ Hooked Residual Transformer Block ------------
# from https://github.com/mlfoundations/open_clip/blob/73fa7f03a33da53653f61841eb6d69aef161e521/src/open_clip/transformer.py#L231
def hooked_resblock_forward(
        self,
        q_x: torch.Tensor,
        k_x: Optional[torch.Tensor] = None,
        v_x: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
):
    k_x = self.ln_1_kv(k_x) if hasattr(self, "ln_1_kv") and k_x is not None else None
    v_x = self.ln_1_kv(v_x) if hasattr(self, "ln_1_kv") and v_x is not None else None

    x = q_x + self.ls_1(self.attention(q_x=self.ln_1(q_x), k_x=k_x, v_x=v_x, attn_mask=attn_mask))
    # Hook for intermediate features post Attn
    self.feat_post_attn = x
    x = x + self.ls_2(self.mlp(self.ln_2(x)))
    # Hook for intermediate features post MLP
    self.feat_post_mlp = x
    return x


def compute_legrad_clip(self, text_embedding, image=None):
    
    
    num_prompts = text_embedding.shape[0]
    if image is not None:
        # image = image.repeat(num_prompts, 1, 1, 1)
        _ = self.encode_image(image)

    blocks_list = list(dict(self.visual.transformer.resblocks.named_children()).values())

    image_features_list = []

    for layer in range(self.starting_depth, len(self.visual.transformer.resblocks)):
        intermediate_feat = self.visual.transformer.resblocks[layer].feat_post_mlp  # [num_patch, batch, dim]
        intermediate_feat = self.visual.ln_post(intermediate_feat.mean(dim=0)) @ self.visual.proj
        intermediate_feat = F.normalize(intermediate_feat, dim=-1)
        image_features_list.append(intermediate_feat)

    num_tokens = blocks_list[-1].feat_post_mlp.shape[0] - 1
    w = h = int(math.sqrt(num_tokens))

    # ----- Get explainability map
    accum_expl_map = 0
    for layer, (blk, img_feat) in enumerate(zip(blocks_list[self.starting_depth:], image_features_list)):
        self.visual.zero_grad()
        sim = text_embedding @ img_feat.transpose(-1, -2)  # [1, 1]
        one_hot = F.one_hot(torch.arange(0, num_prompts)).float().requires_grad_(True).to(text_embedding.device)
        one_hot = torch.sum(one_hot * sim)

        attn_map = blocks_list[self.starting_depth + layer].attn.attention_map  # [b, num_heads, N, N]

        # -------- Get explainability map --------
        grad = torch.autograd.grad(one_hot, [attn_map], retain_graph=True, create_graph=True)[
            0]  # [batch_size * num_heads, N, N]
        grad = rearrange(grad, '(b h) n m -> b h n m', b=num_prompts)  # separate batch and attn heads
        grad = torch.clamp(grad, min=0.)

        image_relevance = grad.mean(dim=1).mean(dim=1)[:, 1:]  # average attn over [CLS] + patch tokens
        expl_map = rearrange(image_relevance, 'b (w h) -> 1 b w h', w=w, h=h)
        expl_map = F.interpolate(expl_map, scale_factor=self.patch_size, mode='bilinear')  # [B, 1, H, W]
        accum_expl_map += expl_map

    # Min-Max Norm
    accum_expl_map = min_max(accum_expl_map)
    return accum_expl_map
