"""The maps that run the model again for one image: the class-specific map's gradients (``class_relevance``) and
LeGrad, LRP, AttnLRP, the CAMs and attention flow (``model_method_map``), each refused against its memory bound
(the cost model, ``vit.costs.plan``) before any work. The page caches them per (checkpoint, image, class and settings).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from vit import registry
from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, ModelInput
from vit.core.progress import Progress
from vit.costs import plan
from vit.costs.memory import CHUNK_BYTES
from vit.explain.methods.attention import class_gradients, positive_gradient_attention, token_map
from vit.explain.methods.chunked import LayerInputs
from vit.explain.methods.hidden import forward_with_hidden_states, placed_attentions
from vit.explain.views.attention_maps import (
    CAM_KINDS,
    CHEFER_BASELINES,
    MAP_KINDS,
    METHOD_MAP_KINDS,
    STAGE_MAP_KINDS,
    ClassRelevance,
    is_method_map,
    method_of,
    stage_refusal,
)
from vit.explain.views.image_analysis import Analysis
from vit.model import ViT


def reported_blocks(model, progress: Progress | None, total: int):
    """A context in which every block's output (``hook_resid_post``) reports ``progress(blocks run, total)``:
    where a long map's work can be stopped (the page's ``progress`` raises ``Stopped`` there). ``total`` counts the
    blocks the method runs (a forward is ``L``; a block run again counts too)."""
    if progress is None or not isinstance(model, ViT):
        return contextlib.nullcontext()
    count = itertools.count(1)
    return model.hooks([(f"blocks.{i}.hook_resid_post", lambda t, hook: progress(min(next(count), total), total))
                        for i in range(len(model.blocks))])


def class_relevance(checkpoint: Checkpoint, image: Image.Image, class_index: int,
                    size: InputSize = TRAINING_SIZE, progress: Progress | None = None) -> ClassRelevance:
    """One forward and backward pass for ``class_index`` (the page caches it per checkpoint, image and class).

    While every layer's attention and its gradient fit the memory limit they are kept whole; above, one block's
    backward at a time keeps the gradient of its heads' contexts, and the map's row is formed in chunks
    (``LayerInputs.gradient_rollout_row``). ``TooManyTokens`` when even that would be over the limit.
    ``progress(blocks run, total)`` at each block's output (``reported_blocks``).
    """
    model, given = checkpoint.model, ModelInput.of(checkpoint, image, size)
    device = next(model.parameters()).device
    return input_class_relevance(model, lambda: given.pixels(device), model.patch_grid(*given.shape), class_index,
                                 progress)


def input_class_relevance(model: ViT, pixels: Callable[[], torch.Tensor], grid: tuple[int, int], class_index: int,
                          progress: Progress | None = None) -> ClassRelevance:
    """``class_relevance`` of the model's input ``pixels()`` (called once the bound is passed: an image ``(1, C, H,
    W)`` or a video model's clip ``(1, frames, C, H, W)``) on its patch grid ``grid`` (a clip's folded grid)."""
    verdict = plan.decide(plan.class_map(model, grid))  # "run" whole, or in "chunks"; refused over both
    windowed = bool(model.config.window_size) and not model.num_prefix_tokens  # Qwen2.5-VL's, SAM's windows
    if windowed and verdict != "run":
        raise plan.TooManyTokens(f"The class-specific map through windows keeps every layer's windows and their "
                                 f"gradient, over the memory limit at a {grid[0]}x{grid[1]} patch grid (the path in "
                                 "chunks reads whole layers). Choose a smaller input size, or LeGrad.")
    if model.config.stage_depths or windowed:  # windows: H x T x w*w values per layer, never T x T
        layouts = model.layer_layouts(grid)
        x = pixels()
        with reported_blocks(model, progress, len(model.blocks)):
            _, attentions, gradients = class_gradients(model, x, class_index)
        return ClassRelevance(class_index, tuple(positive_gradient_attention(a, g).float().cpu()
                                                 for a, g in zip(attentions, gradients, strict=True)), layouts=layouts)
    whole = verdict == "run"
    x = pixels()  # (1, C, H, W), or a clip's (1, frames, C, H, W)
    L = len(model.blocks)
    if whole:
        with reported_blocks(model, progress, L):
            _, attentions, gradients = class_gradients(model, x, class_index)
        terms = tuple(positive_gradient_attention(a, g).float().cpu()
                      for a, g in zip(attentions, gradients, strict=True))
        return ClassRelevance(class_index, terms)
    with reported_blocks(model, progress, 2 * L):  # a forward, then each block again
        with torch.inference_mode():
            _, hidden = forward_with_hidden_states(model, x)  # (1, L + 1, T, D)
        inputs = LayerInputs(model, hidden, grid, budget=CHUNK_BYTES)
        contexts = inputs.context_gradients(torch.tensor([class_index]))
    return ClassRelevance(class_index, (), inputs=inputs, contexts=contexts)


def draws_pixels(kind: str) -> bool:
    """Whether ``kind``'s map is drawn on the model's input pixels: a built-in pixel method (``registry.Method.pixels``:
    captum's Integrated Gradients, SmoothGrad, Input x Gradient), as ``vit.explain`` gives it."""
    method = registry.find_method(kind)
    return method is not None and method.pixels and method.plugin is None


def pixel_patch_sums(pixel_map: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """A pixel method's ``(H, W)`` map summed over each patch's pixels: ``(gh, gw)``, the map its patch sums give
    (``relevance.patch_sums``, as ``model_method_map`` without ``pixels``), for what reads the patch grid."""
    from vit.explain.methods.relevance import patch_sums

    pixels = torch.from_numpy(np.ascontiguousarray(pixel_map, dtype=np.float32))[None]  # (1, H, W)
    return patch_sums(pixels, tuple(grid))[0].numpy()  # (gh, gw)


def model_method_map(checkpoint: Checkpoint, image: Image.Image, kind: str, class_index: int, query: int = 0,
                     end_layer: int = -1, fusion: str = "mean", size: InputSize = TRAINING_SIZE,
                     progress: Progress | None = None, start_layer: int = -2, analysis: Analysis | None = None,
                     hooks: Sequence[tuple[str, Callable]] = (), options: Mapping[str, object] | None = None,
                     pixels: bool = False) -> np.ndarray:
    """The ``(gh, gw)`` map of a ``METHOD_MAP_KINDS`` kind or a plugin's method for one image (seconds for
    ``flow``; a plugin's: ``plugin_map``); with ``pixels``, a pixel method's (``captum_maps.PIXEL_METHODS``)
    ``(H, W)`` map on the model's input pixels instead of its patch sums (refused for the others).

    ``class_index`` is the explained class (LeGrad, LRP, AttnLRP); ``query`` the token whose
    relevance or flow is shown (LRP, flow; LeGrad and AttnLRP explain the classifier's CLS); ``start_layer``
    LeGrad's first explained layer (its authors' ``layer_index``). ``analysis``: this image's at this size, where
    one is at hand: a CAM starts from the input it kept of the explained block (``Analysis.block_input``), so the
    model's embedding and the blocks before that one run once, not again. ``hooks``: set on a CAM's forward but
    Score-CAM's (an analysis read off it: ``image_analysis.analyse``'s ``forward``); refused for other kinds.
    Raises ValueError (e.g. ``UnsupportedModelError``, ``TooManyTokens``) with a message to show, before any
    work. ``progress(done, total)``: flow's max-flow problems, one per token; the other methods' blocks run
    (``reported_blocks``). ``options``: the parameters of captum's attributions and RISE
    (``vit.explain.methods.captum_maps.Options``: captum's names, e.g. ``n_steps``); refused for other kinds.
    """
    from vit.explain.methods.attention_flow import MAX_FLOW_TOKENS, attention_flow
    from vit.explain.methods.captum_maps import ATTRIBUTION_METHODS, PIXEL_METHODS, attribution_map
    from vit.explain.methods.relevance import LRP_MAPS, attnlrp, check_lrp, legrad, patch_sums, transformer_attribution

    if pixels and kind not in PIXEL_METHODS:
        raise ValueError(f"{kind}'s map is on the patch grid; the pixel maps are {', '.join(PIXEL_METHODS)}")
    if kind in ATTRIBUTION_METHODS:  # captum's and RISE: their options and costs checked there, before the work
        if hooks:
            raise ValueError(f"hooks are set on a CAM's one forward; {kind} runs others")
        shown = attribution_map(checkpoint, image, kind, class_index, size, options, progress,
                                lambda total: reported_blocks(checkpoint.model, progress, total), pixels)
        return shown[0].float().cpu().numpy()  # (gh, gw), or (H, W) with pixels
    if options:
        raise ValueError(f"{kind} takes no options; captum's attributions and RISE do")
    model = checkpoint.model
    if model.config.stage_depths and kind not in STAGE_MAP_KINDS:
        raise ValueError(stage_refusal(kind))
    given = ModelInput.of(checkpoint, image, size)
    shape = given.shape  # (height, width)
    grid, prefix = model.patch_grid(*shape), model.num_prefix_tokens
    if analysis is not None and (analysis.grid != grid or analysis.input_size != shape):
        raise ValueError(f"the analysis given is of a {analysis.input_size[1]}x{analysis.input_size[0]} px input, "
                         f"this map's is {shape[1]}x{shape[0]} px: pass the analysis of this image at this size")
    if kind not in METHOD_MAP_KINDS:  # a plugin's; ValueError for any other kind
        plugin = method_of(kind)
        if plugin.draw is None:
            raise ValueError(f"{kind!r} is not drawn here; choose one of: "
                             f"{', '.join(m.name for m in registry.methods() if is_method_map(m.name))}")
        return plugin_map(checkpoint, given, plugin, grid, class_index, query, end_layer, progress)
    # Every method's bound before the work it implies: flow's forward keeps every layer's whole attention (9 GB
    # for ViT-B/16 at 1,024 px) before attention_flow's own limit would refuse the input.
    if kind == "legrad":  # in chunks (never a whole layer's attention or gradient), or a model's stages' windows
        plan.decide(plan.legrad(model, grid, start_layer))
    checkpointed = False
    if kind == "attnlrp":  # whole, or each block again in the backward (its path in chunks)
        checkpointed = plan.decide(plan.attnlrp(model, grid)) == "chunks"
    elif kind in ("lrp",) + CHEFER_BASELINES:  # GradCAM on attention: its gradient stops at the last block
        if kind in LRP_MAPS:  # a model no rule reaches is refused for that, at any size
            check_lrp(model, kind)
        plan.decide(plan.gradient(model, grid, MAP_KINDS[kind].split(" (")[0],
                                  layers=1 if kind == "attn-gradcam" else None))
    elif kind == "flow":
        plan.decide(plan.flow(model, grid, MAX_FLOW_TOKENS))
    elif kind in CAM_KINDS:  # the graph from the explained block on (Score-CAM: forwards without one)
        plan.decide(plan.gradient(model, grid, MAP_KINDS[kind].split(" (")[0],
                                  layers=len(range(len(model.blocks))[end_layer:])))
    if hooks and (kind not in CAM_KINDS or kind == "scorecam"):
        raise ValueError(f"hooks are set on a CAM's one forward; {kind} runs others")
    x = given.pixels(next(model.parameters()).device)  # (1, C, H, W)
    L = len(model.blocks)
    if kind == "legrad":
        with reported_blocks(model, progress, L - 1 + len(range(L)[start_layer:])):  # the explained ones again
            result = legrad(model, x, class_index, start_layer, budget=CHUNK_BYTES)
    elif kind == "lrp":
        with reported_blocks(model, progress, L):
            result = token_map(transformer_attribution(model, x, class_index, end_layer), query, grid, prefix)
    elif kind == "attnlrp":
        with reported_blocks(model, progress, 2 * L if checkpointed else L):  # the blocks again in the backward
            result = patch_sums(attnlrp(model, x, class_index, checkpointed=checkpointed), grid)
    elif kind == "attn-gradcam":
        from vit.explain.methods.cam import attention_gradcam

        with reported_blocks(model, progress, L):
            result = attention_gradcam(model, x, class_index)
    elif kind == "lrp-partial":
        from vit.explain.methods.relevance import partial_lrp

        with reported_blocks(model, progress, L):
            result = partial_lrp(model, x, class_index)
    elif kind == "lrp-full":
        from vit.explain.methods.relevance import full_lrp

        with reported_blocks(model, progress, L):
            result = patch_sums(full_lrp(model, x, class_index), grid)
    elif kind in CAM_KINDS:
        from vit.explain.methods.cam import cam

        residual = None if analysis is None else analysis.block_input(end_layer)
        residual = None if residual is None else residual[None]  # (1, T, D)
        if kind == "scorecam":  # progress by masked image: one forward of the model per channel
            result = cam(model, x, kind, class_index, end_layer, progress=progress, residual=residual)
        else:
            with reported_blocks(model, progress, L if residual is None else len(range(L)[end_layer:])):
                result = cam(model, x, kind, None if kind == "eigencam" else class_index, end_layer,
                             residual=residual, hooks=hooks)
    elif kind == "flow":
        with torch.no_grad():
            _, attentions = model(x, output_attentions=True)
        attentions = placed_attentions(model, attentions, grid)
        result = attention_flow(attentions, query, fusion, end_layer, progress=progress)[:, prefix:].reshape(1, *grid)
    return result[0].float().cpu().numpy()  # (gh, gw)


class PluginMethodError(ValueError):
    """A plugin's method failed on a model: the message names the method and its plugin, in one line."""


def plugin_map(checkpoint: Checkpoint, given: ModelInput, method, grid: tuple[int, int], class_index: int,
               query: int, end_layer: int, progress: Progress | None = None) -> np.ndarray:
    """The ``(gh, gw)`` map of a plugin's ``method`` (a ``vit.registry.Method`` with ``draw``), after its cost
    (``vit.costs.plan``: a forward's, or a gradient's for a class-specific one) is checked: ``draw(model, x,
    target, layer, query)`` as ``Method`` says. Whatever the plugin raises is one line naming it
    (``PluginMethodError``), as is a map of another shape than the patch grid."""
    model = checkpoint.model
    L = len(model.blocks)
    layer = range(L)[end_layer]  # from 0, a negative one counted from the end
    if (method.cost or ("gradient" if method.class_specific else "forward")) == "gradient":
        plan.decide(plan.gradient(model, grid, method.title.split(" (")[0], layers=L - layer))
    else:
        plan.decide(plan.forward(model, grid, method.title.split(" (")[0], attentions=True))
    x = given.pixels(next(model.parameters()).device)  # (1, C, H, W)
    who = f"{method.name} (plugin {method.plugin})"
    stopped: list[BaseException] = []  # what the caller's progress raised (the page's Stop): passed on as it is

    def report(done: int, total: int) -> None:
        try:
            progress(done, total)
        except BaseException as e:
            stopped.append(e)
            raise

    try:
        with reported_blocks(model, None if progress is None else report, L):
            result = method.draw(model, x, class_index if method.class_specific else None, layer, query)
    except Exception as e:
        if stopped:
            raise stopped[0] from None
        if isinstance(e, ValueError):  # the plugin's own refusal: its message, naming it
            raise PluginMethodError(f"{who}: {str(e).splitlines()[0] if str(e) else 'refused'}") from None
        # a plugin's fault is one line, as a refusal is: it never stops the page with a traceback
        raise PluginMethodError(f"{who} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                ) from None
    try:
        array = np.asarray(result.detach().float().cpu() if isinstance(result, torch.Tensor) else result,
                           dtype=np.float32)
    except (TypeError, ValueError, RuntimeError):
        raise PluginMethodError(f"{who} gave a {type(result).__name__}, not a map of the patch grid") from None
    if array.shape == (1, *grid):
        array = array[0]
    if array.shape != grid:
        raise PluginMethodError(f"{who} gave a map of shape {array.shape}; the patch grid is {grid[0]}x{grid[1]}")
    return array
