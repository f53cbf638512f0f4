# Verbatim from https://github.com/WalBouss/LeGrad (MIT licence, see LICENSE here):
#   legrad/wrapper.py @ 8c2ca901a0dd185fba22314c32fa7857e24c5425: LeWrapper.compute_legrad_siglip
#   legrad/utils.py   @ c5c7b20d3bfc20169471f4a123abd0636c6a16e1: hooked_resblock_timm_forward,
#                                                                  hooked_attentional_pooler_timm_forward, min_max
# compute_legrad_siglip is a method of LeWrapper (a copy of an open_clip model whose visual.trunk is a timm SigLIP);
# it is kept here as a function of ``self``, and the test builds a ``self`` with exactly the attributes it reads:
# visual.trunk (the hooked timm model), starting_depth, patch_size, zero_grad, encode_image and empty_embedding
# (set beforehand, so _init_empty_embedding, which would tokenize with a downloaded tokenizer, does nothing).
import math

import torch
import torch.nn.functional as F
from einops import rearrange


def min_max(logits):
    B, num_prompt = logits.shape[:2]
    logits_min = logits.reshape(B, num_prompt, -1).min(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits_max = logits.reshape(B, num_prompt, -1).max(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits = (logits - logits_min) / (logits_max - logits_min)
    return logits


# ------------ Hooked TimmModel's Residual Transformer Block ------------
def hooked_resblock_timm_forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
    self.feat_post_attn = x
    x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
    self.feat_post_mlp = x
    return x


# ------------ Hooked TimmModel's Attentional Pooler ------------
def hooked_attentional_pooler_timm_forward(self, x):
    B, N, C = x.shape

    if self.pos_embed is not None:
        # FIXME interpolate
        x = x + self.pos_embed.unsqueeze(0).to(x.dtype)

    q_latent = self.latent.expand(B, -1, -1)
    q = self.q(q_latent).reshape(B, self.latent_len, self.num_heads, self.head_dim).transpose(1, 2)

    kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    k, v = kv.unbind(0)

    q, k = self.q_norm(q), self.k_norm(k)

    q = q * self.scale
    attn = q @ k.transpose(-2, -1)
    attn = attn.softmax(dim=-1)
    x = attn @ v

    # Hook to save attention map for explainability
    self.attn_probs = attn

    x = x.transpose(1, 2).reshape(B, self.latent_len, C)
    x = self.proj(x)
    x = self.proj_drop(x)

    x = x + self.mlp(self.norm(x))

    # optional pool if latent seq_len > 1 and pooled output is desired
    if self.pool == 'token':
        x = x[:, 0]
    elif self.pool == 'avg':
        x = x.mean(1)
    return x


def compute_legrad_siglip(self, text_embedding, image=None, apply_correction=True, correction_threshold=0.8):
    # --- Forward CLIP ---
    blocks_list = list(dict(self.visual.trunk.blocks.named_children()).values())
    if image is not None:
        _ = self.encode_image(image)  # [bs, num_patch, dim] bs=num_masks

    image_features_list = []
    for blk in blocks_list[self.starting_depth:]:
        intermediate_feat = blk.feat_post_mlp
        image_features_list.append(intermediate_feat)

    num_tokens = blocks_list[-1].feat_post_mlp.shape[1]
    w = h = int(math.sqrt(num_tokens))

    if apply_correction:
        self._init_empty_embedding()
        accum_expl_map_empty = 0

    accum_expl_map = 0
    for layer, (blk, img_feat) in enumerate(zip(blocks_list[self.starting_depth:], image_features_list)):
        self.zero_grad()
        pooled_feat = self.visual.trunk.attn_pool(img_feat)
        pooled_feat = F.normalize(pooled_feat, dim=-1)
        # -------- Get explainability map --------
        sim = text_embedding @ pooled_feat.transpose(-1, -2)  # [num_mask, num_mask]
        one_hot = torch.sum(sim)
        grad = torch.autograd.grad(one_hot, [self.visual.trunk.attn_pool.attn_probs], retain_graph=True,
                                   create_graph=True)[0]
        grad = torch.clamp(grad, min=0.)

        image_relevance = grad.mean(dim=1)[:, 0]  # average attn over [CLS] + patch tokens
        expl_map = rearrange(image_relevance, 'b (w h) -> b 1 w h', w=w, h=h)
        accum_expl_map += expl_map

        if apply_correction:
            # -------- Get empty explainability map --------
            sim_empty = pooled_feat @ self.empty_embedding
            one_hot_empty = torch.sum(sim_empty)
            grad_empty = \
                torch.autograd.grad(one_hot_empty, [self.visual.trunk.attn_pool.attn_probs], retain_graph=True,
                                    create_graph=True)[0]
            grad_empty = torch.clamp(grad_empty, min=0.)

            image_relevance_empty = grad_empty.mean(dim=1)[:, 0]  # average attn over heads + select query's row
            expl_map_empty = rearrange(image_relevance_empty, 'b (w h) -> b 1 w h', w=w, h=h)
            accum_expl_map_empty += expl_map_empty

    if apply_correction:
        heatmap_empty = min_max(accum_expl_map_empty)
        accum_expl_map[heatmap_empty > correction_threshold] = 0

    Res = min_max(accum_expl_map)
    Res = F.interpolate(Res, scale_factor=self.patch_size, mode='bilinear')  # [B, 1, H, W]

    return Res
