# Adapted from https://github.com/WalBouss/LeGrad
# commit a9edb031422d5f5829d9e6238a1e21feb1972c92, file legrad/wrapper.py, LeWrapper.compute_legrad_clip
# and legrad/utils.py min_max; MIT licence (see LICENSE here).
#
# The wrapper hooks open_clip models (feat_post_mlp / attention_maps set by forward hooks) and scores
# image-text similarity. A classifier has no text side, so the model-specific parts are parameters:
#   feats:         each block's output, (batch, tokens, dim)   [reference: blk.feat_post_mlp, (tokens, batch, dim)]
#   attn_maps:     each block's attention in the autograd graph, (batch, heads, N, N)
#                  [reference: blk.attn.attention_maps, (batch*heads, N, N), which it rearranges to this]
#   score_of_feat: feature -> (num_prompts, batch) scores  [reference: text_embedding @ normalised pooled feature]
# Everything else is the reference's code: one_hot on the diagonal, clamp, mean over heads then
# over queries, [:, 1:], bilinear upsampling by the patch size, sum over layers, min-max.
import math

import torch
import torch.nn.functional as F


def min_max(logits):
    B, num_prompt = logits.shape[:2]
    logits_min = logits.reshape(B, num_prompt, -1).min(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits_max = logits.reshape(B, num_prompt, -1).max(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits = (logits - logits_min) / (logits_max - logits_min)
    return logits


def compute_legrad(feats, attn_maps, score_of_feat, num_prompts, patch_size, starting_depth):
    image_features_list = feats[starting_depth:]

    num_tokens = feats[-1].shape[1] - 1
    w = h = int(math.sqrt(num_tokens))

    # ----- Get explainability map
    accum_expl_map = 0
    for layer, img_feat in enumerate(image_features_list):
        sim = score_of_feat(img_feat)  # [num_prompts, batch]
        one_hot = F.one_hot(torch.arange(0, num_prompts)).float().requires_grad_(True).to(sim.device)
        one_hot = torch.sum(one_hot * sim)

        attn_map = attn_maps[starting_depth + layer]  # [b, num_heads, N, N]

        # -------- Get explainability map --------
        grad = torch.autograd.grad(one_hot, [attn_map], retain_graph=True, create_graph=True)[0]
        grad = torch.clamp(grad, min=0.)

        image_relevance = grad.mean(dim=1).mean(dim=1)[:, 1:]  # average attn over [CLS] + patch tokens
        expl_map = image_relevance.reshape(1, num_prompts, w, h)
        expl_map = F.interpolate(expl_map, scale_factor=patch_size, mode='bilinear')  # [B, 1, H, W]
        accum_expl_map += expl_map

    # Min-Max Norm
    accum_expl_map = min_max(accum_expl_map)
    return accum_expl_map
