"""dino.txt (Jose et al. 2025, "DINOv2 Meets Text"), DINOv3's text-aligned head, from the authors' files
(facebookresearch/dinov3 ``dinov3/hub/dinotxt.py``, ``dinov3/eval/text/``):

- the backbone, an original DINOv3 ``.pth`` (``import_dinov3``: ``dinov3_vitl16_pretrain_lvd1689m-*.pth``);
- the head and text file (``dinov3_vitl16_dinotxt_vision_head_and_text_encoder-*.pth``): a ``DINOTxt`` state dict
  without the backbone, which the hub loads over it. ``visual_model.head.*``: self-attention blocks without RoPE, with
  SwiGLU MLPs and layer scale, over the backbone's normed tokens, then ``ln_final``; ``text_model.*``: a causal text
  transformer and a bias-free projection to the joint embedding; ``logit_scale``;
- the BPE vocabulary, CLIP's ``bpe_simple_vocab_16e6.txt.gz``, which open_clip ships (a copy beside the weights is
  read instead).

The vision head runs in our ``ViT`` as pool blocks after the backbone's final norm (``pool_layers``,
``pool_gated_mlp``, ``pool_norm``), read as its CLS token beside the mean of its patch tokens (``pooling="cls+avg"``):
``DINOTxt.encode_image``, half of the joint embedding for each. The text tower is open_clip's ``TextTransformer``
built to dino.txt's shape (pre-norm causal blocks, exact GELU, ``ln_final``, the token at the highest id, a bias-free
projection) with these weights renamed onto it (``text_state_dict``). What the file cannot say is the hub's
(``dinov3_vitl16_dinotxt_tet1280d20h24l``): heads of 64 channels in the text tower, its argmax pooling, a causal
mask, and the CLS and patch-mean halves (no projection in the vision head).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from vit.model import ViTConfig
from vit.sources.ports.families import import_dinov3

SUPPORTED = ("dino.txt: facebookresearch/dinov3's vision head and text encoder .pth, with its DINOv3 backbone .pth "
             "beside it or inside it")
HEAD, TEXT, BACKBONE = "visual_model.head.", "text_model.", "visual_model.backbone."
TEXT_HEAD_WIDTH = 64  # channels per head of the released text tower (1280 wide, 20 heads); the file does not say
CONTEXT_LENGTH = 77  # the authors' tokenizer pads and truncates every text to 77 tokens


def is_head_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """A ``DINOTxt`` state dict: the vision head, the text tower and the logit scale."""
    return "logit_scale" in state and f"{TEXT}backbone.token_embedding.weight" in state \
        and any(k.startswith(HEAD) for k in state)


def backbone_of(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The backbone's state dict when the file holds it too (a whole ``DINOTxt``), else None."""
    inside = {k[len(BACKBONE):]: v for k, v in state.items() if k.startswith(BACKBONE)}
    return inside or None


def _blocks(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    return len({m.group(1) for k in state if (m := re.match(rf"^{re.escape(prefix)}blocks\.(\d+)\.", k))})


def config_from_original(backbone: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> ViTConfig:
    """Our config: the backbone's (``import_dinov3.config_from_original``) with the vision head as pool blocks, read
    as CLS beside the patch mean; ValueError for a head this port does not have."""
    config = import_dinov3.config_from_original(backbone)
    width = config.hidden_size
    other = sorted(k for k in state if not k.startswith((HEAD, TEXT, BACKBONE)) and k != "logit_scale")
    if other:
        raise ValueError(f"the dino.txt file has {len(other)} key(s) DINOTxt has no place for: {', '.join(other[:5])}")
    blocks = _blocks(state, HEAD)
    if f"{HEAD}linear_projection.weight" in state:
        raise ValueError("its vision head projects the tokens (use_linear_projection), which the released dino.txt "
                         "does not; only a head without a projection is supported")
    if blocks == 0 or f"{HEAD}ln_final.weight" not in state:
        raise ValueError("its vision head has no blocks (vision_model_num_head_blocks=0); only the released head "
                         "(blocks, then ln_final) is supported")
    if config.layer_scale is None or f"{HEAD}blocks.0.mlp.w1.weight" not in state:
        raise ValueError("its vision head's blocks are not the released ones (layer scale and SwiGLU MLPs)")
    if state[f"{HEAD}ln_final.weight"].shape != (width,):
        raise ValueError(f"its vision head is {state[f'{HEAD}ln_final.weight'].shape[0]} wide, the backbone {width}")
    embedding = state[f"{TEXT}head.linear_projection.weight"].shape[0] if f"{TEXT}head.linear_projection.weight" \
        in state else state[f"{TEXT}backbone.ln_final.weight"].shape[0]
    if embedding != 2 * width:
        raise ValueError(f"its text embedding has {embedding} channels where the image's CLS and patch mean have "
                         f"{2 * width}: the head and text file belongs to another backbone")
    return replace(config, pooling="cls+avg", pool_layers=blocks, pool_gated_mlp=True, pool_norm=True,
                   pool_mlp_size=state[f"{HEAD}blocks.0.mlp.w1.weight"].shape[0])


def state_dict_from_original(backbone: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
                             config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict: the backbone's, the vision head's blocks as ``pool_blocks`` (a zero qkv bias where the head
    has none: the same function) and its ``ln_final`` as ``pool_norm``; ValueError for a key it cannot place. The
    text tower's keys are ``text_state_dict``'s."""
    ours = import_dinov3.state_dict_from_original(backbone, config)
    used = set()

    def take(key: str) -> torch.Tensor:
        if key not in state:
            raise ValueError(f"the dino.txt head lacks {key!r}")
        used.add(key)
        return state[key]

    def linear(mine: str, theirs: str) -> None:
        ours[f"{mine}.weight"] = take(f"{theirs}.weight")
        bias = take(f"{theirs}.bias") if f"{theirs}.bias" in state else None
        ours[f"{mine}.bias"] = bias if bias is not None else ours[f"{mine}.weight"].new_zeros(
            ours[f"{mine}.weight"].shape[0])

    for i in range(config.pool_layers):
        mine, theirs = f"pool_blocks.{i}", f"{HEAD}blocks.{i}"
        for piece in ("norm1", "norm2", "attn.proj"):
            linear(f"{mine}.{piece}", f"{theirs}.{piece}")
        linear(f"{mine}.attn.qkv", f"{theirs}.attn.qkv")
        if not config.qkv_bias:
            del ours[f"{mine}.attn.qkv.bias"]
        ours[f"{mine}.ls1"], ours[f"{mine}.ls2"] = take(f"{theirs}.ls1.gamma"), take(f"{theirs}.ls2.gamma")
        for ours_name, theirs_name in (("fc1_g", "w1"), ("fc1", "w2"), ("fc2", "w3")):
            linear(f"{mine}.mlp.{ours_name}", f"{theirs}.mlp.{theirs_name}")
    linear("pool_norm", f"{HEAD}ln_final")
    unused = sorted(k for k in state if k.startswith(HEAD) and k not in used)
    if unused:
        raise ValueError(f"the dino.txt head has {len(unused)} key(s) this model has no place for: "
                         f"{', '.join(unused[:5])}")
    return ours


@dataclass(frozen=True)
class TextConfig:
    """open_clip ``TextTransformer``'s arguments for a dino.txt text tower, read from the weights' shapes."""

    context_length: int
    vocab_size: int
    width: int
    heads: int
    layers: int
    mlp_ratio: float
    output_dim: int

    def arguments(self) -> dict:
        """Keyword arguments of ``open_clip.transformer.TextTransformer``: the hub's tower (argmax pooling, a causal
        mask, no layer scale, exact GELU, a bias-free linear projection)."""
        return dict(context_length=self.context_length, vocab_size=self.vocab_size, width=self.width,
                    heads=self.heads, layers=self.layers, mlp_ratio=self.mlp_ratio, ls_init_value=None,
                    output_dim=self.output_dim, pool_type="argmax", proj_type="linear", proj_bias=False)


def text_config(state: Mapping[str, torch.Tensor]) -> TextConfig:
    """The text tower's shape from the head and text file; ValueError for a tower the hub does not build."""
    prefix = f"{TEXT}backbone."
    if _blocks(state, f"{TEXT}head.") or f"{TEXT}head.ln_final.weight" in state:
        raise ValueError("its text tower has head blocks (text_model_num_head_blocks > 0), which the released "
                         "dino.txt has not; only the released tower is supported")
    vocab, width = state[f"{prefix}token_embedding.weight"].shape
    if width % TEXT_HEAD_WIDTH:
        raise ValueError(f"its text tower is {width} wide, not a whole number of {TEXT_HEAD_WIDTH}-channel heads "
                         "(the released tower's)")
    layers = _blocks(state, prefix)
    hidden = state[f"{prefix}blocks.0.feed_forward.fc1.weight"].shape[0] if layers else 4 * width
    projection = state.get(f"{TEXT}head.linear_projection.weight")
    return TextConfig(state[f"{prefix}positional_embedding"].shape[0], vocab, width, width // TEXT_HEAD_WIDTH,
                      layers, hidden / width, projection.shape[0] if projection is not None else width)


def text_state_dict(state: Mapping[str, torch.Tensor], config: TextConfig) -> dict[str, torch.Tensor]:
    """The text tower's weights by open_clip ``TextTransformer``'s names: the qkv projection (no bias: a zero one)
    as ``attn.in_proj``, the feed-forward as ``mlp.c_fc`` / ``c_proj``, the projection transposed (open_clip
    multiplies on the right); ValueError for a text key it cannot place."""
    prefix = f"{TEXT}backbone."
    names = {"positional_embedding": "positional_embedding", "token_embedding.weight": "token_embedding.weight",
             "ln_final.weight": "ln_final.weight", "ln_final.bias": "ln_final.bias"}
    pieces = {"attention_norm": "ln_1", "ffn_norm": "ln_2", "attention.qkv": "attn.in_proj",
              "attention.proj": "attn.out_proj", "feed_forward.fc1": "mlp.c_fc", "feed_forward.fc2": "mlp.c_proj"}
    for i in range(config.layers):
        for theirs, mine in pieces.items():
            block_theirs, block_mine = f"blocks.{i}.{theirs}", f"transformer.resblocks.{i}.{mine}"
            if theirs == "attention.qkv":  # nn.MultiheadAttention's in_proj_weight / in_proj_bias
                names[f"{block_theirs}.weight"] = f"{block_mine}_weight"
                names[f"{block_theirs}.bias"] = f"{block_mine}_bias"
            else:
                names.update({f"{block_theirs}.{p}": f"{block_mine}.{p}" for p in ("weight", "bias")})
    ours = {}
    for theirs, mine in names.items():
        if f"{prefix}{theirs}" in state:
            ours[mine] = state[f"{prefix}{theirs}"]
        elif theirs.endswith("qkv.bias"):
            weight = state[f"{prefix}{theirs[:-len('bias')]}weight"]
            ours[mine] = weight.new_zeros(weight.shape[0])
    projection = state.get(f"{TEXT}head.linear_projection.weight")
    ours["text_projection"] = projection.T if projection is not None else torch.eye(config.width)
    known = {f"{prefix}{k}" for k in names} | {f"{TEXT}head.linear_projection.weight"}
    unused = sorted(k for k in state if k.startswith(TEXT) and k not in known)
    if unused:
        raise ValueError(f"the dino.txt text tower has {len(unused)} key(s) this program has no place for: "
                         f"{', '.join(unused[:5])}")
    return ours


MAX_LOG_SCALE = 20.0  # CLIP clamps its log scale at ln 100 = 4.6; dino.txt starts at ln(1 / 0.07) = 2.7


def logit_scale(state: Mapping[str, torch.Tensor]) -> float:
    """``exp(logit_scale)``: the factor on the image-text cosine (``DINOTxt.get_logits``); ValueError when it is not
    one number of magnitude at most ``MAX_LOG_SCALE``."""
    value = state["logit_scale"]
    if value.numel() != 1 or not abs(float(value.reshape(-1)[0])) <= MAX_LOG_SCALE:  # NaN fails too
        raise ValueError(f"its logit_scale is not one number of magnitude at most {MAX_LOG_SCALE:g}")
    return math.exp(float(value.reshape(-1)[0]))
