"""The model: ``ViT`` (the one forward, with its hook points) and ``Encoding``, what one pass computes."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from vit.costs import bounds
from vit.model.blocks import AttentionPool, AttentionVariant, Block, Parent, Projector, make_norm
from vit.model.config import ViTConfig
from vit.model.hooks import Hook, HookPoint, _hooks, checkpointing_blocks, current_rules, use_rules
from vit.model.layouts import RelativePositionBias, clip_grid, folded_grid
from vit.model.positions import (
    dinov3_rope,
    eva_rope,
    qwen_rope,
    resample_pos_embed,
    sincos_positions,
    sinusoid_table,
    vjepa2_rope,
)
from vit.model.stages import LayerLayout, PatchMerging, QueryPool


@dataclass
class Encoding:
    """Everything one pass computes (``ViT.encode``); tensors keep the autograd graph when it was on."""

    logits: torch.Tensor | None  # (B, classes), None without a classifier
    embedding: torch.Tensor  # (B, E): the pooled vector, projected to the joint embedding when the model has one
    attentions: tuple[torch.Tensor, ...] | None  # per layer (B, nh, T, T), a windowed one's (B * nw, nh, w*w, w*w)
    pool_attention: torch.Tensor | None  # (B, nh, 1, T): the attention-pooling probe's, for pooling "map"


def patchify(pixels: torch.Tensor, kernel: Sequence[int]) -> torch.Tensor:
    """``pixels`` (B, C, *sides), each side a multiple of its ``kernel`` side -> the non-overlapping patches
    ``(B, N, C * prod(kernel))``, N in row-major (for a clip time-major) order, each flattened as a convolution's
    weight ``(D, C, *kernel)`` is: a convolution whose stride is its kernel is ``F.linear(patchify(pixels, kernel),
    weight.flatten(1), bias)``, one matrix product where CPU convolution kernels take several times longer (and
    their backward far longer) on a 14-px kernel over 5,476 patches (bench/bench_patch_embed.py)."""
    B, C, *sides = pixels.shape
    grid = [s // k for s, k in zip(sides, kernel, strict=True)]
    split = [v for g, k in zip(grid, kernel, strict=True) for v in (g, k)]
    n = len(kernel)
    x = pixels.reshape(B, C, *split)  # (B, C, g0, k0, g1, k1[, g2, k2])
    x = x.permute(0, *range(2, 2 + 2 * n, 2), 1, *range(3, 3 + 2 * n, 2))  # (B, g0, g1[, g2], C, k0, k1[, k2])
    return x.reshape(B, math.prod(grid), C * math.prod(kernel))


def shifted_copies(images: torch.Tensor, mode: str, patch: int) -> torch.Tensor:
    """Shifted patch tokenization's input (Lee et al. 2021): ``images`` (B, C, H, W) and 4 shifted copies of them,
    the vacated pixels 0, concatenated over the channels -> (B, 5C, H, W).

    ``diagonal`` (the authors' ``PatchShifting``): shifted by half a patch, ``s``, towards each corner: the copies
    are ``pad(x, s)[:H, :W]``, ``pad(x, s)[:H, 2s:]``, ``pad(x, s)[2s:, :W]`` and ``pad(x, s)[2s:, 2s:]``, in that
    order. ``cardinal`` (vit-pytorch's ``SPT``): by one pixel, ``F.pad`` with (1, -1, 0, 0), (-1, 1, 0, 0), (0, 0, 1,
    -1) and (0, 0, -1, 1) (right, left, down and up)."""
    H, W = images.shape[-2:]
    if mode == "diagonal":
        s = patch // 2
        padded = F.pad(images, (s, s, s, s))
        copies = [padded[..., :H, :W], padded[..., :H, 2 * s:], padded[..., 2 * s:, :W], padded[..., 2 * s:, 2 * s:]]
    else:
        copies = [F.pad(images, shift) for shift in ((1, -1, 0, 0), (-1, 1, 0, 0), (0, 0, 1, -1), (0, 0, -1, 1))]
    return torch.cat([images, *copies], dim=1)


class ViT(Parent):
    """Patch embedding, prefix tokens, positions (a learned table and/or rotary), pre-norm blocks, pooling,
    and a classifier or a projection to a joint embedding."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.num_prefix_tokens = config.num_prefix_tokens  # CLS (+ DIST) (+ registers)
        d = config.hidden_size
        if config.tubelet_size:  # VideoMAE: a tubelet of frames x one patch per token
            tubelet = (config.tubelet_size, *config.patch_hw)
            self.patch_embed = nn.Conv3d(config.num_channels, d, tubelet, tubelet)
        else:
            self.patch_embed = nn.Conv2d(config.patch_input_channels, d, config.patch_kernel or config.patch_hw,
                                         config.patch_hw, config.patch_padding)  # Hiera's stem: kernel 7, stride 4
        patch_dim = config.patch_input_channels * config.patch_hw[0] * config.patch_hw[1]
        # vit-pytorch's LayerNorm of each flattened patch; shifted patch tokens' (of 5C channels), which has no second
        self.patch_norm = make_norm(config, patch_dim) if config.patch_norm or config.patch_shift != "none" else None
        # After the patch projection: vit-pytorch's second LayerNorm, AIMv2's RMSNorm.
        self.embed_norm = make_norm(config, d) if config.patch_norm or config.embed_norm else None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if config.distillation_token else None
        self.reg_token = (nn.Parameter(torch.zeros(1, config.num_register_tokens, d))
                          if config.num_register_tokens else None)
        table = config.pos_embed_grid ** 2 or config.num_patches  # SAM 2's background table is its own size
        if config.divided_attention:  # TimeSformer's table is one frame's, shared by every frame
            table = config.grid_size[0] * config.grid_size[1]
        self.pos_embed = (nn.Parameter(torch.zeros(1, config.num_positioned_prefix_tokens + table, d))
                          if config.pos_embed else None)
        # TimeSformer: a learned entry per frame, added to that frame's patches after the spatial table
        self.time_embed = nn.Parameter(torch.zeros(1, config.num_frames, d)) if config.divided_attention else None
        self.pos_embed_window = (nn.Parameter(torch.zeros(1, config.pos_embed_window ** 2, d))
                                 if config.pos_embed_window else None)
        self.norm_pre = make_norm(config, d) if config.pre_norm else None
        self.pos_dropout = nn.Dropout(config.dropout)
        rates = [config.drop_path * (1 if config.drop_path_schedule == "uniform" else i / max(config.num_layers - 1, 1))
                 for i in range(config.num_layers)]
        self.blocks = nn.ModuleList(self._block(i, rate) for i, rate in enumerate(rates))
        self.rel_pos_bias = (RelativePositionBias(config.grid_size, config.num_heads, config.rel_pos_resize)
                             if config.rel_pos == "beit_shared" else None)  # one table every layer adds
        # timm's avg-pool models normalise the pooled vector (fc_norm) instead of every token (norm).
        final = config.final_norm and not config.fc_norm
        d = config.stage_width(config.num_stages - 1) if config.stage_depths else d  # the last stage's width
        self.norm = make_norm(config, d) if final else nn.Identity()
        self.fc_norm = (make_norm(replace(config, layer_norm_eps=config.fc_norm_eps or config.layer_norm_eps), d)
                        if config.fc_norm else None)
        self.attn_pool = AttentionPool(config) if config.pooling == "map" else None
        # V-JEPA 2's pooler, dino.txt's vision head: self-attention blocks over the normed tokens before the pooling
        # (no RoPE, no hook names of the model's layers: they belong to the readout), then dino.txt's ln_final
        gated = dict(gated_mlp=True, activation="silu") if config.pool_gated_mlp else {}
        pool_block = replace(config, mlp_size=config.pool_mlp_size or config.mlp_size, **gated)
        self.pool_blocks = nn.ModuleList(Block(pool_block) for _ in range(config.pool_layers)) \
            if config.pool_layers else None
        self.pool_norm = make_norm(config, d) if config.pool_norm else None
        head_in = 2 * d if config.pooling == "cls+avg" else d
        self.head = nn.Linear(head_in, config.num_classes) if config.num_classes else None
        self.head_dist = nn.Linear(d, config.num_classes) if config.distillation_head else None
        self.projection = nn.Linear(head_in, config.projection_dim, bias=False) if config.projection_dim else None
        # a VLM's projector (LLaVA, PaliGemma, Gemma 3): the image tokens its language model reads
        self.projector = Projector(config) if config.projector != "none" else None
        # Qwen3-VL's DeepStack mergers: what the language model's first layers read of layers deepstack_layers
        self.deepstack = nn.ModuleList(Projector(config, shuffled_norm=True) for _ in config.deepstack_layers) \
            if config.deepstack_layers else None
        self.apply(_init_weights)
        for token in (self.pos_embed, self.cls_token, self.dist_token, self.reg_token, self.time_embed):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=0.02)
        if config.mimetic_init:
            for block in self.blocks:
                mimetic_init_(block.attn, *config.mimetic_init)
        # The embedding before ln_pre (B, T, D); the last block's output after the final norm (B, T, D); the pooled
        # vector after fc_norm (B, D); the logits (B, classes); the (projected) embedding (B, E).
        self.hook_embed, self.hook_normed, self.hook_pooled = HookPoint(), HookPoint(), HookPoint()
        self.hook_logits, self.hook_embedding = HookPoint(), HookPoint()
        self.hook_projected = HookPoint()  # (B, N, projector_dim): the projector's output (ViT.project)
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name

    def _block(self, layer: int, drop_path_rate: float) -> Block:
        """Block ``layer`` as its stage builds it: the stage's width and heads, Swin's shift in every second block
        of a stage, and the merge that opens a later stage (``vit.model.stages``)."""
        c = self.config
        stage = c.stage_of(layer)
        first = c.stage_start(stage)
        merge = None
        window = c.window_of(layer)
        if stage and layer == first and c.merge == "pool":
            merge = QueryPool(c.stage_width(stage - 1), c.stage_width(stage))
        elif stage and layer == first:
            dim, out = c.stage_width(stage - 1), c.stage_width(stage)
            post = c.merge == "swinv2"
            merge = PatchMerging(dim, out, make_norm(c, out if post else 4 * dim), post)
        if c.stage_windows:  # Hiera / SAM 2: a stage's first block attends in the previous stage's windows
            window = 0 if layer in c.global_layers else c.stage_windows[stage - 1 if stage and layer == first
                                                                         else stage]
        shift = c.window_shift and (layer - first) % 2 == 1
        return Block(c.stage_config(stage), drop_path_rate, window, shift, merge)

    def layer_grids(self, grid: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        """Each layer's own patch grid for an input whose patch grid is ``grid``: the same one in a plain ViT, the
        grid halved stage by stage in a hierarchical one."""
        grids, grid = [], tuple(grid)
        for block in self.blocks:
            grid = block.grid_after(grid)
            grids.append(grid)
        return tuple(grids)

    def layer_layouts(self, grid: tuple[int, int]) -> tuple[LayerLayout, ...]:
        """Each layer's ``LayerLayout`` (its grid, window and shift) for an input whose patch grid is ``grid``;
        ValueError, naming the input sizes that work, where a layer's grid is smaller than its windows."""
        c = self.config
        # the grid HF Swin V2 builds each stage for: the image's halved per stage, rounding down
        built = [(grid[0] >> c.stage_of(i), grid[1] >> c.stage_of(i)) for i in range(len(self.blocks))]
        try:
            return tuple(block.layout(g, b) for block, g, b in zip(self.blocks, self.layer_grids(grid), built,
                                                                     strict=True))
        except ValueError as error:
            ph, pw = c.patch_hw
            if c.merge == "pool":
                side = max(2 ** (c.num_stages - 1), c.stage_windows[0] if c.mask_units else 1)
                raise ValueError(f"an input of {grid[0] * ph}x{grid[1] * pw} px does not fit this model: {error}; "
                                 f"give it sides that are multiples of {side * ph} px") from None
            reach = 2 ** (c.num_stages - 1)  # patches per cell of the last stage's grid
            least = (c.window_size - 1) * reach + 1
            raise ValueError(f"an input of {grid[0] * ph}x{grid[1] * pw} px is too small for this model: {error} "
                             f"in its last stage; give it at least {least * ph}x{least * pw} px") from None

    def hook_points(self) -> dict[str, HookPoint]:
        """Every hook point by name (``blocks.0.attn.hook_q``, ..., ``hook_logits``); the shapes are in the comments
        where each is made (``Attention``, ``MLP``, ``Block``, ``ViT.__init__``)."""
        return {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}

    @contextlib.contextmanager
    def hooks(self, hooks: Iterable[tuple[str, Hook]]) -> Iterator[ViT]:
        """Set ``hooks`` ``(name, fn)`` for the length of a ``with`` block, in this thread (TransformerLens's
        ``hooks``); several on one point run in the order given. An unknown name raises ValueError."""
        active = {point: list(fns) for point, fns in _hooks.get().items()}
        for name, fn in hooks:
            # each name looked up by its path: walking every module for hook_points() cost 4 ms a call on ViT-B
            try:
                point = self.get_submodule(name)
            except AttributeError:
                point = None
            if not isinstance(point, HookPoint):
                raise ValueError(f"the model has no hook point {name!r}; see ViT.hook_points()")
            active.setdefault(point, []).append(fn)
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

    def logits_recorded_from(self, images: torch.Tensor, layer: int, hooks: Iterable[tuple[str, Hook]] = (),
                             residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """``forward``'s logits of ``images`` with ``hooks`` set (on every block), autograd recording from block
        ``layer`` on: the blocks before it run under ``no_grad``. For a gradient that stops at a leaf a hook makes in
        or after block ``layer`` (a CAM's layer, an SAE's splice): a forward all under grad would keep every earlier
        block's graph to the end, their parameters needing gradients (976 MB for a VideoMAE-B clip's Grad-CAM, 112 MB
        without). ``residual``: block ``layer``'s input ``(B, T, D)`` where a forward of ``images`` already gave it (an
        analysis's hidden states): the embedding and the blocks before it are not run again."""
        grid = self.input_grid(images)
        start = layer % len(self.blocks)
        with self.hooks(hooks):
            if residual is not None:
                x = residual
            else:
                with torch.no_grad():
                    x = self.run_blocks(self.pos_dropout(self.embed(images)), grid, 0, start)[0]
            return self.classify(self.run_blocks(x, grid, start)[0])

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

    def input_grid(self, images: torch.Tensor) -> tuple[int, int]:
        """The 2D patch grid the blocks see for ``images`` (B, C, H, W), or for a video model's clips (B, frames, C,
        H, W) their folded grid ``(t*gh, gw)`` (``vit.model.layouts.folded_grid``); ValueError (one line) for a
        shape the model does not take."""
        c = self.config
        if not c.tubelet_size:
            if images.dim() != 4 or images.shape[1] != c.num_channels:
                raise ValueError(f"expected images of shape (batch, {c.num_channels}, height, width), got "
                                 f"{tuple(images.shape)}")
            return self.patch_grid(images.shape[2], images.shape[3])
        if images.dim() != 5 or images.shape[2] != c.num_channels:
            raise ValueError(f"expected clips of shape (batch, frames, {c.num_channels}, height, width), got "
                             f"{tuple(images.shape)}")
        grid = clip_grid(images.shape[1], images.shape[3], images.shape[4], c.tubelet_size, c.patch_hw)
        if c.divided_attention and grid[0] != c.clip_grid[0]:  # its blocks divide over the model's own frames
            raise ValueError(f"this model takes clips of {c.num_frames} frames (its divided attention is built for "
                             f"them, as HF TimeSformer's layers are), got {images.shape[1]}")
        if c.sinusoid_pos and grid != c.clip_grid:  # its fixed table numbers the model's own clip's tokens
            (h, w), frames = c.image_hw, c.num_frames
            raise ValueError(f"this model takes clips of {frames} frames of {w}x{h} px (its fixed positions number "
                             f"those tokens), got {images.shape[1]} of {images.shape[4]}x{images.shape[3]} px")
        return folded_grid(grid)

    def rotary(self, grid: tuple[int, int], device: torch.device | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary embedding ``(cos, sin)`` (each ``(gh*gw, head_dim)``) every block uses on this grid, or None."""
        if self.config.rope == "none":
            return None
        c = self.config
        if c.rope == "vjepa2":  # positions read off the token index on its own square grid (rope_ref_grid)
            return vjepa2_rope(grid[0] * grid[1], c.rope_ref_grid, c.hidden_size // c.num_heads,
                               float(c.rope_theta), device)
        if c.rope == "qwen":
            return qwen_rope(grid, c.hidden_size // c.num_heads, float(c.rope_theta), device)
        if c.rope in ("eva", "pe"):
            return eva_rope(grid, c.hidden_size // c.num_heads, float(c.rope_theta), c.rope_ref_grid, device,
                            pe=c.rope == "pe")
        return dinov3_rope(grid, c.hidden_size // c.num_heads, float(c.rope_theta), device)

    def window_positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """SAM 2's window table ``(1, w*w, D)`` tiled over ``grid`` -> ``(1, gh*gw, D)`` (HF / timm ``tile``); a grid
        its windows do not tile is refused, naming the sizes that work."""
        w = self.config.pos_embed_window
        if grid[0] % w or grid[1] % w:
            ph, pw = self.config.patch_hw
            raise ValueError(f"an input of {grid[0] * ph}x{grid[1] * pw} px is not tiled by this model's "
                             f"{w}x{w}-patch position windows; give it sides that are multiples of {w * ph} px")
        table = self.pos_embed_window.view(1, w, w, -1).repeat(1, grid[0] // w, grid[1] // w, 1)  # (1, gh, gw, D)
        return table.reshape(1, grid[0] * grid[1], -1)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` (B, C, H, W), or a video model's clips (B, frames, C, H, W), -> the first block's input
        ``(B, T, D)``: patches (tubelets, time-major), prefix tokens, positions (``hook_embed``), then ``ln_pre``
        when the model has one.

        Positions are resampled to the input's patch grid; dropout is left to ``forward``.
        """
        c = self.config
        B = images.shape[0]
        grid = self.input_grid(images)
        if c.patch_kernel or c.patch_padding:  # Hiera's overlapping stem: a true convolution
            x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, gh*gw, D)
        else:  # kernel == stride: the convolution is one linear map of each flattened patch (or tubelet)
            # (B, frames, C, H, W) -> (B, C, frames, H, W): tokens time-major, as VideoMAE's Conv3d flattens them
            pixels = images.transpose(1, 2) if c.tubelet_size else images
            if c.patch_shift != "none":  # shifted patch tokens: the image and 4 shifted copies, (B, 5C, H, W)
                pixels = shifted_copies(pixels, c.patch_shift, c.patch_hw[0])
            patches = patchify(pixels, self.patch_embed.kernel_size)  # (B, N, C*kernel volume)
            if self.patch_norm is not None:  # vit-pytorch's LayerNorm of the flattened patch
                patches = self.patch_norm(patches)
            x = F.linear(patches, self.patch_embed.weight.flatten(1), self.patch_embed.bias)  # (B, N, D)
        if self.embed_norm is not None:  # vit-pytorch's second LayerNorm, AIMv2's RMSNorm
            x = self.embed_norm(x)
        positioned = c.num_positioned_prefix_tokens
        prefix = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        prefix = torch.cat(prefix, dim=1).expand(B, -1, -1) if prefix else x[:, :0]  # (B, P, D)
        if c.divided_attention:  # TimeSformer: each frame's patches + the spatial table, then + that frame's entry
            t, gh, gw = c.clip_grid[0], grid[0] // c.clip_grid[0], grid[1]
            pos = resample_pos_embed(self.pos_embed, (gh, gw), c.grid_size, 1, False, c.pos_resize)  # (1, 1 + P, D)
            x = x.view(B, t, gh * gw, -1) + pos[:, None, 1:] + self.time_embed[:, :, None]  # (B, t, gh*gw, D)
            x = torch.cat([prefix + pos[:, :1], x.flatten(1, 2)], dim=1)  # (B, 1 + t*gh*gw, D)
        elif self.pos_embed is None:
            if c.sinusoid_pos:
                x = x + sinusoid_table(x.shape[1], x.shape[-1], x.device).to(x.dtype)  # (B, t*gh*gw, D)
            if c.sincos_pos:
                x = x + sincos_positions(grid, x.shape[-1], x.device).to(x.dtype)  # (B, gh*gw, D)
            x = torch.cat([prefix, x], dim=1)  # (B, P + gh*gw, D)
        else:
            table = (c.pos_embed_grid,) * 2 if c.pos_embed_grid else c.grid_size
            if c.num_frames:  # a clip's table (ViViT's): every tubelet's, time-major, read at the model's own clip
                table = (c.clip_grid[0] * c.grid_size[0], c.grid_size[1])
                if tuple(grid) != table:
                    raise ValueError(f"this video model's learned positions cover a clip of {c.num_frames} frames "
                                     f"of {c.image_size} px; give it that clip")
            pos = resample_pos_embed(self.pos_embed, grid, table, positioned, c.pos_embed_antialias, c.pos_resize)
            if self.pos_embed_window is not None:
                pos = pos + self.window_positions(grid)
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
        return self.run_blocks(x, self.input_grid(images), 0, None, output_attentions)

    def run_blocks(self, x: torch.Tensor, grid: tuple[int, int] | None, start: int = 0, stop: int | None = None,
                   output_attentions: bool = False, queries: int | None = None, key_mask: torch.Tensor | None = None,
                   variant: AttentionVariant | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Blocks ``start`` to ``stop`` (exclusive; None: the last) on the residual stream ``x`` (B, T, D) of an
        input whose patch grid is ``grid`` (needed by rotary positions; None for a model without them), with
        their hook points: TransformerLens's ``start_at_layer`` / ``stop_at_layer``, so an intervention on layer
        ``l`` runs only the layers after it. Returns the last one's output and their attentions when asked.

        ``queries``: the last block computes only its first ``queries`` tokens (their queries against every key;
        its output and attention then have that many rows): all ``classify`` reads when ``readout_tokens`` says so,
        and three quarters of that block's work saved (the rows' values are the full run's, up to rounding).
        ``key_mask`` (B, T): False at padding tokens, which no query of any layer reads (``encode_padded``).
        ``variant``: the last block is computed as this ``AttentionVariant`` says (the training-free dense maps'
        changed last block: SCLIP, NACLIP, ClearCLIP, MaskCLIP, a CLIP Surgery branch), on the same forward."""
        rope = None
        if self.config.rope != "none":
            if grid is None:
                raise ValueError("this model turns q and k by rotary positions, so the patch grid must be given")
            rope = self.rotary(tuple(grid), x.device)
        c = self.config
        if grid is None and (c.rel_pos != "none" or c.window_size or c.stage_depths or c.divided_attention):
            raise ValueError("this model's attention layout (relative positions, windows) needs the patch grid")
        grid = None if grid is None else tuple(grid)
        # BEiT's shared bias, (nh, T, T) whole: each layer forms the rows it needs, a query chunk at a time (at 16,384
        # tokens and 12 heads the whole is 12.9 GB)
        shared = partial(self.rel_pos_bias, grid) if self.rel_pos_bias is not None else None
        attentions = []
        blocks = list(self.blocks)[start:stop]  # not self.blocks[start:stop]: that builds a ModuleList
        layouts = None
        if grid is not None and (c.stage_depths or c.window_size or c.rel_pos != "none"):
            # What the windows and position biases form at once, before any block runs: a config's 128x128 window
            # is a 16,384 x 16,384 bias and index however small the image, refused here whoever asked for it
            bounds.check_layouts(self, grid)
        if grid is not None and c.stage_depths:
            layouts = self.layer_layouts(grid)  # also the sizes that work, before any block runs
            layouts = layouts[start % len(self.blocks):]  # (a negative start counts from the end, as the slice does)
            grid = ((grid,) + self.layer_grids(grid))[start % len(self.blocks)]  # the grid of block start's input
        call = _call
        if checkpointing_blocks() and torch.is_grad_enabled():  # each block again in the backward, under this
            rules = current_rules()  # forward's rules (AttnLRP's): one block's graph held at a time
            call = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False,
                           context_fn=lambda: (contextlib.nullcontext(), use_rules(rules)))
        for i, block in enumerate(blocks):
            last = i == len(blocks) - 1
            x, probs = call(block, x, output_attentions, rope, queries if last else None, grid, shared,
                            key_mask=key_mask, layout=None if layouts is None else layouts[i],
                            variant=variant if last else None)
            grid = None if grid is None else block.grid_after(grid)
            attentions.append(probs)
        return x, tuple(attentions) if output_attentions else None

    def pool(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's output ``(B, T, D)`` -> the pooled vector (B, D) (2D for cls+avg) after the final
        norm, the pool blocks and their norm (V-JEPA 2's pooler, dino.txt's vision head), pooling and fc_norm, and
        the pooling probe's attention (B, nh, 1, T) for pooling "map" (else None).
        ``key_mask`` (B, T): False at padding tokens, which neither the average nor the probe reads."""
        x = self.hook_normed(self.norm(x))
        for block in self.pool_blocks or ():  # V-JEPA 2's pooler, dino.txt's vision head
            x = block(x, key_mask=key_mask)[0]
        if self.pool_norm is not None:
            x = self.pool_norm(x)
        patches = x[:, self.num_prefix_tokens:]  # (B, gh*gw, D)
        if key_mask is None:
            mean = patches.mean(dim=1)  # (B, D)
        else:
            real = key_mask[:, self.num_prefix_tokens:, None].to(x.dtype)  # (B, gh*gw, 1)
            mean = (patches * real).sum(dim=1) / real.sum(dim=1)  # (B, D)
        probe = None
        if self.config.pooling == "cls":
            pooled = x[:, 0]  # (B, D)
        elif self.config.pooling == "avg":
            pooled = mean
        elif self.config.pooling == "map":
            pooled, probe = self.attn_pool(x, key_mask)  # (B, D), (B, nh, 1, T)
        else:  # "cls+avg"
            pooled = torch.cat([x[:, 0], mean], dim=-1)  # (B, 2D)
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

    def project(self, x: torch.Tensor, grid: tuple[int, int], tap: int | None = None) -> torch.Tensor:
        """The last block's output ``(B, T, D)`` of an input on patch grid ``grid`` -> the image tokens a
        vision-language model's language model reads ``(B, N, projector_dim)`` (HF ``get_image_features``): the final
        norm, the tokens after the first ``projector_skip``, the projector (``hook_projected``). ``tap`` (Qwen3-VL):
        ``x`` is the output of layer ``deepstack_layers[tap]`` and its DeepStack merger projects it (HF's
        ``deepstack_features[tap]``). ValueError for a model without one."""
        if self.projector is None:
            raise ValueError("this model has no projector (only the towers of LLaVA, PaliGemma, Gemma 3, InternVL and "
                             "Qwen-VL have one)")
        if tap is not None:
            taps = self.config.deepstack_layers
            if not 0 <= tap < len(taps):
                raise ValueError(f"tap {tap}: this model has {len(taps)} DeepStack mergers (of layers {list(taps)})")
            return self.deepstack[tap](x, tuple(grid))
        tokens = self.norm(x)[:, self.config.projector_skip:]  # (B, N, D)
        return self.hook_projected(self.projector(tokens, tuple(grid)))

    def encode(self, images: torch.Tensor, output_attentions: bool = False) -> Encoding:
        """One pass over ``images`` (B, C, H, W): logits, the (projected) embedding, and when asked for every
        layer's attention and the pooling probe's (see ``Encoding``)."""
        x, attentions = self.tokens(images, output_attentions)
        pooled, probe = self.pool(x)
        embedding = self.hook_embedding(self.projection(pooled) if self.projection is not None else pooled)  # (B, E)
        return Encoding(self._logits(x, pooled), embedding, attentions, probe if output_attentions else None)

    def encode_padded(self, images: Sequence[torch.Tensor], output_attentions: bool = False) -> list[Encoding]:
        """One pass over images of different sizes (each ``(C, H, W)``, on its own patch grid: NaFlex's batches):
        each image's tokens with its own positions, padded at the end to the longest and masked as keys in every
        layer and the pooling probe (HF Siglip2's ``pixel_attention_mask``). One ``Encoding`` per image, batch 1,
        its attentions over its real tokens alone ``(1, nh, T_i, T_i)``: what ``encode`` gives for it alone."""
        c = self.config
        if not images:
            raise ValueError("encode_padded needs at least one image")
        if c.rope != "none" or c.rel_pos != "none" or c.window_size:
            raise ValueError("padded batches need a model whose attention does not depend on the grid (no rotary "
                             "positions, relative positions or windows); encode the images one at a time")
        embedded = [self.embed(image[None]) for image in images]  # each (1, T_i, D)
        lengths = [e.shape[1] for e in embedded]
        longest = max(lengths)
        x = torch.cat([F.pad(e, (0, 0, 0, longest - e.shape[1])) for e in embedded])  # (B, T, D), zeros at the end
        key_mask = torch.arange(longest, device=x.device)[None, :] < torch.tensor(lengths, device=x.device)[:, None]
        x, attentions = self.run_blocks(self.pos_dropout(x), None, 0, None, output_attentions, None, key_mask)
        pooled, probe = self.pool(x, key_mask)
        embedding = self.hook_embedding(self.projection(pooled) if self.projection is not None else pooled)  # (B, E)
        logits = self._logits(x, pooled)
        return [Encoding(None if logits is None else logits[i:i + 1], embedding[i:i + 1],
                         None if attentions is None else tuple(a[i:i + 1, :, :n, :n] for a in attentions),
                         None if probe is None or not output_attentions else probe[i:i + 1, :, :, :n])
                for i, n in enumerate(lengths)]

    def forward(self, images: torch.Tensor, output_attentions: bool = False
                ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...] | None]:
        """``images`` (B, C, H, W) -> logits (B, classes) (None without a head), attentions (per layer
        (B, nh, T, T)) or None."""
        x, attentions = self.tokens(images, output_attentions)
        return self.classify(x), attentions


def _call(function: Callable, *args, **kwargs):
    """``function(*args, **kwargs)``: a block run as it is (``torch.utils.checkpoint.checkpoint``'s signature)."""
    return function(*args, **kwargs)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.Conv2d, nn.Conv3d)):
        # As a linear layer on the flattened patch (timm's lecun-normal-ish choice).
        nn.init.trunc_normal_(module.weight, std=math.sqrt(1.0 / module.weight[0].numel()))
        nn.init.zeros_(module.bias)


def factor_product(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``target`` (m, n) -> ``left`` (m, rank), ``right`` (rank, n) whose product is the best rank-``rank``
    approximation of ``target`` (Eckart-Young): its SVD ``U S V^T`` truncated, ``sqrt(S)`` given to each side, so
    ``left @ right == target`` exactly (to rounding) when ``rank >= min(m, n)``. Past ``min(m, n)`` the extra
    columns of ``left`` and rows of ``right`` are zero."""
    u, s, vh = torch.linalg.svd(target)  # (m, m), (min(m, n),), (n, n)
    r = min(rank, s.shape[0])
    root = s[:r].sqrt()
    left = target.new_zeros(target.shape[0], rank)
    right = target.new_zeros(rank, target.shape[1])
    left[:, :r] = u[:, :r] * root  # (m, r)
    right[:r] = root[:, None] * vh[:r]  # (r, n)
    return left, right


@torch.no_grad()
def mimetic_init_(attn: nn.Module, alpha1: float, beta1: float, alpha2: float, beta2: float) -> None:
    """Mimetic initialisation of one self-attention layer (Trockman & Kolter, "Mimetic Initialization of
    Self-Attention Layers", ICML 2023, arXiv:2305.09828, section 3), in place.

    In the paper's notation (``q = X W_q``, ``W_q`` and ``W_k`` (d, k) per head, ``W_v`` and ``W_proj`` (d, d) over
    all heads), each head's ``W_q W_k^T`` is the best rank-k approximation of ``alpha1 Z1 + beta1 I`` and the
    layer's ``W_v W_proj`` equals ``alpha2 Z2 - beta2 I`` (rank d), both factored by the SVD with ``sqrt(S)`` on each
    side; every ``Z`` is a fresh (d, d) Gaussian of variance 1 / d per entry, drawn from torch's global generator
    (one per head, in head order, then the layer's ``Z2``), so the seed fixes it. Our ``nn.Linear`` weights are the
    transposes: ``qkv.weight``'s rows ``[h * hd:(h + 1) * hd]`` of each third are head h's ``W_q^T``, ``W_k^T`` and
    ``W_v^T``, and ``proj.weight`` is ``W_proj^T``. The biases keep the plain init's zeros.

    No public code of the authors' was found to follow (the paper links none); the closed form above is the paper's
    and the defaults (``MIMETIC_DEFAULTS``) its ViT-on-CIFAR ones. A model on the ``meta`` device (shapes only)
    is left as it is."""
    weight = attn.qkv.weight  # (3 * nh * hd, d)
    if weight.is_meta:
        return
    heads, hd = attn.num_heads, attn.head_dim
    d = weight.shape[1]
    eye = torch.eye(d)
    q, k, v = weight.view(3, heads, hd, d).unbind(0)  # each (nh, hd, d), views of the weight
    for h in range(heads):
        z1 = torch.randn(d, d) / math.sqrt(d)
        w_q, w_kt = factor_product(alpha1 * z1 + beta1 * eye, hd)  # (d, hd), (hd, d)
        q[h].copy_(w_q.T)
        k[h].copy_(w_kt)
    z2 = torch.randn(d, d) / math.sqrt(d)
    w_v, w_proj = factor_product(alpha2 * z2 - beta2 * eye, heads * hd)  # (d, nh*hd), (nh*hd, d)
    v.copy_(w_v.T.reshape(heads, hd, d))
    attn.proj.weight.copy_(w_proj.T)  # (d, nh*hd)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
