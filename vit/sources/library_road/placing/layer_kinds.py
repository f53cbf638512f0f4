"""What some timm families' attention layers are, beside those ``layer_places`` places by their token counts:
windows a block declares by ``window_size`` (TinyViT's, DaViT's spatial blocks, GC ViT's local blocks) or by
``block_size`` (NesT's levels: blocks of the image, each attended alone), and layers that are no attention over image
tokens, named and left out of the layers while the others are recorded and drawn:

- attention over channels (cross-covariance attention: XCiT's and EdgeNeXt's ``XCA``, DaViT's ``ChannelAttention``):
  a softmax over a head's channels, ``C / H`` rows over ``C / H`` keys whatever the image;
- GC ViT's global-query layers: their queries are pooled from the whole stage and shared by every window, so their
  rows are no token of the image;
- Depth Pro's patch encoder: one ViT over overlapping crops of the image at several scales, all in one batch, which
  no single grid places (its image encoder, a ViT over the whole image resized, is what its maps read).

A layer's kind is read from its module's class and checked against its call's counts; nothing is guessed from a count
alone. Halo attention (BoTNet-family HaloNet's ``HaloAttn``: blocks of queries over overlapping windows of keys, a
block and its halo) has no layout here and is refused naming it (``NO_LAYOUT``).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

from vit.core.attention_recorder import AttentionCall
from vit.core.threads import this_thread_only
from vit.model.stages import LayerLayout

# Attention modules (by class) whose softmax runs over a head's channels, not over tokens
CHANNEL_ATTENTION = ("XCA", "CrossCovarianceAttn", "ChannelAttention", "ChannelAttentionV2")
# Blocks (timm module, class) that cut their grid into non-overlapping windows of ``window_size`` (padded at the
# bottom and right), row-major, each window's tokens row-major (``window_partition`` as Swin's, never shifted) -> the
# dims of their input that are its grid: the grid a padded window is cut from is read from the block's own input in
# the traced forward, as no count can tell it (a 2x3 and a 4x6 grid both pad to one 7x7 window)
PLAIN_WINDOWS = {("timm.models.tiny_vit", "TinyVitBlock"): (1, 2),  # (B, H, W, C)
                 ("timm.models.davit", "SpatialBlock"): (2, 3),  # (B, C, H, W)
                 ("timm.models.gcvit", "GlobalContextVitBlock"): (1, 2)}  # (B, H, W, C)
_GRIDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a block (and its modules) -> its traced grid


def _key(module: torch.nn.Module) -> tuple[str, str]:
    return type(module).__module__, type(module).__name__


@contextmanager
def noting_grids(model: torch.nn.Module):
    """Within it, each ``PLAIN_WINDOWS`` block of ``model`` notes the grid of the input its forward gets, for it and
    the modules in it (its attention declares ``window_size`` too)."""
    def note(block, args):
        rows, cols = PLAIN_WINDOWS[_key(block)]
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            for module in block.modules():
                _GRIDS[module] = (int(args[0].shape[rows]), int(args[0].shape[cols]))

    hooks = [m.register_forward_pre_hook(this_thread_only(note)) for m in model.modules() if _key(m) in PLAIN_WINDOWS]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _plain_windows(module: torch.nn.Module, grid: tuple[int, int]) -> LayerLayout:
    """The windows of a ``PLAIN_WINDOWS`` block's on ``grid``, the grid its input had; ValueError for another."""
    if _GRIDS.get(module) != tuple(grid):
        raise ValueError(f"{type(module).__name__}'s input was not a {grid[0]}x{grid[1]} grid of windows")
    return LayerLayout(grid, _pair(module.window_size))


def _nest_blocks(module: torch.nn.Module, grid: tuple[int, int]) -> LayerLayout:
    """NesT's level: its grid cut into ``block_size`` blocks (``timm.models.nest.blockify``), each attended alone."""
    if type(module).__name__ != "NestLevel":
        raise ValueError(f"{type(module).__name__} is no NesT level")
    if grid[0] % module.block_size or grid[1] % module.block_size:
        raise ValueError(f"its {grid[0]}x{grid[1]} grid is not whole {module.block_size}-token blocks")
    return LayerLayout(grid, module.block_size)


# What an ancestor of the attention module declares -> its windows (``layer_places.PIECES`` reads these after its own)
PIECES = (("window_size", _plain_windows), ("block_size", _nest_blocks))

# Attention no layout places, by the class of a module at or above the call (``layer_places.NO_LAYOUT`` reads these)
NO_LAYOUT = (
    ("HaloAttn", "halo attention (HaloNet's: blocks of queries over overlapping windows of keys, each block and its "
                 "halo, zero-padded at the image's edge), which no layout on this road places"),
)


def declared_patch(model: torch.nn.Module) -> tuple[int, int] | None:
    """The patch of a timm patch embedding that cuts its patches by a reshape the trace cannot see (Gemma 4's
    ``Gemma4PatchEmbed``: ``timm.layers.batch_patchify``, row-major by its code, then a linear layer), or None."""
    for module in model.modules():
        if type(module).__module__.startswith("timm.") and type(module).__name__ in PATCHIFY:
            return _pair(module.patch_size)
    return None


PATCHIFY = ("Gemma4PatchEmbed",)  # timm patch embeddings that patchify by reshape (row-major), not a convolution


# Attention with no rows of query-over-key probabilities at all, by class: what it computes instead, in words
NO_ROWS = (
    ("FactorAttnConvRelPosEnc", "factorized attention (CoaT's: a softmax over the tokens for each key channel, "
                                "then each query times that summary; no query's row over the image's tokens)"),
    ("LambdaLayer", "lambda layers (LambdaNet's: a softmax over the tokens for each key channel, then each query "
                    "times that summary; no query's row over the image's tokens)"),
)


def no_rows(model: torch.nn.Module) -> str | None:
    """What the model's attention computes in place of rows over tokens (``NO_ROWS``), naming its first such module,
    or None."""
    kinds = dict(NO_ROWS)
    return next((f"{kinds[type(m).__name__]} ({name})" for name, m in model.named_modules()
                 if type(m).__name__ in kinds), None)


# Lists of layers (by their attribute's name in the model) that attend over a clip's frames at each patch, not over an
# image's tokens: VideoPrism's factorized space-time attention (``VideoPrismVisionModel.temporal_layers``, after every
# spatial layer), fed an image as a clip of one frame (``one_frame``): each token's softmax over its own one frame
OVER_TIME = (("temporal_layers", "temporal attention (VideoPrism's: each patch over the clip's frames, one frame for "
                                 "an image)"),)


# Modules (by class) that run one ViT over crops of the image, all in one batch (a call's batch its crops) -> in words
CROPS = {"DepthProPatchEncoder": "Depth Pro's patch encoder: one ViT over {batch} overlapping crops of the image at "
                                 "{scales} scales in one batch, which no single grid places"}
# Modules (by class) that are a second tower over the same image beside the one drawn -> in words: its layers follow
# the first tower's in the forward, so a rollout or the last block's features would chain two separate ViTs
SECOND_TOWERS = {"DepthProFovEncoder": "Depth Pro's FOV encoder: a second ViT over the whole image, feeding its "
                                       "field-of-view head only; the image encoder's layers are drawn, so that "
                                       "rollout and features read one tower"}


def _crops(call: AttentionCall, modules: dict[str, torch.nn.Module]) -> str | None:
    """What ``CROPS`` says of the module around ``call`` that runs it over crops (its batch more than one), or what
    ``SECOND_TOWERS`` says of a second tower around it; else None."""
    parts = call.name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = modules.get(".".join(parts[:i]))
        words = CROPS.get(type(module).__name__)
        if words is not None and call.batch > 1:
            scales = len(getattr(module, "scaled_images_ratios", ())) or "several"
            return words.format(batch=call.batch, scales=scales)
        if type(module).__name__ in SECOND_TOWERS:
            return SECOND_TOWERS[type(module).__name__]
    return None


def left_out(call: AttentionCall, modules: dict[str, torch.nn.Module]) -> str | None:
    """Why ``call`` is no layer over image tokens (``CHANNEL_ATTENTION``'s over a head's channels, ``OVER_TIME``'s
    over frames, GC ViT's global queries, a ViT over crops of the image: ``CROPS``, a second tower: ``SECOND_TOWERS``),
    in words, or None where it is attention over tokens."""
    crops = _crops(call, modules)
    if crops is not None:
        return crops
    module = modules.get(call.name)
    kind = type(module).__name__
    if kind in CHANNEL_ATTENTION:
        heads = getattr(module, "num_heads", None) or getattr(module, "groups", None)
        dim = next((m.in_features for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
        if isinstance(heads, int) and dim and call.queries == call.keys == dim // heads:
            return f"cross-covariance attention ({kind}: over {dim // heads} channels a head)"
    over_time = next((words for lists, words in OVER_TIME if f".{lists}." in f".{call.name}"), None)
    if over_time is not None:
        return over_time
    if kind == "WindowAttentionGlobal" and getattr(module, "use_global", False):
        return "global-query attention (GC ViT's: queries pooled from the whole stage, shared by every window)"
    return None


def split_layers(calls: list[AttentionCall], modules: dict[str, torch.nn.Module]
                 ) -> tuple[list[AttentionCall], dict[str, str]]:
    """``calls`` less those ``left_out`` names, renumbered in the forward's order (the layers), and the left-out
    calls' modules -> why. ValueError (one line) where no call is left: nothing over image tokens to draw."""
    layers, out = [], {}
    for call in calls:
        why = left_out(call, modules)
        if why is None:
            layers.append(AttentionCall(len(layers), call.name, call.kind, call.heads, call.queries, call.keys,
                                        call.batch))
        else:
            out[call.name] = why
    if out and not layers:
        first = next(iter(out))
        raise ValueError(f"its {out[first]} (layer 0, {first}) is not attention over image tokens, and none of its "
                         "layers is: no layout on this road")
    return layers, out
