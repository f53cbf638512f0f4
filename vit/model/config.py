"""The configuration: ``ViTConfig``, its bounds and ``PRESETS``, the named configurations."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

# Upper bounds of every size a config may declare: far beyond published ViTs (ViT-22B: hidden 6144, 48 layers,
# 48 heads, MLP 24576; ImageNet-21k: 21,843 classes), so only absurd or hostile configs meet them.
CONFIG_BOUNDS = {"image_size": 8192, "patch_size": 1024, "num_channels": 16, "hidden_size": 16384, "num_layers": 256,
                 "num_heads": 256, "mlp_size": 131072, "num_classes": 100_000, "num_register_tokens": 256,
                 "projection_dim": 16384, "rope_ref_grid": 1024, "head_dim": 16384, "window_size": 1024,
                 "pool_heads": 256, "pool_mlp_size": 131072, "max_num_patches": 65536, "spatial_merge": 16,
                 "num_frames": 1024, "tubelet_size": 64, "pool_layers": 64}
MAX_LAYER_SCALE = 1e3  # layer scale starts at 1e-5 to 1 (CaiT, DINOv2/v3); 1e308 overflows the first block
MAX_ROPE_THETA = 1e9  # DINOv3's period is 100, EVA-02's 10,000
# Mimetic initialisation's (alpha1, beta1, alpha2, beta2) for ViTs on CIFAR (Trockman & Kolter 2023, section 4).
MIMETIC_DEFAULTS = (0.7, 0.7, 0.4, 0.4)
MAX_MIMETIC = 10.0  # the paper's alphas and betas lie in [0, 1]; far larger ones only blow the logits up

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
    drop_path_schedule: str = "linear"  # "uniform": drop_path in every block (Lee et al. 2021's shared DropPath)
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
    rope: str = "none"  # rotary positions on the patch tokens' q/k: "none", "dinov3" (normalised axial coords),
    # "eva" (EVA-02: patch-index coords, interleaved channel pairs, beside the learned table), "pe", "qwen" or
    # "vjepa2" (V-JEPA 2's over (time, row, col) of a clip's tubelets; ROPES)
    rope_theta: float = 100.0  # the base period: DINOv3's 100, EVA-02's 10000
    rope_ref_grid: int = 0  # EVA-02: coords rescaled so any grid spans this many patches (its pre-training grid);
    # V-JEPA 2: the square grid (crop_size / patch_size) a token's (time, row, col) is read off its index on
    key_bias: bool = True  # False holds the key's share of the qkv bias at zero (DINOv3's bias_mask, EVA)
    pre_norm: bool = False  # CLIP's ln_pre: a LayerNorm on the embeddings before the first block
    activation: str = "gelu"  # of the MLPs: "gelu" (exact), "gelu_tanh" (SigLIP), "quick_gelu" (OpenAI CLIP), "silu"
    gated_mlp: bool = False  # SwiGLU: act(fc1_g(x)) * fc1(x), then fc2 (DINOv3 7B / H+, EVA-02)
    mlp_norm: bool = False  # EVA-02's LayerNorm inside the MLP, before fc2
    projection_dim: int = 0  # CLIP / SigLIP-free: a bias-free projection of the pooled vector to the joint embedding
    # The towers of vision-language models (vit.sources.vlm.import_vlm): the projector that maps the tower's tokens to
    # the language model's input embeddings (ViT.project, vit.model.blocks.Projector); the defaults: none.
    projector: str = "none"  # "mlp" (LLaVA: linear, activation, linear), "linear" (PaliGemma), "qwen" (Qwen-VL's
    # merger: each token normed, each spatial_merge unit's tokens concatenated, then an mlp), "gemma3" (an
    # average pool over the grid, Gemma's RMSNorm, a bias-free linear) or "internvl" (InternVL's pixel shuffle:
    # each projector_unit unit's tokens concatenated, then LayerNorm, linear, activation, linear); PROJECTORS
    projector_dim: int = 0  # the language model's width, what each of its image tokens has
    projector_skip: int = 0  # leading tokens the projector leaves out (LLaVA's "default" strategy: 1, the CLS)
    projector_pool: int = 0  # gemma3: the average pool's side in patches (4: a 64 x 64 grid -> 16 x 16 tokens)
    projector_activation: str = "gelu"  # mlp: between its linears (LLaVA's projector_hidden_act)
    projector_bias: bool = True  # mlp: LLaVA's multimodal_projector_bias
    projector_unit: int = 0  # internvl: the pixel shuffle's unit side in patches (1 / downsample_ratio: 2)
    qk_norm: bool = False  # InternViT-6B: q and k each RMS-normed over all heads' channels before the heads split
    # From-scratch ViTs (tutorials, vit-pytorch); the defaults are the plain ViT.
    post_norm: bool = False  # nn.TransformerEncoderLayer's default (norm_first=False): LN after each residual sum
    final_norm: bool = True  # False: the head reads the last block's output as it is (tintn's, the MNIST tutorial's)
    head_dim: int = 0  # width of each head; 0 is hidden_size / num_heads (vit-pytorch's dim_head sets its own)
    patch_norm: bool = False  # vit-pytorch: a LayerNorm on each flattened patch before its projection and one after
    # Attention layouts (issue 46): what each query may attend to and what is added to its logits; the defaults are
    # global attention with nothing added.
    rel_pos: str = "none"  # a bias on the logits: "none", "beit" (a table per layer), "beit_shared" (one table for
    # every layer, BEiT / Data2Vec-vision), "sam" (SAM / ViTDet's decomposed relative positions, from each query)
    rel_pos_resize: str = "bilinear"  # the BEiT table on another grid: "bilinear" (HF's, every call) or "timm" (timm's
    # resize_rel_pos_bias_table, unilm's geometric offsets, as timm's set_input_size or checkpoint filter does)
    window_size: int = 0  # SAM / ViTDet: side in patches of the windowed layers' square windows; 0: every layer global
    global_layers: tuple[int, ...] = ()  # with window_size: the layers that attend globally (SAM's global_attn_indexes)
    # AIMv2 and Perception Encoder; the defaults are the plain ViT.
    norm: str = "layer"  # every norm of the model: "layer" (LayerNorm) or "rms" (RMSNorm: AIMv2); eps layer_norm_eps
    embed_norm: bool = False  # AIMv2: a norm on the patch embeddings before the positions are added
    proj_bias: bool = True  # False: the attention's output projection and the MLP's linears have no bias (AIMv2)
    pool_head: str = "map"  # the probe of pooling "map": "map" (q projection, then x + mlp(norm(x)); SigLIP, PE),
    # "aimv2" (HF Aimv2AttentionPoolingHead: the latent is the query as it is, then a projection, nothing after) or
    # "vjepa2" (HF VJEPA2AttentivePooler's cross-attention: keys and values from norm(x), no output projection, the
    # latent as the residual, then x + mlp(norm(x)))
    pool_layers: int = 0  # self-attention blocks the pooled tokens go through first (V-JEPA 2's pooler before its
    # probe, dino.txt's vision head before its CLS and patch mean), no RoPE
    pool_gated_mlp: bool = False  # dino.txt: the pool blocks' MLP is SwiGLU (silu) whatever the backbone's
    pool_norm: bool = False  # dino.txt: a norm after the pool blocks (its head's ln_final), which the pooling reads
    pool_heads: int = 0  # heads of the attention-pooling probe; 0: num_heads (PE's probe has 8 whatever its blocks)
    pool_mlp_size: int = 0  # width of the probe's and pool blocks' MLPs; 0: mlp_size (PE-G's blocks are wider)
    pool_prefix: bool = True  # the probe reads the prefix tokens too; False: the patches alone (timm naflexvit's
    # pool_include_prefix=False, its *_map and *_reg1_map: the registers and CLS get no probe attention)
    sincos_pos: bool = False  # AIMv2-native: 2D sine-cosine positions computed for each grid instead of a table
    # Hierarchical models (issue 49; vit.model.stages): the defaults are one stage, the plain ViT.
    stage_depths: tuple[int, ...] = ()  # blocks per stage, summing to num_layers; empty: one stage
    stage_widths: tuple[int, ...] = ()  # each stage's width (hidden_size is the embedding's); empty: hidden_size
    stage_heads: tuple[int, ...] = ()  # each stage's heads; empty: num_heads in every stage
    merge: str = "none"  # the block opening each later stage: "swin" (PatchMerging), "swinv2" (its linear before norm)
    window_shift: bool = False  # Swin: every second block of a stage shifts its windows by half a window
    shift_padded: bool = True  # the shift rolls the padded grid (HF: pad, then roll); False: timm (roll, then pad)
    window_rule: str = "hf"  # Swin's windows and shift on a grid no wider than a window on a side (WINDOW_RULES):
    # "hf" (HF Swin: the grid's short side, both axes), "hf_v2" (HF Swin V2: the height of the grid it is built
    # for, both axes) or "timm" (each axis on its own, timm's _calc_window_shift)
    attention: str = "dot"  # "cosine": Swin V2's cosine attention times a learned per-head logit scale; "lsa" and
    # "lsa_temperature": locality self-attention (Lee et al. 2021), each token's own key masked out and the logits'
    # scale learned, one a head (the authors': initialised to 1 / sqrt(head_dim)) or one a layer as exp(temperature)
    # (vit-pytorch's vit_for_small_dataset)
    # Shifted patch tokenization (Lee et al. 2021): each patch also sees 4 shifted copies of the image, its 5C
    # channels normed (LayerNorm over the flattened patch) before the projection. "diagonal": the authors', shifted by
    # half a patch towards each corner; "cardinal": vit-pytorch's, by one pixel left, right, up and down.
    patch_shift: str = "none"
    res_post_norm: bool = False  # Swin V2: x + norm(attn(x)), then x + norm(mlp(x)) (the norm on each branch)
    pretrained_windows: tuple[int, ...] = ()  # Swin V2, per stage: the window its position MLP's offsets are
    # normalised by (its pre-training window, when fine-tuned at another); 0 or empty: the layer's own
    # NaFlex (SigLIP 2 NaFlex, timm naflexvit): each image at its native aspect ratio on its own grid of at most
    # max_num_patches patches (the preprocessing picks it); the learned table is a square grid resized per image.
    max_num_patches: int = 0  # 0: a fixed-resolution model; else the patch budget each image's grid fits in
    pos_resize: str = "bicubic"  # how the table is resized to another grid: "bicubic" (timm, HF ViT), "bilinear"
    # (SigLIP 2 NaFlex's resize_positional_embeddings, always with antialias) or "bilinear_corners" (Qwen3-VL's:
    # align_corners=True)
    stage_windows: tuple[int, ...] = ()  # Hiera / SAM 2 (merge "pool"), per stage: its window side on its own grid,
    # 0 global (global_layers attend globally too); a stage's first block attends in the previous stage's windows
    mask_units: bool = False  # Hiera: the windows are mask units, which must tile each grid (SAM 2's pad instead)
    patch_kernel: int = 0  # Hiera / SAM 2's overlapping stem: a kernel wider than the stride (7 on 4); 0: the patch
    patch_padding: int = 0  # and its zero padding (3), so an H x W input still gives an (H/4) x (W/4) grid
    pos_embed_grid: int = 0  # SAM 2: the position table's side (7 or 14: a background resized to any grid); 0: grid
    pos_embed_window: int = 0  # SAM 2: a second table of this side tiled over the grid (its first windows), added
    # Vision towers of VLMs (Qwen2.5-VL); the defaults are the plain ViT.
    deepstack_layers: tuple[int, ...] = ()  # Qwen3-VL: the layers whose outputs its DeepStack mergers also project
    # (into the language model's first layers): ViT.project(x, grid, tap=i) for the i-th
    spatial_merge: int = 0  # Qwen-VL's merge unit side (2): its merger reads each unit's tokens together, and windows
    # (window_size) hold whole units, their slots unit by unit (its window index), an edge window its real tokens
    # alone (the padding masked as keys, not SAM's zeros that attend); 0: none
    # Video (VideoMAE): a clip (B, frames, C, H, W) in, a token a tubelet of tubelet_size frames x one patch, tokens
    # time-major (vit.model.layouts.clip_grid); the defaults are an image model.
    num_frames: int = 0  # the clip length the model is built for (VideoMAE: 16); 0: an image model
    tubelet_size: int = 0  # frames per token: the patch embedding is a Conv3d over (tubelet, ph, pw) (VideoMAE: 2)
    sinusoid_pos: bool = False  # VideoMAE: the fixed 1D sine-cosine table of "Attention is all you need" over the
    # token index (time-major), for the model's own clip alone (HF refuses other sizes, and so do we)
    fc_norm_eps: float = 0.0  # fc_norm's own eps (VideoMAE's is nn.LayerNorm's default 1e-5); 0: layer_norm_eps
    divided_attention: bool = False  # TimeSformer: each block attends over time (a patch over its position in every
    # frame), then over space (within a frame, the CLS copied into each and its outputs averaged); a learned table
    # per frame (time_embed) joins the frame's spatial one (vit.model.layouts.divided_partitions)
    # Mimetic initialisation (Trockman & Kolter 2023; vit.model.vision_transformer.mimetic_init_): (alpha1, beta1,
    # alpha2, beta2) sets each head's W_q W_k^T near alpha1 Z + beta1 I and each layer's W_v W_proj near
    # alpha2 Z - beta2 I at construction; empty: the plain init. It changes only the starting weights.
    mimetic_init: tuple[float, ...] = ()

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
                     "window_size", "pool_heads", "pool_mlp_size", "max_num_patches", "spatial_merge", "num_frames",
                     "tubelet_size", "pool_layers"):
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
        if self.drop_path_schedule not in DROP_PATH_SCHEDULES:
            raise ValueError(f"ViTConfig.drop_path_schedule must be one of {', '.join(DROP_PATH_SCHEDULES)}, got "
                             f"{self.drop_path_schedule!r}")
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"ViTConfig.qkv_bias must be true or false, got {self.qkv_bias!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or not 0 < self.layer_norm_eps < 1:
            raise ValueError(f"ViTConfig.layer_norm_eps must be positive and below 1, got {self.layer_norm_eps!r}")
        for name in ("distillation_token", "distillation_head", "fc_norm", "pos_embed_antialias", "class_token",
                     "pos_embed", "key_bias", "pre_norm", "gated_mlp", "mlp_norm", "post_norm", "final_norm",
                     "patch_norm", "embed_norm", "proj_bias", "sincos_pos", "pool_prefix", "qk_norm", "sinusoid_pos",
                     "divided_attention", "pool_gated_mlp", "pool_norm"):
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
        if self.pos_resize not in POS_RESIZES:
            raise ValueError(f"ViTConfig.pos_resize must be one of {', '.join(POS_RESIZES)}, got {self.pos_resize!r}")
        if self.pool_head not in POOL_HEADS:
            raise ValueError(f"ViTConfig.pool_head must be one of {', '.join(POOL_HEADS)}, got {self.pool_head!r}")
        if self.sincos_pos and (self.pos_embed or self.hidden_size % 4):
            raise ValueError("ViTConfig.sincos_pos replaces the position table (set pos_embed false) and needs a "
                             f"hidden_size divisible by 4, got {self.hidden_size}")
        if (self.pool_layers or self.pool_norm) and self.pooling not in ("map", "cls+avg"):
            raise ValueError("ViTConfig.pool_layers and pool_norm come before an attention-pooling probe (pooling "
                             "'map') or dino.txt's CLS and patch mean (pooling 'cls+avg')")
        if self.pool_gated_mlp and not self.pool_layers:
            raise ValueError("ViTConfig.pool_gated_mlp is the MLP of the pool blocks: set pool_layers")
        if self.pooling == "map" and self.hidden_size % (self.pool_heads or self.num_heads):
            raise ValueError(f"ViTConfig.hidden_size ({self.hidden_size}) must be divisible by pool_heads "
                             f"({self.pool_heads})")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ViTConfig.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) \
                or not 0 < self.rope_theta <= MAX_ROPE_THETA:  # NaN and inf fail too
            raise ValueError(f"ViTConfig.rope_theta must be a positive finite number of at most {MAX_ROPE_THETA:g}, "
                             f"got {self.rope_theta!r}")
        if self.rope == "vjepa2" and (self.hidden_size // self.num_heads < 6 or not self.num_frames
                                      or not self.rope_ref_grid):
            raise ValueError("ViTConfig.rope 'vjepa2' is V-JEPA 2's: a video model whose heads have at least 6 "
                             "channels (three rotated segments) and rope_ref_grid its square grid's side")
        if self.rope not in ("none", "vjepa2") and (self.hidden_size // self.num_heads) % 4:
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
        self._check_projector()
        self._check_stages()
        self._check_video()

    def _check_video(self) -> None:
        if isinstance(self.fc_norm_eps, bool) or not isinstance(self.fc_norm_eps, (int, float)) \
                or not 0 <= self.fc_norm_eps < 1:
            raise ValueError(f"ViTConfig.fc_norm_eps must be in [0, 1), got {str(self.fc_norm_eps)[:40]}")
        if bool(self.num_frames) != bool(self.tubelet_size) or (
                self.tubelet_size and self.num_frames % self.tubelet_size):
            raise ValueError(f"ViTConfig.num_frames ({self.num_frames}) and tubelet_size ({self.tubelet_size}) go "
                             "together: a clip of whole tubelets")
        if self.sinusoid_pos and (not self.num_frames or self.pos_embed):
            raise ValueError("ViTConfig.sinusoid_pos is VideoMAE's fixed table: a video model without a learned one")
        if self.divided_attention and (not self.num_frames or self.tubelet_size != 1 or not self.class_token
                                       or self.num_prefix_tokens != 1 or not self.pos_embed):
            raise ValueError("ViTConfig.divided_attention is TimeSformer's: a video model of one-frame tubelets, a CLS "
                             "token and a learned position table")
        # TimeSformer's CLS is its own; a joint-attention model's one CLS (ViViT's) reads every tubelet, which the
        # clip's views place after it (``num_prefix_tokens``); registers or a distillation token are refused
        prefix = self.num_prefix_tokens > int(self.class_token) and not self.divided_attention
        if self.num_frames and (prefix or self.rope not in ("none", "vjepa2") or self.rel_pos != "none"
                                or self.window_size or self.stage_depths or self.projector != "none"
                                or self.patch_norm or self.patch_kernel or self.max_num_patches or self.sincos_pos):
            raise ValueError("ViTConfig.num_frames (a video model) needs global attention over its tubelets: no "
                             "prefix tokens, rotary positions but V-JEPA 2's, relative positions, windows, stages "
                             "or projector")

    def _check_projector(self) -> None:
        for name, bound in (("projector_dim", 65536), ("projector_skip", 256), ("projector_pool", 1024),
                            ("projector_unit", 16)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
                raise ValueError(f"ViTConfig.{name} must be a whole number from 0 to {bound:,}, got {str(value)[:40]}")
        if self.projector not in PROJECTORS:
            raise ValueError(f"ViTConfig.projector must be one of {', '.join(PROJECTORS)}, got "
                             f"{str(self.projector)[:40]!r}")
        if self.projector_activation not in ACTIVATIONS:
            raise ValueError(f"ViTConfig.projector_activation must be one of {', '.join(ACTIVATIONS)}, got "
                             f"{str(self.projector_activation)[:40]!r}")
        if not isinstance(self.projector_bias, bool):
            raise ValueError(f"ViTConfig.projector_bias must be true or false, got {self.projector_bias!r}")
        if (self.projector == "none") != (self.projector_dim == 0):
            raise ValueError("ViTConfig.projector and projector_dim go together (the language model's width)")
        if bool(self.projector_pool) != (self.projector == "gemma3") or (
                self.projector_pool and (self.num_prefix_tokens or self.stage_depths)):
            raise ValueError("ViTConfig.projector_pool is gemma3's average pool, on a model without prefix tokens "
                             "or stages")
        if bool(self.projector_unit) != (self.projector == "internvl") or (
                self.projector_unit and self.stage_depths):
            raise ValueError("ViTConfig.projector_unit is internvl's pixel-shuffle unit, on a model without stages")
        if (self.projector == "qwen") != bool(self.spatial_merge and self.projector_dim):
            raise ValueError("ViTConfig.projector 'qwen' (Qwen-VL's merger) and spatial_merge go together")
        taps = self.deepstack_layers
        if not isinstance(taps, (tuple, list)) or len(taps) > 64 or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.num_layers for i in taps):
            raise ValueError(f"ViTConfig.deepstack_layers must be layer numbers from 0 to {self.num_layers - 1}, got "
                             f"{str(taps)[:60]}")
        object.__setattr__(self, "deepstack_layers", tuple(taps))
        if taps and self.projector != "qwen":
            raise ValueError("ViTConfig.deepstack_layers are Qwen3-VL's, beside its merger (projector 'qwen')")

    def _check_stages(self) -> None:
        for name in ("stage_depths", "stage_widths", "stage_heads"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or len(value) > 16 or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 < v <= CONFIG_BOUNDS["hidden_size"]
                    for v in value):
                raise ValueError(f"ViTConfig.{name} must be a list of at most 16 positive integers, got "
                                 f"{str(value)[:60]}")
            object.__setattr__(self, name, tuple(value))
        depths = self.stage_depths
        if depths and sum(depths) != self.num_layers:
            raise ValueError(f"ViTConfig.stage_depths {list(depths)} must sum to num_layers ({self.num_layers})")
        for name in ("stage_widths", "stage_heads", "pretrained_windows"):
            value = getattr(self, name)
            if value and len(value) != self.num_stages:
                raise ValueError(f"ViTConfig.{name} needs one entry per stage ({self.num_stages}), got {list(value)}")
        for s in range(len(depths)):
            if self.stage_width(s) % self.stage_num_heads(s):
                raise ValueError(f"ViTConfig stage {s}: width {self.stage_width(s)} is not divisible by its "
                                 f"{self.stage_num_heads(s)} heads")
        if self.merge not in MERGES:
            raise ValueError(f"ViTConfig.merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"ViTConfig.attention must be one of {', '.join(ATTENTIONS)}, got {self.attention!r}")
        if self.patch_shift not in PATCH_SHIFTS:
            raise ValueError(f"ViTConfig.patch_shift must be one of {', '.join(PATCH_SHIFTS)}, got "
                             f"{str(self.patch_shift)[:40]!r}")
        if self.patch_shift != "none" and (self.patch_kernel or self.patch_padding or self.num_frames
                                           or self.patch_norm or self.patch_hw[0] != self.patch_hw[1]):
            raise ValueError("ViTConfig.patch_shift (shifted patch tokens) is for square patches of images, cut "
                             "without overlap and without patch_norm (it norms its patches itself)")
        if self.attention.startswith("lsa") and (self.stage_depths or self.window_size or self.rel_pos != "none"
                                                 or self.num_frames):
            raise ValueError("ViTConfig.attention lsa (locality self-attention) is for a global layer over every "
                             "token: no stages, windows, relative positions or video")
        for name in ("window_shift", "shift_padded", "res_post_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ViTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.window_rule not in WINDOW_RULES:
            raise ValueError(f"ViTConfig.window_rule must be one of {', '.join(WINDOW_RULES)}, got "
                             f"{str(self.window_rule)[:40]!r}")
        windows = self.pretrained_windows
        if not isinstance(windows, (tuple, list)) or len(windows) > 16 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= CONFIG_BOUNDS["window_size"]
                for v in windows):
            raise ValueError(f"ViTConfig.pretrained_windows must be a list of window sides, got {str(windows)[:60]}")
        object.__setattr__(self, "pretrained_windows", tuple(windows))
        self._check_pooling()
        self._check_mimetic()
        hierarchical = len(depths) > 1 or self.merge != "none"
        if hierarchical and (self.merge == "none" or self.num_prefix_tokens or self.rope != "none"
                             or self.pos_embed and self.pooling != "avg"):
            raise ValueError("ViTConfig stages need a merge block, no prefix tokens and no rotary positions")
        if self.window_shift and not self.window_size:
            raise ValueError("ViTConfig.window_shift needs window_size")
        if self.rel_pos in ("swin", "swinv2") and not self.window_size:
            raise ValueError(f"ViTConfig.rel_pos {self.rel_pos!r} needs window_size (its table is a window's)")

    def _check_pooling(self) -> None:
        windows = self.stage_windows
        if not isinstance(windows, (tuple, list)) or len(windows) > 16 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= CONFIG_BOUNDS["window_size"]
                for v in windows):
            raise ValueError(f"ViTConfig.stage_windows must be a list of window sides, got {str(windows)[:60]}")
        object.__setattr__(self, "stage_windows", tuple(windows))
        if windows and (len(windows) != self.num_stages or self.merge != "pool" or self.window_size):
            raise ValueError(f"ViTConfig.stage_windows needs one side per stage ({self.num_stages}) and merge 'pool' "
                             "(not window_size)")
        if not isinstance(self.mask_units, bool):
            raise ValueError(f"ViTConfig.mask_units must be true or false, got {self.mask_units!r}")
        for name in ("patch_kernel", "patch_padding"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= CONFIG_BOUNDS["patch_size"]:
                raise ValueError(f"ViTConfig.{name} must be a whole number of at most "
                                 f"{CONFIG_BOUNDS['patch_size']}, got {value!r}")
        for name in ("pos_embed_grid", "pos_embed_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= CONFIG_BOUNDS["window_size"]:
                raise ValueError(f"ViTConfig.{name} must be a whole number of at most "
                                 f"{CONFIG_BOUNDS['window_size']}, got {value!r}")
        if (self.pos_embed_grid or self.pos_embed_window) and (not self.pos_embed or self.num_prefix_tokens):
            raise ValueError("ViTConfig.pos_embed_grid / pos_embed_window need the position table and no prefix "
                             "tokens (SAM 2's)")
        if self.patch_kernel or self.patch_padding:
            stride = self.patch_hw[0]
            if self.patch_hw[0] != self.patch_hw[1] or self.patch_norm or not (
                    0 < (self.patch_kernel or stride) - 2 * self.patch_padding <= stride):
                raise ValueError(f"ViTConfig.patch_kernel {self.patch_kernel} with padding {self.patch_padding} must "
                                 f"give one patch per {stride} px stride (0 < kernel - 2 * padding <= stride), on "
                                 "square patches without patch_norm")

    def _check_mimetic(self) -> None:
        values = self.mimetic_init
        if not isinstance(values, (tuple, list)) or len(values) not in (0, 4) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= MAX_MIMETIC for v in values):
            raise ValueError(f"ViTConfig.mimetic_init must be empty or four numbers (alpha1, beta1, alpha2, beta2) in "
                             f"[0, {MAX_MIMETIC:g}], got {str(values)[:60]}")
        object.__setattr__(self, "mimetic_init", tuple(float(v) for v in values))  # a JSON list reads back the same
        if values and self.merge == "pool":
            raise ValueError("ViTConfig.mimetic_init needs blocks whose attention reads and writes one width (not "
                             "merge 'pool', whose pooling blocks widen the stream)")

    @property
    def patch_input_channels(self) -> int:
        """The channels the patch embedding reads: the image's, five times over with shifted patch tokens."""
        return self.num_channels * (5 if self.patch_shift != "none" else 1)

    @property
    def num_stages(self) -> int:
        return max(len(self.stage_depths), 1)

    def stage_of(self, layer: int) -> int:
        """The stage (0-based) of layer ``layer``."""
        end = 0
        for s, depth in enumerate(self.stage_depths):
            end += depth
            if layer < end:
                return s
        return 0

    def stage_start(self, stage: int) -> int:
        """The first layer of ``stage``."""
        return sum(self.stage_depths[:stage])

    def stage_width(self, stage: int) -> int:
        return self.stage_widths[stage] if self.stage_widths else self.hidden_size

    def stage_num_heads(self, stage: int) -> int:
        return self.stage_heads[stage] if self.stage_heads else self.num_heads

    def stage_config(self, stage: int) -> ViTConfig:
        """This config as its blocks in ``stage`` read it: that stage's width, heads and MLP (the MLP ratio kept)."""
        if not self.stage_depths:
            return self
        width = self.stage_width(stage)
        return replace(self, hidden_size=width, num_heads=self.stage_num_heads(stage),
                       mlp_size=self.mlp_size * width // self.hidden_size, num_layers=self.stage_depths[stage],
                       stage_depths=(), stage_widths=(), stage_heads=(), merge="none", global_layers=(),
                       pretrained_windows=self.pretrained_windows[stage:stage + 1], stage_windows=(),
                       mask_units=False, pos_embed_grid=0, pos_embed_window=0)

    def _check_layout(self) -> None:
        if self.rel_pos not in REL_POS:
            raise ValueError(f"ViTConfig.rel_pos must be one of {', '.join(REL_POS)}, got {self.rel_pos!r}")
        if self.rel_pos_resize not in REL_POS_RESIZES:
            raise ValueError(f"ViTConfig.rel_pos_resize must be one of {', '.join(REL_POS_RESIZES)}, got "
                             f"{self.rel_pos_resize!r}")
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
        if layers and not (self.window_size or self.stage_windows):
            raise ValueError("ViTConfig.global_layers needs window_size (the other layers' windows)")
        if self.window_size and self.rope != "none" and not self.spatial_merge:
            raise ValueError("ViTConfig.window_size with rotary positions is not supported (but in Qwen's windows: "
                             "spatial_merge)")
        if self.spatial_merge and (self.num_prefix_tokens or self.stage_depths or self.rel_pos != "none"
                                   or self.window_size % self.spatial_merge):
            raise ValueError(f"ViTConfig.spatial_merge ({self.spatial_merge}) needs a model without prefix tokens, "
                             "stages or relative positions, whose window_size holds whole units")

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
        """The patch tokens of the model's own input: a frame's grid, times its tubelets for a video model."""
        return self.grid_size[0] * self.grid_size[1] * self.clip_grid[0]

    @property
    def clip_grid(self) -> tuple[int, int, int]:
        """The model's own input as ``(tubelets, gh, gw)``: one tubelet for an image model."""
        return (self.num_frames // self.tubelet_size if self.tubelet_size else 1, *self.grid_size)

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
        if values.get("window_shift") and "window_rule" not in values:
            # a Swin saved before window_rule existed: its library's rule, as its other fields tell it
            rule = "timm" if values.get("shift_padded") is False else "hf_v2" if values.get("rel_pos") == "swinv2" \
                else "hf"
            values = {**values, "window_rule": rule}
        return cls(**values)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ViTConfig:
        """A named configuration from ``PRESETS``, optionally with some fields changed."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return replace(PRESETS[name], **overrides)


POOLINGS = ("cls", "avg", "cls+avg", "map")  # map: the attention-pooling probe (SigLIP, timm global_pool="map")
PREFIX_POSITIONS = ("all", "cls", "none")
ROPES = ("none", "dinov3", "eva", "pe", "qwen", "vjepa2")  # pe: EVA's, counted from 1 and x before y (Perception
# Encoder); qwen: patch-index coords, y bands then x bands, halves rotated (Qwen-VL's vision rotary); vjepa2: time,
# row and column segments of the head, each index read off the token's on a square grid (positions.vjepa2_rope)
REL_POS = ("none", "beit", "beit_shared", "sam", "swin", "swinv2")  # swin: a table per layer over a window's
# offsets; swinv2: its continuous bias from a small MLP of log-spaced offsets
ATTENTIONS = ("dot", "cosine", "lsa", "lsa_temperature")
DROP_PATH_SCHEDULES = ("linear", "uniform")
PATCH_SHIFTS = ("none", "diagonal", "cardinal")
MERGES = ("none", "swin", "swinv2", "pool")  # pool: Hiera / SAM 2's query pooling (the first block of a stage
# max-pools its queries and its residual 2x2; vit.model.stages.QueryPool)
REL_POS_RESIZES = ("bilinear", "timm")
WINDOW_RULES = ("hf", "hf_v2", "timm")
NORMS = ("layer", "rms")
POOL_HEADS = ("map", "aimv2", "vjepa2")
# qwen: Qwen-VL's patch merger (each spatial_merge unit); internvl: InternVL's pixel shuffle (each projector_unit unit)
PROJECTORS = ("none", "mlp", "linear", "gemma3", "qwen", "internvl")
POS_RESIZES = ("bicubic", "bilinear", "bilinear_corners", "nearest")
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
    # cifar-m with Lee et al. 2021's two levers for small data (their SL-ViT): shifted patch tokens (the authors'
    # half-patch diagonal shifts) and locality self-attention (a learned scale per head, each token's own key masked).
    "cifar-m-sl": ViTConfig(32, 4, 3, 10, hidden_size=192, num_layers=9, num_heads=12, mlp_size=384,
                            drop_path=0.1, attention="lsa", patch_shift="diagonal"),
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


