"""A from-scratch Vision Transformer (Dosovitskiy et al. 2020) that returns its own attention.

Building blocks first, the model last. ``ViT.forward`` follows the seed contract
``logits, attentions = model(images, output_attentions=False)``: ``attentions`` is ``None``
unless asked for, else a tuple with one ``(batch, heads, tokens, tokens)`` tensor per layer
holding the post-softmax probabilities (the meaning HF ``transformers`` gives the flag).
``logits`` is ``None`` for a model without a classifier (``num_classes=0``: feature models
such as DINO, whose attention is what one studies).

The defaults are the original ViT that this project trains; the other fields express the
published variants imported from HF ``transformers``, timm, torchvision and open_clip (``vit.sources.open``):
DeiT's distillation token, DINOv2's layer scale and register tokens, timm's average pooling
with ``fc_norm`` and position tables without prefix entries; DINOv3's rotary positions (on the
patch tokens' queries and keys only), storage tokens and masked key bias; CLIP's ``ln_pre``,
QuickGELU and projection to the joint embedding; SigLIP's missing class token and
attention-pooling ("MAP") head; SwiGLU MLPs; AIMv2's RMSNorm, bias-free projections and query-only pooling
head; Perception Encoder's rotary grid (EVA's, counted from 1, x first) and its probe's own heads. Tokens are
always ordered ``[CLS?, DIST?, REG 1..R, patches row by row]``.

``ViT.encode`` returns everything one pass computes (logits, the pooled or projected
embedding, every layer's attention and the pooling probe's); ``forward`` is its seed-contract view.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields, replace
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

# Upper bounds of every size a config may declare: far beyond published ViTs (ViT-22B: hidden 6144, 48 layers,
# 48 heads, MLP 24576; ImageNet-21k: 21,843 classes), so only absurd or hostile configs meet them.
CONFIG_BOUNDS = {"image_size": 8192, "patch_size": 1024, "num_channels": 16, "hidden_size": 16384, "num_layers": 256,
                 "num_heads": 256, "mlp_size": 131072, "num_classes": 100_000, "num_register_tokens": 256,
                 "projection_dim": 16384, "rope_ref_grid": 1024, "head_dim": 16384, "window_size": 1024,
                 "pool_heads": 256, "pool_mlp_size": 131072}
MAX_LAYER_SCALE = 1e3  # layer scale starts at 1e-5 to 1 (CaiT, DINOv2/v3); 1e308 overflows the first block
MAX_ROPE_THETA = 1e9  # DINOv3's period is 100, EVA-02's 10,000
# One fused attention call on a CPU does at most this many FLOPs (~0.1 s on 2 cores): between calls Python runs,
# so Ctrl-C and a page's Stop are heard within a second even at 65,537 tokens, where one whole layer's call took a
# minute. Below it (one image of up to ~1,180 tokens on ViT-B) the call stays whole.
FUSED_CHUNK_FLOPS = 2**32


@dataclass(frozen=True)
class ViTConfig:
    # An int for a square, else (height, width) (vit-pytorch's rectangular patches and images); a square pair is
    # stored as its int, so square models and their checkpoints read exactly as before. Read the sides via
    # image_hw / patch_hw: a reader doing int arithmetic on a rectangular model fails loudly, never squarely.
    image_size: int | tuple[int, int] = 32  # the training image; other sizes interpolate positions
    patch_size: int | tuple[int, int] = 4  # 4 px on 32 px images gives an 8x8 grid, small enough for CPUs
    num_channels: int = 3  # 1 for greyscale data such as MNIST
    num_classes: int = 10
    hidden_size: int = 48
    num_layers: int = 4
    num_heads: int = 4
    mlp_size: int = 192  # the paper uses 4 x hidden_size
    dropout: float = 0.0  # after the embeddings, the attention projection and the MLP
    attention_dropout: float = 0.0  # on the attention probabilities (training only)
    drop_path: float = 0.0  # stochastic depth rate of the last block, linear from 0 at the first
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-6  # timm's value; HF's ViT uses 1e-12, set it to load those
    # Imported variants; the defaults are the plain ViT (and keep older checkpoints loading).
    distillation_token: bool = False  # DeiT: a second prefix token after CLS
    distillation_head: bool = False  # DeiT with teacher: a classifier on DIST too, logits the mean of both
    num_register_tokens: int = 0  # DINOv2 / timm reg_token: extra prefix tokens that soak up global attention
    layer_scale: float | None = None  # CaiT / DINOv2: per-channel residual gains, initialised to this value
    pooling: str = "cls"  # what the classifier reads: "cls", "avg" (of patches) or "cls+avg" (DINOv2, concatenated)
    fc_norm: bool = False  # timm's avg-pool models normalise the pooled vector instead of every token
    prefix_positions: str = "all"  # prefix tokens with a position: "all", "cls" (HF DINOv2 registers) or "none"
    pos_embed_antialias: bool = False  # timm and HF DINOv2-registers resample positions with antialias=True
    # 2025-26 families (DINOv3, CLIP, SigLIP, MAE); the defaults are the plain ViT.
    class_token: bool = True  # SigLIP has none: its attention-pooling probe reads the tokens instead
    pos_embed: bool = True  # a learned position table; DINOv3 has none (RoPE only)
    rope: str = "none"  # rotary positions on the patch tokens' q/k: "none", "dinov3" (normalised axial coords) or
    # "eva" (EVA-02: patch-index coords, interleaved channel pairs, beside the learned table)
    rope_theta: float = 100.0  # the base period: DINOv3's 100, EVA-02's 10000
    rope_ref_grid: int = 0  # EVA-02: coords rescaled so any grid spans this many patches (its pre-training grid)
    key_bias: bool = True  # False holds the key's share of the qkv bias at zero (DINOv3's bias_mask, EVA)
    pre_norm: bool = False  # CLIP's ln_pre: a LayerNorm on the embeddings before the first block
    activation: str = "gelu"  # of the MLPs: "gelu" (exact), "gelu_tanh" (SigLIP), "quick_gelu" (OpenAI CLIP), "silu"
    gated_mlp: bool = False  # SwiGLU: act(fc1_g(x)) * fc1(x), then fc2 (DINOv3 7B / H+, EVA-02)
    mlp_norm: bool = False  # EVA-02's LayerNorm inside the MLP, before fc2
    projection_dim: int = 0  # CLIP / SigLIP-free: a bias-free projection of the pooled vector to the joint embedding
    # From-scratch ViTs (tutorials, vit-pytorch); the defaults are the plain ViT.
    post_norm: bool = False  # nn.TransformerEncoderLayer's default (norm_first=False): LN after each residual sum
    final_norm: bool = True  # False: the head reads the last block's output as it is (tintn's, the MNIST tutorial's)
    head_dim: int = 0  # width of each head; 0 is hidden_size / num_heads (vit-pytorch's dim_head sets its own)
    patch_norm: bool = False  # vit-pytorch: a LayerNorm on each flattened patch before its projection and one after
    # Attention layouts (issue 46): what each query may attend to and what is added to its logits; the defaults are
    # global attention with nothing added.
    rel_pos: str = "none"  # a bias on the logits: "none", "beit" (a table per layer), "beit_shared" (one table for
    # every layer, BEiT / Data2Vec-vision), "sam" (SAM / ViTDet's decomposed relative positions, from each query)
    window_size: int = 0  # SAM / ViTDet: side in patches of the windowed layers' square windows; 0: every layer global
    global_layers: tuple[int, ...] = ()  # with window_size: the layers that attend globally (SAM's global_attn_indexes)
    # AIMv2 and Perception Encoder; the defaults are the plain ViT.
    norm: str = "layer"  # every norm of the model: "layer" (LayerNorm) or "rms" (RMSNorm: AIMv2); eps layer_norm_eps
    embed_norm: bool = False  # AIMv2: a norm on the patch embeddings before the positions are added
    proj_bias: bool = True  # False: the attention's output projection and the MLP's linears have no bias (AIMv2)
    pool_head: str = "map"  # the probe of pooling "map": "map" (q projection, then x + mlp(norm(x)); SigLIP, PE) or
    # "aimv2" (HF Aimv2AttentionPoolingHead: the latent is the query as it is, then a projection, nothing after)
    pool_heads: int = 0  # heads of the attention-pooling probe; 0: num_heads (PE's probe has 8 whatever its blocks)
    pool_mlp_size: int = 0  # width of the probe's MLP; 0: mlp_size (PE-G's blocks are wider than its probe's MLP)
    sincos_pos: bool = False  # AIMv2-native: 2D sine-cosine positions computed for each grid instead of a table

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):  # a JSON list from a checkpoint or config file
                if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value):
                    raise ValueError(f"ViTConfig.{name} must be a positive integer or a (height, width) pair of "
                                     f"them, got {str(list(value))[:40]}")
                object.__setattr__(self, name, value[0] if value[0] == value[1] else (value[0], value[1]))
        for name in ("num_channels", "hidden_size", "num_layers", "num_heads", "mlp_size", *(
                n for n in ("image_size", "patch_size") if not isinstance(getattr(self, n), tuple))):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ViTConfig.{name} must be a positive integer, got {value!r}")
        for name in ("num_classes", "num_register_tokens", "projection_dim", "rope_ref_grid", "head_dim",
                     "window_size", "pool_heads", "pool_mlp_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ViTConfig.{name} must be a whole number of at least 0, got {value!r}")
        # Every size a config file may declare is bounded here, before anything is built from it (a config.json
        # with num_labels 10**12 once made the picker build 10**12 class names).
        for name, bound in CONFIG_BOUNDS.items():
            value = getattr(self, name)
            if (max(value) if isinstance(value, tuple) else value) > bound:
                shown = list(value) if isinstance(value, tuple) else f"{value:,}"
                raise ValueError(f"ViTConfig.{name} is {shown}; at most {bound:,} (far beyond any published ViT)")
        if any(i % p for i, p in zip(self.image_hw, self.patch_hw, strict=True)):
            raise ValueError(f"ViTConfig.image_size ({self.image_size}) must be divisible by "
                             f"patch_size ({self.patch_size})")
        if self.hidden_size % self.num_heads and not self.head_dim:
            raise ValueError(f"ViTConfig.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_heads ({self.num_heads})")
        for name in ("dropout", "attention_dropout", "drop_path"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"ViTConfig.{name} must be in [0, 1), got {value!r}")
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"ViTConfig.qkv_bias must be true or false, got {self.qkv_bias!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or not 0 < self.layer_norm_eps < 1:
            raise ValueError(f"ViTConfig.layer_norm_eps must be positive and below 1, got {self.layer_norm_eps!r}")
        for name in ("distillation_token", "distillation_head", "fc_norm", "pos_embed_antialias", "class_token",
                     "pos_embed", "key_bias", "pre_norm", "gated_mlp", "mlp_norm", "post_norm", "final_norm",
                     "patch_norm", "embed_norm", "proj_bias", "sincos_pos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ViTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.distillation_head and not (self.distillation_token and self.num_classes):
            raise ValueError("ViTConfig.distillation_head needs distillation_token and num_classes > 0")
        if self.layer_scale is not None and (isinstance(self.layer_scale, bool)
                                             or not isinstance(self.layer_scale, (int, float))):
            raise ValueError(f"ViTConfig.layer_scale must be a number or null, got {self.layer_scale!r}")
        if self.layer_scale is not None and not abs(self.layer_scale) <= MAX_LAYER_SCALE:  # NaN fails too
            raise ValueError(f"ViTConfig.layer_scale must be a finite number of at most {MAX_LAYER_SCALE:g} in "
                             f"magnitude, got {self.layer_scale!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"ViTConfig.pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.prefix_positions not in PREFIX_POSITIONS:
            raise ValueError(f"ViTConfig.prefix_positions must be one of {', '.join(PREFIX_POSITIONS)}, "
                             f"got {self.prefix_positions!r}")
        if self.rope not in ROPES:
            raise ValueError(f"ViTConfig.rope must be one of {', '.join(ROPES)}, got {self.rope!r}")
        if self.norm not in NORMS:
            raise ValueError(f"ViTConfig.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.pool_head not in POOL_HEADS:
            raise ValueError(f"ViTConfig.pool_head must be one of {', '.join(POOL_HEADS)}, got {self.pool_head!r}")
        if self.sincos_pos and (self.pos_embed or self.hidden_size % 4):
            raise ValueError("ViTConfig.sincos_pos replaces the position table (set pos_embed false) and needs a "
                             f"hidden_size divisible by 4, got {self.hidden_size}")
        if self.pooling == "map" and self.hidden_size % (self.pool_heads or self.num_heads):
            raise ValueError(f"ViTConfig.hidden_size ({self.hidden_size}) must be divisible by pool_heads "
                             f"({self.pool_heads})")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ViTConfig.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) \
                or not 0 < self.rope_theta <= MAX_ROPE_THETA:  # NaN and inf fail too
            raise ValueError(f"ViTConfig.rope_theta must be a positive finite number of at most {MAX_ROPE_THETA:g}, "
                             f"got {self.rope_theta!r}")
        if self.rope != "none" and (self.hidden_size // self.num_heads) % 4:
            raise ValueError(f"ViTConfig.rope needs a head size divisible by 4, got "
                             f"{self.hidden_size // self.num_heads}")
        if not self.class_token and self.pooling in ("cls", "cls+avg"):
            raise ValueError(f"ViTConfig.pooling {self.pooling!r} needs the class token; use avg or map")
        if not self.class_token and self.distillation_token:
            raise ValueError("ViTConfig.distillation_token needs the class token")
        if self.projection_dim and self.num_classes:
            raise ValueError("ViTConfig.projection_dim is for feature models (num_classes=0)")
        if self.prefix_positions == "cls" and not self.class_token:
            raise ValueError("ViTConfig.prefix_positions 'cls' needs the class token")
        self._check_layout()

    def _check_layout(self) -> None:
        if self.rel_pos not in REL_POS:
            raise ValueError(f"ViTConfig.rel_pos must be one of {', '.join(REL_POS)}, got {self.rel_pos!r}")
        if self.rel_pos.startswith("beit") and (not self.class_token or self.num_prefix_tokens != 1):
            raise ValueError("ViTConfig.rel_pos 'beit' needs the class token and no other prefix token (its table "
                             "has three entries for CLS)")
        if (self.rel_pos == "sam" or self.window_size) and self.num_prefix_tokens:
            raise ValueError("ViTConfig.rel_pos 'sam' and window_size need a model without prefix tokens (SAM's)")
        layers = self.global_layers
        if not isinstance(layers, (tuple, list)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.num_layers for i in layers):
            raise ValueError(f"ViTConfig.global_layers must be layer numbers from 0 to {self.num_layers - 1}, got "
                             f"{str(layers)[:60]}")
        object.__setattr__(self, "global_layers", tuple(sorted(set(layers))))  # a JSON list reads back the same
        if layers and not self.window_size:
            raise ValueError("ViTConfig.global_layers needs window_size (the other layers' windows)")
        if self.window_size and self.rope != "none":
            raise ValueError("ViTConfig.window_size with rotary positions is not supported")

    @property
    def image_hw(self) -> tuple[int, int]:
        """The training image's ``(height, width)``."""
        return (self.image_size,) * 2 if isinstance(self.image_size, int) else self.image_size

    @property
    def patch_hw(self) -> tuple[int, int]:
        """A patch's ``(height, width)``."""
        return (self.patch_size,) * 2 if isinstance(self.patch_size, int) else self.patch_size

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.image_hw[0] // self.patch_hw[0], self.image_hw[1] // self.patch_hw[1]

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    def window_of(self, layer: int) -> int:
        """The window side (patches) of layer ``layer``, 0 for a global layer."""
        return 0 if layer in self.global_layers else self.window_size

    @property
    def num_prefix_tokens(self) -> int:
        """CLS, the distillation token and the registers, in that order before the patches."""
        return int(self.class_token) + int(self.distillation_token) + self.num_register_tokens

    @property
    def prefix_token_names(self) -> tuple[str, ...]:
        """Display names of the prefix tokens in order: ('CLS', 'DIST', 'REG 1', ...)."""
        return ((("CLS",) if self.class_token else ()) + (("DIST",) if self.distillation_token else ())
                + tuple(f"REG {i + 1}" for i in range(self.num_register_tokens)))

    @property
    def num_positioned_prefix_tokens(self) -> int:
        """How many of the prefix tokens have an entry in the position table (the first ones)."""
        return {"all": self.num_prefix_tokens, "cls": 1, "none": 0}[self.prefix_positions] if self.pos_embed else 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ViTConfig:
        """Build a config from a plain dict, naming any key this version does not know."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ViTConfig:
        """A named configuration from ``PRESETS``, optionally with some fields changed."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return replace(PRESETS[name], **overrides)


POOLINGS = ("cls", "avg", "cls+avg", "map")  # map: the attention-pooling probe (SigLIP, timm global_pool="map")
PREFIX_POSITIONS = ("all", "cls", "none")
ROPES = ("none", "dinov3", "eva", "pe")  # pe: EVA's, counted from 1 and x before y (Perception Encoder)
REL_POS = ("none", "beit", "beit_shared", "sam")
NORMS = ("layer", "rms")
POOL_HEADS = ("map", "aimv2")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu", "relu")  # relu: nn.TransformerEncoderLayer's default

PRESETS: dict[str, ViTConfig] = {
    # Seed blog (tintn, "ViT from scratch"): 0.12 M parameters, 75.5 % on CIFAR-10.
    "tintn-cifar10": ViTConfig(32, 4, 3, 10, hidden_size=48, num_layers=4, num_heads=4, mlp_size=192),
    # Seed notebook: patch 8, embed 64, MLP ratio 4, dropout 0.1, about 69 % on CIFAR-10.
    "cifar10-p8": ViTConfig(32, 8, 3, 10, hidden_size=64, num_layers=4, num_heads=4, mlp_size=256,
                            dropout=0.1),
    # Seed MNIST ViT: patch 7, d_model 64, 8 heads, 3 layers, FF 2048, 98.5 % on MNIST.
    "mnist-p7": ViTConfig(28, 7, 1, 10, hidden_size=64, num_layers=3, num_heads=8, mlp_size=2048),
    # Ours for CIFAR-size data on CPUs: the seed's 8x8 grid, twice its depth, a wider stream
    # and a narrow MLP (ratio 2) to stay under 0.5 M parameters.
    "cifar-s": ViTConfig(32, 4, 3, 10, hidden_size=96, num_layers=6, num_heads=4, mlp_size=192),
    # Ours for a GPU: the depth-9 / width-192 model of published CIFAR ViTs (2.70 M parameters).
    "cifar-m": ViTConfig(32, 4, 3, 10, hidden_size=192, num_layers=9, num_heads=12, mlp_size=384,
                         drop_path=0.1),
    # Ours for MNIST-size data: 4-px patches give 49 tokens instead of mnist-p7's 16, which
    # learns far faster from few images (our MNIST checkpoint has 8,000) at a sixth the size.
    "mnist-p4": ViTConfig(28, 4, 1, 10, hidden_size=64, num_layers=4, num_heads=4, mlp_size=128),
    # The ViT paper's ImageNet models at 224 px.
    "vit-base-16": ViTConfig(224, 16, 3, 1000, hidden_size=768, num_layers=12, num_heads=12,
                             mlp_size=3072),
    "vit-large-16": ViTConfig(224, 16, 3, 1000, hidden_size=1024, num_layers=24, num_heads=16,
                              mlp_size=4096),
    "vit-huge-14": ViTConfig(224, 14, 3, 1000, hidden_size=1280, num_layers=32, num_heads=16,
                             mlp_size=5120),
}


def resample_pos_embed(pos_embed: torch.Tensor, new_grid: tuple[int, int],
                       old_grid: tuple[int, int], num_prefix_tokens: int = 1, antialias: bool = False
                       ) -> torch.Tensor:
    """Bicubically resize position embeddings ``(1, prefix + gh*gw, D)`` to another patch grid.

    Prefix (CLS) embeddings are kept as they are; the interpolation runs in float32 and
    matches HF ``transformers``' ``interpolate_pos_encoding`` (align_corners=False), or with
    ``antialias`` timm's ``resample_abs_pos_embed`` and HF DINOv2-with-registers (PyTorch's
    antialiased bicubic uses another kernel, so it differs even when upsampling).
    """
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim, dtype = pos_embed.shape[-1], pos_embed.dtype
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(dtype)
    return torch.cat([prefix, grid], dim=1)


def activate(x: torch.Tensor, name: str) -> torch.Tensor:
    """One of ``ACTIVATIONS``: exact GELU, tanh-approximated GELU, OpenAI's QuickGELU ``x * sigmoid(1.702 x)``, SiLU,
    ReLU."""
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "relu":
        return F.relu(x)
    return F.silu(x)


def dinov3_rope(grid: tuple[int, int], head_dim: int, theta: float, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """DINOv3's axial rotary embedding for a patch grid: ``(cos, sin)``, each ``(gh*gw, head_dim)``.

    Patch centres are normalised per axis to [-1, 1], so any H x W is covered without
    interpolation; a quarter of the head's channels rotate with y, a quarter with x, at
    periods ``theta ** (4i / head_dim)``, laid out for ``rotate_half`` (HF ``DINOv3ViTRopePositionEmbedding``).
    """
    gh, gw = grid
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)  # (hd/4,)
    ys = torch.arange(0.5, gh, dtype=torch.float32, device=device) / gh
    xs = torch.arange(0.5, gw, dtype=torch.float32, device=device) / gw
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (gh*gw, 2), row-major
    coords = 2.0 * coords - 1.0
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2)  # (gh*gw, hd/2)
    angles = angles.tile(2)  # (gh*gw, hd)
    return torch.cos(angles), torch.sin(angles)


def eva_rope(grid: tuple[int, int], head_dim: int, theta: float, ref_grid: int = 0,
             device: torch.device | None = None, pe: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """EVA-02's axial rotary embedding (timm ``RotaryEmbeddingCat``, ``in_pixels=False``): ``(cos, sin)``, each
    ``(gh*gw, head_dim)``, for interleaved channel pairs. Coordinates are patch indices, rescaled to ``ref_grid``
    patches per side when given (timm's ``ref_feat_shape``); frequencies ``theta ** -(i / (head_dim / 4))``.
    ``pe``: Perception Encoder's variant (timm ``rope_grid_offset=1``, ``rope_grid_indexing='xy'``): indices
    counted from 1, and the x bands before the y bands."""
    gh, gw = grid
    n = head_dim // 4
    bands = 1.0 / (theta ** (torch.arange(0, n, 1, dtype=torch.int64).to(torch.float32) / n))  # (hd/4,)
    offset = 1.0 if pe else 0.0
    ys = torch.arange(gh, dtype=torch.int64).to(torch.float32) + offset
    xs = torch.arange(gw, dtype=torch.int64).to(torch.float32) + offset
    if ref_grid:
        ys, xs = ys / gh * ref_grid, xs / gw * ref_grid
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)  # (gh, gw, 2): (y, x)
    if pe:
        coords = coords.flip(-1)  # (gh, gw, 2): (x, y), still row-major over the grid
    angles = (coords.unsqueeze(-1) * bands).flatten(-2).flatten(0, -2)  # (gh*gw, hd/2): y bands, then x bands
    angles = angles.repeat_interleave(2, -1).to(device)  # (gh*gw, hd): each angle for a channel pair
    return torch.cos(angles), torch.sin(angles)


def sincos_positions(grid: tuple[int, int], dim: int, device: torch.device | None = None) -> torch.Tensor:
    """AIMv2-native's 2D sine-cosine positions ``(gh*gw, dim)``, laid out ``[sin x | cos x | sin y | cos y]`` at
    periods ``10000 ** (i / (dim / 4))`` (HF ``build_2d_sinusoidal_position_embedding`` with its halves swapped, as
    AIMv2 was trained), computed in float64 as HF does."""
    gh, gw = grid
    n = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(n, dtype=torch.float64) / n)  # (dim/4,)
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                            indexing="ij")  # (gh, gw) each, row-major
    y, x = ys.flatten().outer(omega), xs.flatten().outer(omega)  # (gh*gw, dim/4) each
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).to(device=device, dtype=torch.float32)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...] (interleaved rotation, EVA-02)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], interleaved: bool = False) -> torch.Tensor:
    """Rotate the last ``gh*gw`` tokens of ``x`` (B, nh, T, hd); the prefix tokens (CLS, registers) stay as they are."""
    cos, sin = rope
    n = cos.shape[0]
    prefix, patches = x[:, :, :-n], x[:, :, -n:]  # (B, nh, P, hd), (B, nh, gh*gw, hd)
    turned = rotate_pairs(patches) if interleaved else rotate_half(patches)
    patches = patches * cos.to(x.dtype) + turned * sin.to(x.dtype)
    return torch.cat([prefix, patches], dim=2)


# --- attention layouts: relative position biases and windows ---------------------------------------------------

def beit_relative_position_index(grid: tuple[int, int], rows: torch.Tensor | None = None) -> torch.Tensor:
    """BEiT's ``(1 + gh*gw, 1 + gw*gw)`` index into its table: patch pairs by their offset (row-major over
    ``(2gh-1, 2gw-1)``), then the three CLS entries (CLS to patch, patch to CLS, CLS to CLS) last. With ``rows``
    (token indices, CLS 0), those rows alone, ``(len(rows), 1 + gh*gw)``: a query chunk's, never ``T²``."""
    gh, gw = grid
    rows = torch.arange(gh * gw + 1) if rows is None else rows.cpu()
    coords = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # (2, T)
    queries = coords[:, (rows - 1).clamp(min=0)]  # (2, n): CLS's row is overwritten below
    offsets = (queries[:, :, None] - coords[:, None, :]).permute(1, 2, 0)  # (n, T, 2)
    patches = (offsets[..., 0] + gh - 1) * (2 * gw - 1) + offsets[..., 1] + gw - 1  # (n, T)
    distances = (2 * gh - 1) * (2 * gw - 1)
    index = torch.cat([torch.full((len(rows), 1), distances + 1), patches], dim=1)  # (n, 1 + T): patch to CLS
    cls = rows == 0
    index[cls] = distances  # CLS to patch
    index[cls, 0] = distances + 2
    return index


class RelativePositionBias(nn.Module):
    """BEiT's relative position bias (one per layer, or one shared by all): a learned ``(heads,)`` bias per 2D offset
    between two patches, plus three for the CLS pairs, added to the attention logits. On another grid the offset
    table is resized bilinearly, as HF ``BeitRelativePositionBias`` does (timm resizes only when the model is rebuilt
    for another size)."""

    def __init__(self, grid: tuple[int, int], num_heads: int) -> None:
        super().__init__()
        self.grid = tuple(grid)
        self.table = nn.Parameter(torch.zeros((2 * grid[0] - 1) * (2 * grid[1] - 1) + 3, num_heads))

    def forward(self, grid: tuple[int, int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(nh, 1 + gh*gw, 1 + gh*gw)`` for a patch grid; its rows ``rows`` (token indices) alone,
        ``(nh, len(rows), 1 + gh*gw)``, when given (what a query chunk of the attention needs)."""
        table = self.table
        if tuple(grid) != self.grid:
            (oh, ow), (gh, gw) = self.grid, grid
            offsets = table[:-3].reshape(1, 2 * ow - 1, 2 * oh - 1, -1).permute(0, 3, 1, 2)  # HF's (w, h) reading
            offsets = F.interpolate(offsets, size=(2 * gh - 1, 2 * gw - 1), mode="bilinear")
            table = torch.cat([offsets.permute(0, 2, 3, 1).reshape((2 * gh - 1) * (2 * gw - 1), -1), table[-3:]])
        index = beit_relative_position_index(tuple(grid), rows).to(table.device)  # (n or T, T)
        return table[index.reshape(-1)].view(*index.shape, -1).permute(2, 0, 1)  # (nh, n or T, T)


def sam_rel_pos(q_size: int, k_size: int, table: torch.Tensor) -> torch.Tensor:
    """SAM's ``get_rel_pos``: the ``(q_size, k_size, hd)`` embeddings of every query-key offset along one axis, from a
    ``(L, hd)`` table linearly resized to ``2 * max(q_size, k_size) - 1`` offsets when its length differs."""
    length = 2 * max(q_size, k_size) - 1
    if table.shape[0] != length:
        table = F.interpolate(table.T[None], size=length, mode="linear")[0].T  # (length, hd)
    q_coords = torch.arange(q_size, dtype=torch.float32)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, dtype=torch.float32)[None, :] * max(q_size / k_size, 1.0)
    offsets = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return table[offsets.long().to(table.device)]


def decomposed_rel_pos(q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor, grid: tuple[int, int],
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """SAM / MViTv2's decomposed relative positions (``add_decomposed_rel_pos``): the bias ``(B, nh, n, N)`` that each
    query ``q`` (B, nh, n, hd; unscaled) adds to its logits, ``q . R_h[dy] + q . R_w[dx]``; the queries are the
    tokens ``rows`` of the ``N = gh*gw`` grid (None: all of them, in order)."""
    gh, gw = grid
    B, nh, n, hd = q.shape
    rows = torch.arange(gh * gw, device=q.device) if rows is None else rows.to(q.device)
    rel_h = torch.einsum("bnqc,qkc->bnqk", q, sam_rel_pos(gh, gh, rel_pos_h)[rows // gw])  # (B, nh, n, gh)
    rel_w = torch.einsum("bnqc,qkc->bnqk", q, sam_rel_pos(gw, gw, rel_pos_w)[rows % gw])  # (B, nh, n, gw)
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, nh, n, gh * gw)


def window_partition(x: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """Patch tokens ``(B, gh*gw, D)`` -> non-overlapping windows ``(B * nw, window**2, D)``, the grid first padded
    with zeros at the bottom and right to a multiple of ``window``; windows row-major over the padded grid, each
    row-major inside (timm / SAM ``window_partition``)."""
    B, _, D = x.shape
    gh, gw = grid
    ph, pw = -gh % window, -gw % window
    x = F.pad(x.view(B, gh, gw, D), (0, 0, 0, pw, 0, ph))  # (B, Gh, Gw, D)
    Gh, Gw = gh + ph, gw + pw
    x = x.view(B, Gh // window, window, Gw // window, window, D).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, D)  # (B * nw, window**2, D)


def window_unpartition(windows: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """``window_partition``'s inverse: windows ``(B * nw, window**2, D)`` -> ``(B, gh*gw, D)``, padding dropped."""
    gh, gw = grid
    nh_, nw_ = -(-gh // window), -(-gw // window)  # windows per column and per row
    D = windows.shape[-1]
    x = windows.view(-1, nh_, nw_, window, window, D).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(-1, nh_ * window, nw_ * window, D)[:, :gh, :gw]  # (B, gh, gw, D)
    return x.reshape(-1, gh * gw, D)


# --- hook points and relevance rules --------------------------------------------------------------

Hook = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]  # (tensor, hook point) -> replacement or None


class HookPoint(nn.Module):
    """A named place in the forward (TransformerLens's ``HookPoint``): the identity, unless hooks are set.

    Each hook ``fn(tensor, hook)`` reads the tensor and may return a replacement (None keeps it). ``ViT.hooks``
    sets them for the length of a ``with`` block and for this thread only, so a model shared by several pages
    (``st.cache_resource``) runs unhooked everywhere else; ``name`` is the point's path in the model
    (``blocks.3.attn.hook_pattern``)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    @property
    def fns(self) -> tuple[Hook, ...]:
        """The hooks set on this point in this thread (empty: the point is the identity)."""
        return _hooks.get().get(self, ())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        active = _hooks.get()
        if active:
            for fn in active.get(self, ()):
                out = fn(x, self)
                if out is not None:
                    x = out
        return x

    # Called directly, without nn.Module's call machinery (its global-hook checks cost more than the identity):
    # with no hooks set a point costs one ContextVar lookup. torch's own module hooks are not used here.
    __call__ = forward


_hooks: ContextVar[Mapping[HookPoint, tuple[Hook, ...]]] = ContextVar("vit_hooks", default=MappingProxyType({}))


class Rules:
    """The elementary operations whose backward a relevance method replaces (lxt's approach), as their plain
    versions. ``vit.explain.relevance`` subclasses it (AttnLRP, CP-LRP) and makes it current for a ``with``
    block (``use_rules``); the forward values stay the model's own, only the gradients change."""

    def layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def rms_norm(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)

    def activation(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return activate(x, name)

    def product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """An element-wise product of two activations: SwiGLU's gate ``a`` times its linear branch ``b``."""
        return a * b

    def attention_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (after rotary positions) and v ``(B, nh, T, hd)`` as the two attention matmuls take them."""
        return q, k, v

    def divide_by_norm(self, x: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """An L2 normalisation ``x / norm`` (a prompt head's cosine)."""
        return x / norm

    def logit_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """What a layer adds to its attention logits (BEiT's table, SAM's relative positions of the queries)."""
        return bias


PLAIN_RULES = Rules()
_rules: ContextVar[Rules] = ContextVar("vit_rules", default=PLAIN_RULES)  # per thread: a page's other runs unaffected


def current_rules() -> Rules:
    """The rules in effect in this thread: ``PLAIN_RULES`` outside a ``use_rules`` block."""
    return _rules.get()


@contextlib.contextmanager
def use_rules(rules: Rules) -> Iterator[Rules]:
    """Every ``ViT`` forward in this ``with`` block (in this thread) runs its elementary operations by ``rules``."""
    token = _rules.set(rules)
    try:
        yield rules
    finally:
        _rules.reset(token)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state-dict keys) that runs under the current relevance rules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = _rules.get()
        if rules is PLAIN_RULES:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return rules.layer_norm(x, self)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (one ``weight``, no bias: AIMv2's) that runs under the current relevance rules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = _rules.get()
        if rules is PLAIN_RULES:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return rules.rms_norm(x, self)


def make_norm(config: ViTConfig, size: int) -> LayerNorm | RMSNorm:
    """The config's norm (``ViTConfig.norm``) over ``size`` channels."""
    if config.norm == "rms":
        return RMSNorm(size, eps=config.layer_norm_eps)
    return LayerNorm(size, eps=config.layer_norm_eps)


class Parent(nn.Module):
    """An ``nn.Module`` whose children are plain attributes too, so ``self.attn`` or ``self.hook_q`` is a dict
    lookup: nn.Module finds them through ``__getattr__``, after a failed instance lookup, which costs as much as
    ~30 function calls (measured here: 5 us against 0.2 us); with 65 hook points that made a cifar-s forward 8 %
    slower than before them. ``_modules`` stays the record (state dicts, ``named_modules``); the copy in
    ``__dict__`` follows every assignment and deletion."""

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            self.__dict__[name] = modules[name]

    def __delattr__(self, name: str) -> None:
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            self.__dict__.pop(name, None)
        super().__delattr__(name)


class Attention(Parent):
    """Multi-head self-attention with one fused qkv projection and two paths.

    Without ``output_attentions`` it calls ``scaled_dot_product_attention`` (fast, never
    materialises the probabilities); with it, the explicit softmax, whose probabilities
    are returned and stay in the autograd graph for gradient-weighted maps. Rotary
    positions, when given, turn q and k before either path, so the probabilities are the
    ones the model computed.
    """

    def __init__(self, config: ViTConfig, window: int = 0) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_heads
        inner = self.num_heads * self.head_dim  # hidden_size unless head_dim is set apart
        self.qkv = nn.Linear(config.hidden_size, 3 * inner, bias=config.qkv_bias)
        self.key_bias = config.key_bias
        self.rope_interleaved = config.rope in ("eva", "pe")
        self.proj = nn.Linear(inner, config.hidden_size, bias=config.proj_bias)
        self.attention_dropout = config.attention_dropout
        self.proj_dropout = nn.Dropout(config.dropout)
        # What this layer adds to its logits: BEiT's own table (a shared one comes from the model), or SAM's
        # decomposed relative positions, sized for its windows or, in a global layer, the model's grid.
        self.rel_pos_bias = (RelativePositionBias(config.grid_size, config.num_heads) if config.rel_pos == "beit"
                             else None)
        side = window or config.grid_size[0]
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * side - 1, self.head_dim)) if config.rel_pos == "sam" else None
        self.rel_pos_w = (nn.Parameter(torch.zeros(2 * (window or config.grid_size[1]) - 1, self.head_dim))
                          if config.rel_pos == "sam" else None)
        # (B, nh, T, hd) each, q and k after rotary positions; the bias (B or 1, nh, T, T) added to the scaled logits
        # before the softmax (only in models with one); the pattern (B, nh, T, T) exists only when it is asked for or
        # hooked (else the fused path runs); z (B, T, nh, hd) is each head's context. In a windowed layer B counts
        # windows (B * nw) and T a window's tokens.
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_bias = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def qkv_bias(self) -> torch.Tensor | None:
        """The qkv bias as used: the key's third zeroed when ``key_bias`` is off (DINOv3's ``bias_mask``)."""
        bias = self.qkv.bias
        if bias is None or self.key_bias:
            return bias
        q, _, v = bias.chunk(3)
        return torch.cat([q, torch.zeros_like(q), v])

    def queries_keys_values(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` (B, N, C) -> q, k, v (B, nh, N, hd) each, unscaled, with rotary positions applied to q and k."""
        B, N, C = x.shape
        qkv = F.linear(x, self.qkv.weight, self.qkv_bias())
        qkv = qkv.view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, nh, N, hd)
        q, k, v = qkv.unbind(0)  # each (B, nh, N, hd)
        if rope is not None:
            q, k = apply_rope(q, rope, self.rope_interleaved), apply_rope(k, rope, self.rope_interleaved)
        return q, k, v

    def logit_bias(self, q: torch.Tensor, grid: tuple[int, int] | None, shared: torch.Tensor | None,
                   rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """What this layer adds to its logits: the model's ``shared`` BEiT bias (nh, N, N) plus its own table's for
        the patch ``grid`` (1, nh, N, N), or SAM's decomposed relative positions of the queries ``q`` (B, nh, N, hd;
        all N of them) (B, nh, N, N); None when nothing is added. With ``rows`` (token indices), the rows of those
        queries alone, ``q`` and ``shared`` holding only theirs: (B or 1, nh, n, N)."""
        bias = shared
        if self.rel_pos_bias is not None:
            own = self.rel_pos_bias(grid, rows)  # (nh, n or N, N)
            bias = own if bias is None else bias + own
        if bias is not None:
            bias = bias[None].to(q.dtype)  # (1, nh, N, N)
        if self.rel_pos_h is not None:
            bias = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, grid, rows)  # (B, nh, n or N, N)
        return bias

    def forward(self, x: torch.Tensor, output_attentions: bool = False,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, queries: int | None = None,
                grid: tuple[int, int] | None = None, shared_bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, N, C) -> the attention's output (B, n, C) and its probabilities (B, nh, n, N) when asked, for
        the first ``n = queries`` tokens' queries (None: all N) against every key. ``grid``: the patch grid of the
        tokens (a window's, in a windowed layer), which a relative position bias needs; ``shared_bias`` (nh, N, N):
        the bias every layer adds (BEiT's shared table)."""
        B, N, C = x.shape
        q, k, v = self.queries_keys_values(x, rope)  # each (B, nh, N, hd)
        if queries is not None:
            if self.rel_pos_h is not None:
                raise ValueError("SAM's relative positions read every query; run the layer on all of them")
            q = q[:, :, :queries]  # (B, nh, n, hd)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        bias = self.logit_bias(q, grid, shared_bias)  # (B or 1, nh, N, N) or None
        if bias is not None:
            bias = self.hook_bias(bias[:, :, :q.shape[2]])  # (B or 1, nh, n, N)
        rules = _rules.get()
        if rules is not PLAIN_RULES:
            q, k, v = rules.attention_inputs(q, k, v)
            bias = None if bias is None else rules.logit_bias(bias)
        dropout_p = self.attention_dropout if self.training else 0.0
        pattern = self.hook_pattern
        if output_attentions or pattern in _hooks.get():  # the probabilities are asked for, or hooked
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, n, N)
            if bias is not None:
                scores = scores + bias
            probs = pattern(scores.softmax(dim=-1))
            y = F.dropout(probs, dropout_p, self.training) @ v  # (B, nh, n, hd)
        else:
            probs = None
            y = fused_attention(q, k, v, dropout_p, bias)  # (B, nh, n, hd)
        z = self.hook_z(y.transpose(1, 2))  # (B, n, nh, hd): each head's context, before the projection
        return self.proj_dropout(self.proj(z.reshape(B, q.shape[2], -1))), probs if output_attentions else None


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` of q (B, nh, n, hd) against k, v (B, nh, N, hd), ``bias`` (B or 1, nh, n,
    N) added to the logits: on a CPU in query chunks of at most ``FUSED_CHUNK_FLOPS`` each (a row's softmax runs
    along the keys, which every chunk holds whole, so each chunk is exactly those rows of the whole call); on a
    GPU whole, as its calls return at once."""
    B, nh, n, hd = q.shape
    rows = max(1, FUSED_CHUNK_FLOPS // (4 * B * nh * k.shape[2] * hd))
    if q.device.type != "cpu" or rows >= n:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    return torch.cat([F.scaled_dot_product_attention(q[:, :, s:s + rows], k, v, dropout_p=dropout_p,
                                                     attn_mask=None if bias is None else bias[:, :, s:s + rows])
                      for s in range(0, n, rows)], dim=2)  # (B, nh, n, hd)


class MLP(Parent):
    """fc1, activation, fc2; gated (SwiGLU: ``act(fc1_g(x)) * fc1(x)``) and with EVA's inner norm when configured."""

    def __init__(self, config: ViTConfig, size: int = 0) -> None:
        super().__init__()
        self.activation = config.activation
        size, bias = size or config.mlp_size, config.proj_bias  # size: the pooling probe's own MLP width (PE-G)
        self.fc1_g = nn.Linear(config.hidden_size, size, bias=bias) if config.gated_mlp else None
        self.fc1 = nn.Linear(config.hidden_size, size, bias=bias)
        self.norm = make_norm(config, size) if config.mlp_norm else None
        self.fc2 = nn.Linear(size, config.hidden_size, bias=bias)
        self.dropout = nn.Dropout(config.dropout)
        self.hook_pre = HookPoint()  # (B, T, mlp): what the activation reads (the gate's, for SwiGLU)
        self.hook_pre_linear = HookPoint()  # SwiGLU's ungated branch fc1(x)
        self.hook_post = HookPoint()  # the activations (gated), before EVA's norm and fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = _rules.get()
        if self.fc1_g is None:
            pre = self.hook_pre(self.fc1(x))
            h = activate(pre, self.activation) if rules is PLAIN_RULES else rules.activation(pre, self.activation)
        else:
            h = rules.product(rules.activation(self.hook_pre(self.fc1_g(x)), self.activation),
                              self.hook_pre_linear(self.fc1(x)))
        h = self.hook_post(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.dropout(self.fc2(self.dropout(h)))


class AttentionPool(Parent):
    """Multi-head attention pooling ("MAP", SigLIP's and PE's head; timm ``AttentionPoolLatent``): a learned probe
    attends to every token, then ``x + mlp(norm(x))``; AIMv2's (``pool_head="aimv2"``) has no q projection and
    nothing after its output projection. Its attention is returned like a layer's, ``(B, nh, 1, T)`` (``nh`` the
    probe's heads): the map of what the model reads for its embedding, where others have a CLS row."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.pool_heads or config.num_heads
        self.head_dim = d // self.num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        full = config.pool_head == "map"
        self.q = nn.Linear(d, d) if full else None
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.norm = make_norm(config, d) if full else None
        self.mlp = MLP(config, config.pool_mlp_size) if full else None
        self.hook_k, self.hook_v = HookPoint(), HookPoint()  # (B, nh, T, hd)
        self.hook_pattern = HookPoint()  # (B, nh, 1, T): the probe's attention

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, T, D) -> pooled (B, D), probe attention (B, nh, 1, T)."""
        B, N, C = x.shape
        latent = self.q(self.latent) if self.q is not None else self.latent  # (1, 1, C)
        q = latent.view(1, 1, self.num_heads, self.head_dim).transpose(1, 2)  # (1, nh, 1, hd)
        kv = self.kv(x).view(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (2, B, nh, N, hd)
        k, v = kv.unbind(0)  # each (B, nh, N, hd)
        k, v = self.hook_k(k), self.hook_v(v)
        rules = _rules.get()
        if rules is not PLAIN_RULES:  # the probe's two matmuls take the attention rules, as in a layer
            q, k, v = rules.attention_inputs(q, k, v)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, 1, N)
        probs = self.hook_pattern(scores.softmax(dim=-1))
        y = (probs @ v).transpose(1, 2).reshape(B, 1, C)  # (B, 1, C)
        y = self.proj(y)
        if self.mlp is not None:
            y = y + self.mlp(self.norm(y))
        return y[:, 0], probs


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample, rescale the kept ones."""
    if rate == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - rate)
    return x * keep / (1.0 - rate)


class Block(Parent):
    """Pre-norm encoder block: x + MSA(LN(x)), then x + MLP(LN(x)) (each branch times its layer scale, if any);
    with ``post_norm``: LN(x + MSA(x)), then LN(x + MLP(x))."""

    def __init__(self, config: ViTConfig, drop_path_rate: float = 0.0, window: int = 0) -> None:
        super().__init__()
        self.window = window  # SAM / ViTDet: the attention runs in window x window patches; 0: globally
        # Post-norm blocks normalise the residual stream after each sum instead (post_norm1/2); norm1 and norm2
        # are then identities, so norm1(x) is still what the attention reads.
        d = config.hidden_size
        self.norm1 = nn.Identity() if config.post_norm else make_norm(config, d)
        self.attn = Attention(config, window)
        self.norm2 = nn.Identity() if config.post_norm else make_norm(config, d)
        self.mlp = MLP(config)
        post = config.post_norm
        self.post_norm1 = make_norm(config, d) if post else None
        self.post_norm2 = make_norm(config, d) if post else None
        self.drop_path_rate = drop_path_rate
        # Layer scale (CaiT, DINOv2): a learned per-channel gain on each residual branch.
        scale = config.layer_scale
        self.ls1 = nn.Parameter(torch.full((config.hidden_size,), float(scale))) if scale is not None else None
        self.ls2 = nn.Parameter(torch.full((config.hidden_size,), float(scale))) if scale is not None else None
        # Each (B, T, D): the block's input, norm1(x), the attention branch as added (after layer scale), the
        # stream between the branches, norm2(mid), the MLP branch as added, the block's output.
        self.hook_resid_pre, self.hook_attn_in, self.hook_attn_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_in, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: torch.Tensor, output_attentions: bool = False,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, queries: int | None = None,
                grid: tuple[int, int] | None = None, shared_bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, T, D) -> the block's output for its first ``queries`` tokens (None: all), which attend to
        every token, and the attention (B, nh, queries or T, T) when asked; a windowed block's is each window's,
        ``(B * nw, nh, w*w, w*w)`` (``window_partition``'s order). ``grid``: the patch grid (needed by windows and
        relative positions); ``shared_bias``: the bias every layer adds (BEiT's shared table)."""
        x = self.hook_resid_pre(x)
        h = self.hook_attn_in(self.norm1(x))
        if self.window:
            if grid is None:
                raise ValueError("this model attends within windows, so the patch grid must be given")
            w = self.window
            y, probs = self.attn(window_partition(h, grid, w), output_attentions, rope, None, (w, w), shared_bias)
            y = window_unpartition(y, grid, w)[:, :queries]  # (B, T or queries, D)
        else:
            y, probs = self.attn(h, output_attentions, rope, queries, grid, shared_bias)
        if queries is not None:
            x = x[:, :queries]  # (B, n, D)
        if self.ls1 is not None:
            y = y * self.ls1
        x = x + drop_path(self.hook_attn_out(y), self.drop_path_rate, self.training)
        if self.post_norm1 is not None:
            x = self.post_norm1(x)
        x = self.hook_resid_mid(x)
        y = self.mlp(self.hook_mlp_in(self.norm2(x)))
        if self.ls2 is not None:
            y = y * self.ls2
        x = x + drop_path(self.hook_mlp_out(y), self.drop_path_rate, self.training)
        if self.post_norm2 is not None:
            x = self.post_norm2(x)
        return self.hook_resid_post(x), probs


@dataclass
class Encoding:
    """Everything one pass computes (``ViT.encode``); tensors keep the autograd graph when it was on."""

    logits: torch.Tensor | None  # (B, classes), None without a classifier
    embedding: torch.Tensor  # (B, E): the pooled vector, projected to the joint embedding when the model has one
    attentions: tuple[torch.Tensor, ...] | None  # per layer (B, nh, T, T), a windowed one's (B * nw, nh, w*w, w*w)
    pool_attention: torch.Tensor | None  # (B, nh, 1, T): the attention-pooling probe's, for pooling "map"


class ViT(Parent):
    """Patch embedding, prefix tokens, positions (a learned table and/or rotary), pre-norm blocks, pooling,
    and a classifier or a projection to a joint embedding."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.num_prefix_tokens = config.num_prefix_tokens  # CLS (+ DIST) (+ registers)
        d = config.hidden_size
        self.patch_embed = nn.Conv2d(config.num_channels, d, config.patch_hw, config.patch_hw)
        patch_dim = config.num_channels * config.patch_hw[0] * config.patch_hw[1]
        self.patch_norm = make_norm(config, patch_dim) if config.patch_norm else None
        # After the patch projection: vit-pytorch's second LayerNorm, AIMv2's RMSNorm.
        self.embed_norm = make_norm(config, d) if config.patch_norm or config.embed_norm else None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if config.distillation_token else None
        self.reg_token = (nn.Parameter(torch.zeros(1, config.num_register_tokens, d))
                          if config.num_register_tokens else None)
        self.pos_embed = (nn.Parameter(torch.zeros(1, config.num_positioned_prefix_tokens + config.num_patches, d))
                          if config.pos_embed else None)
        self.norm_pre = make_norm(config, d) if config.pre_norm else None
        self.pos_dropout = nn.Dropout(config.dropout)
        rates = [config.drop_path * i / max(config.num_layers - 1, 1) for i in range(config.num_layers)]
        self.blocks = nn.ModuleList(Block(config, rate, config.window_of(i)) for i, rate in enumerate(rates))
        self.rel_pos_bias = (RelativePositionBias(config.grid_size, config.num_heads)
                             if config.rel_pos == "beit_shared" else None)  # one table every layer adds
        # timm's avg-pool models normalise the pooled vector (fc_norm) instead of every token (norm).
        final = config.final_norm and not config.fc_norm
        self.norm = make_norm(config, d) if final else nn.Identity()
        self.fc_norm = make_norm(config, d) if config.fc_norm else None
        self.attn_pool = AttentionPool(config) if config.pooling == "map" else None
        head_in = 2 * d if config.pooling == "cls+avg" else d
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else None
        self.head_dist = nn.Linear(d, config.num_classes) if config.distillation_head else None
        self.projection = nn.Linear(head_in, config.projection_dim, bias=False) if config.projection_dim else None
        self.apply(_init_weights)
        for token in (self.pos_embed, self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=0.02)
        # The embedding before ln_pre (B, T, D); the last block's output after the final norm (B, T, D); the pooled
        # vector after fc_norm (B, D); the logits (B, classes); the (projected) embedding (B, E).
        self.hook_embed, self.hook_normed, self.hook_pooled = HookPoint(), HookPoint(), HookPoint()
        self.hook_logits, self.hook_embedding = HookPoint(), HookPoint()
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name

    def hook_points(self) -> dict[str, HookPoint]:
        """Every hook point by name (``blocks.0.attn.hook_q``, ..., ``hook_logits``); the shapes are in the comments
        where each is made (``Attention``, ``MLP``, ``Block``, ``ViT.__init__``)."""
        return {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}

    @contextlib.contextmanager
    def hooks(self, hooks: Iterable[tuple[str, Hook]]) -> Iterator[ViT]:
        """Set ``hooks`` ``(name, fn)`` for the length of a ``with`` block, in this thread (TransformerLens's
        ``hooks``); several on one point run in the order given. An unknown name raises ValueError."""
        points = self.hook_points()
        active = {point: list(fns) for point, fns in _hooks.get().items()}
        for name, fn in hooks:
            if name not in points:
                raise ValueError(f"the model has no hook point {name!r}; see ViT.hook_points()")
            active.setdefault(points[name], []).append(fn)
        token = _hooks.set({point: tuple(fns) for point, fns in active.items()})
        try:
            yield self
        finally:
            _hooks.reset(token)

    def run_with_hooks(self, images: torch.Tensor, hooks: Iterable[tuple[str, Hook]],
                       output_attentions: bool = False) -> Encoding:
        """``encode(images)`` with ``hooks`` ``(name, fn)`` set: each reads its tensor and may replace it."""
        with self.hooks(hooks):
            return self.encode(images, output_attentions)

    def run_with_cache(self, images: torch.Tensor, names: Sequence[str] | Callable[[str], bool],
                       output_attentions: bool = False) -> tuple[Encoding, dict[str, torch.Tensor]]:
        """``encode(images)`` and the tensors at the hook points ``names`` (or those a filter accepts), as the
        forward computed them: still in the autograd graph when gradients are on (gradients with respect to a
        cached ``hook_pattern`` are the attention's)."""
        points = self.hook_points()
        chosen = [n for n in points if names(n)] if callable(names) else list(names)
        cache: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook: HookPoint) -> None:
            cache[hook.name] = x

        encoding = self.run_with_hooks(images, [(name, keep) for name in chosen], output_attentions)
        return encoding, cache

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid of an input of this size; raises ValueError when it does not tile."""
        ph, pw = self.config.patch_hw
        if height % ph or width % pw or height < ph or width < pw:
            raise ValueError(f"input of {height}x{width} px does not tile into {ph}x{pw} patches; "
                             f"resize it to a multiple of {ph if ph == pw else f'{ph} px in height and {pw} in width'}")
        return height // ph, width // pw

    def rotary(self, grid: tuple[int, int], device: torch.device | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary embedding ``(cos, sin)`` (each ``(gh*gw, head_dim)``) every block uses on this grid, or None."""
        if self.config.rope == "none":
            return None
        c = self.config
        if c.rope in ("eva", "pe"):
            return eva_rope(grid, c.hidden_size // c.num_heads, float(c.rope_theta), c.rope_ref_grid, device,
                            pe=c.rope == "pe")
        return dinov3_rope(grid, c.hidden_size // c.num_heads, float(c.rope_theta), device)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` (B, C, H, W) -> the first block's input ``(B, T, D)``: patches, prefix tokens, positions
        (``hook_embed``), then ``ln_pre`` when the model has one.

        Positions are resampled to the input's patch grid; dropout is left to ``forward``.
        """
        if images.dim() != 4 or images.shape[1] != self.config.num_channels:
            raise ValueError(f"expected images of shape (batch, {self.config.num_channels}, height, "
                             f"width), got {tuple(images.shape)}")
        c = self.config
        B = images.shape[0]
        grid = self.patch_grid(images.shape[2], images.shape[3])
        if self.patch_norm is None:
            x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, gh*gw, D)
            if self.embed_norm is not None:
                x = self.embed_norm(x)
        else:  # the convolution as a linear map of each flattened patch, between vit-pytorch's two LayerNorms
            patches = F.unfold(images, c.patch_hw, stride=c.patch_hw).transpose(1, 2)  # (B, gh*gw, C*ph*pw)
            x = F.linear(self.patch_norm(patches), self.patch_embed.weight.flatten(1), self.patch_embed.bias)
            x = self.embed_norm(x)  # (B, gh*gw, D)
        positioned = c.num_positioned_prefix_tokens
        prefix = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        prefix = torch.cat(prefix, dim=1).expand(B, -1, -1) if prefix else x[:, :0]  # (B, P, D)
        if self.pos_embed is None:
            if c.sincos_pos:
                x = x + sincos_positions(grid, x.shape[-1], x.device).to(x.dtype)  # (B, gh*gw, D)
            x = torch.cat([prefix, x], dim=1)  # (B, P + gh*gw, D)
        else:
            pos = resample_pos_embed(self.pos_embed, grid, c.grid_size, positioned, c.pos_embed_antialias)
            # The first `positioned` prefix tokens get their table entries, the others none (registers
            # in HF DINOv2, every prefix token in timm's no_embed_class models).
            x = torch.cat([prefix[:, :positioned], x], dim=1) + pos  # (B, positioned + gh*gw, D)
            if positioned < self.num_prefix_tokens:
                x = torch.cat([x[:, :positioned], prefix[:, positioned:], x[:, positioned:]], dim=1)  # (B, T, D)
        x = self.hook_embed(x)
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        return x

    def tokens(self, images: torch.Tensor, output_attentions: bool = False
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """``images`` (B, C, H, W) -> the last block's output (B, T, D) and, when asked for, every layer's
        attention (B, nh, T, T)."""
        x = self.pos_dropout(self.embed(images))  # (B, T, D)
        return self.run_blocks(x, self.patch_grid(images.shape[2], images.shape[3]), 0, None, output_attentions)

    def run_blocks(self, x: torch.Tensor, grid: tuple[int, int] | None, start: int = 0, stop: int | None = None,
                   output_attentions: bool = False, queries: int | None = None
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Blocks ``start`` to ``stop`` (exclusive; None: the last) on the residual stream ``x`` (B, T, D) of an
        input whose patch grid is ``grid`` (needed by rotary positions; None for a model without them), with
        their hook points: TransformerLens's ``start_at_layer`` / ``stop_at_layer``, so an intervention on layer
        ``l`` runs only the layers after it. Returns the last one's output and their attentions when asked.

        ``queries``: the last block computes only its first ``queries`` tokens (their queries against every key;
        its output and attention then have that many rows): all ``classify`` reads when ``readout_tokens`` says so,
        and three quarters of that block's work saved (the rows' values are the full run's, up to rounding)."""
        rope = None
        if self.config.rope != "none":
            if grid is None:
                raise ValueError("this model turns q and k by rotary positions, so the patch grid must be given")
            rope = self.rotary(tuple(grid), x.device)
        c = self.config
        if grid is None and (c.rel_pos != "none" or c.window_size):
            raise ValueError("this model's attention layout (relative positions, windows) needs the patch grid")
        grid = None if grid is None else tuple(grid)
        shared = self.rel_pos_bias(grid) if self.rel_pos_bias is not None else None  # (nh, T, T), once per forward
        attentions = []
        blocks = list(self.blocks)[start:stop]  # not self.blocks[start:stop]: that builds a ModuleList
        for i, block in enumerate(blocks):
            x, probs = block(x, output_attentions, rope, queries if i == len(blocks) - 1 else None, grid, shared)
            attentions.append(probs)
        return x, tuple(attentions) if output_attentions else None

    def pool(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's output ``(B, T, D)`` -> the pooled vector (B, D) (2D for cls+avg) after the final
        norm, pooling and fc_norm, and the pooling probe's attention (B, nh, 1, T) for pooling "map" (else None)."""
        x = self.hook_normed(self.norm(x))
        patches = x[:, self.num_prefix_tokens:]  # (B, gh*gw, D)
        probe = None
        if self.config.pooling == "cls":
            pooled = x[:, 0]  # (B, D)
        elif self.config.pooling == "avg":
            pooled = patches.mean(dim=1)  # (B, D)
        elif self.config.pooling == "map":
            pooled, probe = self.attn_pool(x)  # (B, D), (B, nh, 1, T)
        else:  # "cls+avg"
            pooled = torch.cat([x[:, 0], patches.mean(dim=1)], dim=-1)  # (B, 2D)
        if self.fc_norm is not None:
            pooled = self.fc_norm(pooled)
        return self.hook_pooled(pooled), probe

    def _logits(self, x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor | None:
        if self.head is None:
            return None
        logits = self.head(pooled)  # (B, classes)
        if self.head_dist is not None:  # DeiT at inference: the mean of the class and distillation heads
            logits = (logits + self.head_dist(self.norm(x)[:, 1])) / 2
        return self.hook_logits(logits)

    def readout_tokens(self) -> int | None:
        """How many leading tokens of the last block's output ``classify`` reads: 1 (CLS) or 2 (CLS and DeiT's
        DIST), or None when it reads them all (average or attention pooling)."""
        if self.config.pooling != "cls":
            return None
        return 2 if self.head_dist is not None else 1

    def classify(self, x: torch.Tensor) -> torch.Tensor | None:
        """The last block's output ``(B, T, D)`` -> logits ``(B, classes)``: final norm, pooling, fc_norm and
        head(s); None for a model without a classifier."""
        if self.head is None:
            return None
        return self._logits(x, self.pool(x)[0])

    def encode(self, images: torch.Tensor, output_attentions: bool = False) -> Encoding:
        """One pass over ``images`` (B, C, H, W): logits, the (projected) embedding, and when asked for every
        layer's attention and the pooling probe's (see ``Encoding``)."""
        x, attentions = self.tokens(images, output_attentions)
        pooled, probe = self.pool(x)
        embedding = self.hook_embedding(self.projection(pooled) if self.projection is not None else pooled)  # (B, E)
        return Encoding(self._logits(x, pooled), embedding, attentions, probe if output_attentions else None)

    def forward(self, images: torch.Tensor, output_attentions: bool = False
                ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...] | None]:
        """``images`` (B, C, H, W) -> logits (B, classes) (None without a head), attentions (per layer
        (B, nh, T, T)) or None."""
        x, attentions = self.tokens(images, output_attentions)
        return self.classify(x), attentions


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        # As a linear layer on the flattened patch (timm's lecun-normal-ish choice).
        nn.init.trunc_normal_(module.weight, std=math.sqrt(1.0 / module.weight[0].numel()))
        nn.init.zeros_(module.bias)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
