"""A clip through a video model (VideoMAE): one forward kept as an ``Analysis`` on the clip's folded grid
``(t*gh, gw)`` (``vit.model.layouts.folded_grid``: row-major there is the model's time-major token order), so every
map of ``vit.explain.views.attention_maps`` that reads the attentions and hidden states draws for a clip as for an
image; ``clip_map`` unfolds the map it gives to per-frame maps ``(frames, gh, gw)``, a tubelet's value repeated over its
frames.

Token ``n`` is the tubelet ``(n // (gh*gw), n // gw % gh, n % gw)`` (time in tubelets); ``clip_token`` gives it.
One class's maps run the model again on the clip's pixels (``clip_class_map``, cached in the analysis): the class map
(Chefer et al.'s gradient rollout, a tubelet's row), LeGrad (the classifier's mean pooling read at each layer) and
AttnLRP (each frame's own pixels' relevance, summed over its patches); so do the CAMs pytorch-grad-cam defines for 3D
feature maps (``clip_cam_map``: Grad-CAM, LayerCAM, EigenCAM). The others are refused in one line, each for
its reason (``CLIP_REFUSALS``); TimeSformer's divided blocks are refused the maps defined for one attention per block
(rollout, the class map, LeGrad), AttnLRP running through them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.cache import ByteCache
from vit.core.clips import clip_pixels
from vit.core.inference import predictions_from_logits, seen_region
from vit.core.progress import Progress
from vit.costs import bounds
from vit.costs.fits import LAYER_CACHE_BYTES, check_input_fits
from vit.explain.methods.attention import rollout
from vit.explain.methods.hidden import LayerAttentions, forward_with_hidden_states
from vit.explain.views.attention_maps import MAP_KINDS, MapSettings, attention_map, head_maps
from vit.explain.views.image_analysis import Analysis
from vit.explain.views.overlay import overlay as draw_overlay
from vit.model.layouts import clip_grid, clip_token, folded_grid, frame_maps

CLASS_CLIP_KINDS = ("class", "legrad", "attnlrp")  # one class's maps: the clip's forward again, with a backward
# pytorch-grad-cam's CAMs defined for 3D feature maps (its base_cam's and GradCAM's 5-D branches; LayerCAM's
# product and EigenCAM's projection take any), read on a block's first norm over every tubelet
CLIP_CAM_KINDS = ("gradcam", "layercam", "eigencam")
CLIP_MAP_KINDS = ("attention", "rollout", "norms", "similarity", "lens") + CLASS_CLIP_KINDS + CLIP_CAM_KINDS
CLASS_READ_KINDS = CLASS_CLIP_KINDS + ("lens", "gradcam", "layercam")  # the maps that read a class (its picker)
# The clip maps MAP_KINDS (the image page's) does not name
CLIP_KIND_LABELS = {**MAP_KINDS, "temporal": "Temporal attention (a patch over the frames, TimeSformer)",
                    "similarity": "Similarity to the query (cosine, one layer's tokens, every frame)",
                    "lens": "Logit lens (the class's probability read from each token at one layer)"}
# Why each other map is not drawn for clips (a VideoMAE, a V-JEPA 2): one line each
POOLER_REFUSAL = ("V-JEPA 2's classifier reads the clip through its attentive pooler's own self-attention layers, "
                  "which this map does not follow; use AttnLRP, whose rules run through them, Grad-CAM or LayerCAM "
                  "(or attention, rollout, similarity)")
# The class maps that follow an attentive pooler's own layers (V-JEPA 2's classifier): AttnLRP's rules sit on the
# elementary operations, the pooler's among them
POOLER_CLASS_KINDS = ("attnlrp", "gradcam", "layercam")  # the CAMs: the class's gradient by autograd, pooler and all
CLIP_REFUSALS = {
    **{kind: f"{MAP_KINDS[kind].split(' (')[0]} is Chefer et al.'s, whose rules read a CLS token through one head; "
             "a video model's classifier pools every tubelet: use AttnLRP"
       for kind in ("lrp", "attn-gradcam", "lrp-partial", "lrp-full")},
    **{kind: f"{MAP_KINDS[kind].split(' (')[0]} is defined by pytorch-grad-cam for 2D feature maps only (its "
             "channel weights sum over two axes, or it upsamples to one image); a clip's tubelets make a 3D one: use "
             "Grad-CAM, LayerCAM or EigenCAM"
       for kind in ("gradcam++", "xgradcam", "scorecam")},
    "flow": "attention flow solves one max-flow problem per token over every layer, too slow at a clip's thousands "
            "of tubelets: use rollout",
    "probe": "a video model's pooling probe is not drawn for clips: use attention or rollout",
    "probe_rollout": "a video model's pooling probe is not drawn for clips: use attention or rollout",
}
# TimeSformer (divided attention): each block's two attentions, the spatial one ("attention", HF's
# output_attentions) and the temporal one; rollout is refused (below), norms read the hidden states as for VideoMAE;
# AttnLRP's rules sit on the elementary operations, both attentions' among them, so it runs through divided blocks
DIVIDED_MAP_KINDS = ("attention", "temporal", "norms", "similarity", "lens", "attnlrp")
DIVIDED_ROLLOUT = ("rollout is not drawn for TimeSformer: its blocks attend twice (over time, then within a frame, "
                   "with a dense layer between), and rollout is defined for one attention per block; choose "
                   f"{', '.join(DIVIDED_MAP_KINDS)}")
DIVIDED_CLASS_MAPS = ("{name} is not drawn for TimeSformer: it is defined for one attention per block, and "
                      "TimeSformer's blocks attend twice (over time, then within a frame); choose "
                      f"{', '.join(DIVIDED_MAP_KINDS)}")
# Chefer et al.'s maps, each defined for one attention per block
ONE_ATTENTION_KINDS = ("class", "legrad", "lrp", "attn-gradcam", "lrp-partial", "lrp-full")


# The class maps defined on a pooled classifier (VideoMAE's mean of the tubelets) that a CLS classifier's clip
# (ViViT's) is not drawn with: their reading of the class through the CLS is not held to a reference for clips yet
CLS_CLIP_REFUSAL = ("{name} of a clip is drawn for a classifier that pools its tubelets; this one reads a CLS token, "
                    "which it is not checked for yet: use AttnLRP, Grad-CAM or LayerCAM (or attention, rollout)")


def _reads_a_cls(checkpoint: Checkpoint) -> bool:
    """A joint-attention video classifier reading a CLS token (ViViT's), not a pool of the tubelets."""
    config = checkpoint.model.config
    return bool(config.class_token and not config.divided_attention and checkpoint.model.head is not None)


def refusal(checkpoint: Checkpoint, kind: str) -> str | None:
    """Why ``kind`` is not drawn for this video checkpoint's clips (one line), or None where it is."""
    divided = is_divided(checkpoint)
    kinds = DIVIDED_MAP_KINDS if divided else CLIP_MAP_KINDS
    if kind in ("class", "legrad") and _reads_a_cls(checkpoint):
        return CLS_CLIP_REFUSAL.format(name="The class map" if kind == "class" else "LeGrad")
    if (kind in CLASS_READ_KINDS and kind not in POOLER_CLASS_KINDS
            and getattr(checkpoint.model, "pool_blocks", None) is not None):
        return POOLER_REFUSAL
    if kind in kinds:
        return None
    name = MAP_KINDS.get(kind, kind)
    if divided and kind == "rollout":
        return DIVIDED_ROLLOUT
    if divided and kind in CLIP_CAM_KINDS:
        return (f"{name.split(' (')[0]} reads a block's first norm over every token, and TimeSformer's blocks have two "
                f"(over time, then within a frame); choose {', '.join(DIVIDED_MAP_KINDS)}")
    if divided and kind in ONE_ATTENTION_KINDS:
        return DIVIDED_CLASS_MAPS.format(name="the class map" if kind == "class" else name.split(" (")[0])
    if kind in CLIP_REFUSALS:
        return CLIP_REFUSALS[kind]
    return f"{name} is not a map of clips; choose one of: {', '.join(kinds)}"


def clip_map_kinds(checkpoint: Checkpoint) -> tuple[str, ...]:
    """The map kinds this video checkpoint draws for clips, in the page's order: a model without a classifier
    (V-JEPA 2's encoder) has no class to explain."""
    kinds = DIVIDED_MAP_KINDS if is_divided(checkpoint) else CLIP_MAP_KINDS
    if checkpoint.model.head is None or not checkpoint.class_names:
        kinds = tuple(k for k in kinds if k not in CLASS_READ_KINDS)
    elif getattr(checkpoint.model, "pool_blocks", None) is not None:  # V-JEPA 2's classifier: POOLER_REFUSAL
        kinds = tuple(k for k in kinds if k not in CLASS_READ_KINDS or k in POOLER_CLASS_KINDS)
    if _reads_a_cls(checkpoint):  # ViViT's: CLS_CLIP_REFUSAL
        kinds = tuple(k for k in kinds if k not in ("class", "legrad"))
    return kinds


def is_divided(checkpoint: Checkpoint) -> bool:
    """Whether the checkpoint's model divides its attention over time and space (TimeSformer)."""
    return bool(getattr(checkpoint.model.config, "divided_attention", False))


def is_video(checkpoint: Checkpoint) -> bool:
    """Whether the checkpoint's model takes clips (a tubelet embedding)."""
    return bool(getattr(checkpoint.model.config, "tubelet_size", 0))


@dataclass
class ClipAnalysis:
    """One clip through one video checkpoint: the image ``Analysis`` on its folded grid, the clip's token grid
    ``(t, gh, gw)`` and its tubelet length, and the frames the model saw (after the processor's crop)."""

    analysis: Analysis
    grid: tuple[int, int, int]  # (tubelets, gh, gw)
    tubelet: int
    frames: list[Image.Image]  # the sampled frames, as decoded

    @property
    def num_frames(self) -> int:
        return self.grid[0] * self.tubelet

    def token(self, time: int, row: int, col: int) -> int:
        """The token of the tubelet holding frame ``time``'s patch ``(row, col)`` (after the prefix tokens)."""
        return self.analysis.num_prefix_tokens + clip_token(self.grid, time // self.tubelet, row, col)

    def maps(self, values: torch.Tensor | np.ndarray) -> np.ndarray:
        """Per-token values ``(..., t*gh*gw)`` -> per-frame maps ``(..., frames, gh, gw)``."""
        return frame_maps(torch.as_tensor(np.asarray(values)), self.grid, self.tubelet).numpy()


def clip_tokens(checkpoint: Checkpoint, count: int) -> int:
    """How many tokens a clip of ``count`` frames is for this video checkpoint (prefix tokens included)."""
    model, (height, width) = checkpoint.model, checkpoint.preprocessing.image_hw
    t, gh, gw = clip_grid(count, height, width, model.config.tubelet_size, model.config.patch_hw)
    return model.num_prefix_tokens + t * gh * gw


def analyse_clip(checkpoint: Checkpoint, frames: Sequence[Image.Image], top_k: int = 5,
                 max_tokens: int | None = None, allow: str = f"raise {bounds.MAX_TOKENS_ENV}",
                 progress: Progress | None = None) -> ClipAnalysis:
    """Run the video model once on ``frames`` (already sampled to its ``num_frames``); layers' attentions are
    computed when first read, as ``image_analysis.analyse`` does. ``TooManyTokens`` / ValueError before the forward
    for a clip past the bounds or of a shape the model does not take. ``progress(blocks run, L)`` at each block's
    output (where the page's Stop is heard)."""
    from vit.explain.views.method_maps import reported_blocks

    model, p = checkpoint.model, checkpoint.preprocessing
    c = model.config
    if not is_video(checkpoint):
        raise ValueError("this model takes images, not clips; give it an image")
    (height, width), count = p.image_hw, len(frames)
    grid = clip_grid(count, height, width, c.tubelet_size, c.patch_hw)
    folded = folded_grid(grid)
    check_input_fits(checkpoint, folded, f"A clip of {count} frames of {width}×{height} px", max_tokens, allow)
    device = next(model.parameters()).device
    x = clip_pixels(frames, p).to(device)  # (1, T, C, H, W)
    with torch.inference_mode(), reported_blocks(model, progress, len(model.blocks)):
        logits, hidden = forward_with_hidden_states(model, x)  # (1, classes), (1, L + 1, N, D)
    if logits is None:
        logits = x.new_zeros(1, 0)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    hidden = hidden[0].float().cpu()
    cache = ByteCache(LAYER_CACHE_BYTES)
    analysis = Analysis(prediction=prediction, attentions=LayerAttentions(model, hidden, cache, folded), grid=folded,
                        patch_size=c.patch_size, input_size=(folded[0] * c.patch_hw[0], width),
                        num_prefix_tokens=model.num_prefix_tokens, hidden=hidden, training_size=None, cache=cache,
                        position_table=False)
    return ClipAnalysis(analysis, grid, c.tubelet_size, list(frames))


def divided_attentions(clip: ClipAnalysis, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TimeSformer's two attentions in ``layer``, recomputed from its input state: the spatial one ``(t, nh, 1 + P,
    1 + P)`` (frame ``f``'s CLS copy and patches, row-major: HF's ``output_attentions``) and the temporal one ``(P, nh,
    t, t)`` (patch position ``p = row*gw + col`` over its frames: HF's ``temporal_attention``'s), float32 on the CPU;
    ``P = gh*gw``."""
    return clip.analysis.cache.get_or_compute(("divided", layer), lambda: _divided_attentions(clip, layer))


def _divided_attentions(clip: ClipAnalysis, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    model = clip.analysis.attentions.model
    kept: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, hook) -> None:
        kept["temporal"] = x

    device = next(model.parameters()).device
    x = clip.analysis.hidden[layer][None].to(device)  # (1, T, D)
    with torch.inference_mode(), model.hooks([(f"blocks.{layer}.temporal_attn.hook_pattern", keep)]):
        _, [spatial] = model.run_blocks(x, clip.analysis.grid, layer, layer + 1, output_attentions=True)
    return spatial.float().cpu(), kept["temporal"].float().cpu()


def saved_layers(checkpoint: Checkpoint) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays ``vit.predict --save-maps`` writes for one clip of this video checkpoint (its own clip size), as
    ``(name, shape)``: ``layer_i`` ``(heads, T, T)`` over every token; TimeSformer's divided blocks ``layer_i``, the
    spatial one ``(t, heads, 1 + P, 1 + P)``, and ``temporal_i`` ``(P, heads, t, t)`` (``divided_attentions``)."""
    model = checkpoint.model
    c, L, H = model.config, len(model.blocks), model.config.num_heads
    (height, width), frames = checkpoint.preprocessing.image_hw, c.num_frames
    t, gh, gw = clip_grid(frames, height, width, c.tubelet_size, c.patch_hw)
    if c.divided_attention:
        P = gh * gw
        return [item for i in range(L) for item in ((f"layer_{i}", (t, H, 1 + P, 1 + P)),
                                                    (f"temporal_{i}", (P, H, t, t)))]
    T = model.num_prefix_tokens + t * gh * gw
    return [(f"layer_{i}", (H, T, T)) for i in range(L)]


def saved_pieces(clip: ClipAnalysis, name: str) -> Iterator[np.ndarray]:
    """The array ``name`` of ``saved_layers`` for ``clip``, in pieces (C order), one layer computed at a time."""
    kind, layer = name.rsplit("_", 1)
    if getattr(clip.analysis.attentions.model.config, "divided_attention", False):
        spatial, temporal = divided_attentions(clip, int(layer))
        yield (temporal if kind == "temporal" else spatial).numpy()
        return
    attention = clip.analysis.attentions[int(layer)]  # (1, heads, T, T)
    for head in attention[0]:
        yield head.float().numpy()


def _divided_map(clip: ClipAnalysis, kind: str, layer: int, head: int | None, query: int) -> np.ndarray:
    """TimeSformer's ``kind`` ("attention": spatial, or "temporal") map of token ``query`` (0: the CLS; ``1 + n``:
    patch token ``n``, time-major) in ``layer``, ``(heads or 1, frames, gh, gw)``, the keys' probabilities where they
    sit: a patch's spatial row on its own frame (the CLS key left out, DINO's way), the CLS's row in each frame (its
    copy there; its output is their mean); a patch's temporal row on its own position in every frame. Zero elsewhere."""
    t, gh, gw = clip.grid
    spatial, temporal = divided_attentions(clip, layer)
    heads = spatial.shape[1]
    maps = torch.zeros(heads, t, gh, gw)
    if query == 0:
        if kind == "temporal":
            raise ValueError("the CLS token takes no part in TimeSformer's temporal attention; click a patch")
        maps[:] = spatial[:, :, 0, 1:].transpose(0, 1).reshape(heads, t, gh, gw)
    else:
        frame, position = divmod(query - 1, gh * gw)
        if kind == "temporal":
            maps.view(heads, t, gh * gw)[:, :, position] = temporal[position, :, frame]  # (heads, t)
        else:
            maps[:, frame] = spatial[frame, :, 1 + position, 1:].reshape(heads, gh, gw)
    return (maps.mean(dim=0, keepdim=True) if head is None else maps[head:head + 1]).numpy()


def clip_map(clip: ClipAnalysis, settings: MapSettings) -> np.ndarray:
    """The ``(frames, gh, gw)`` map of ``settings`` (its ``query`` a token index: ``ClipAnalysis.token``), each
    tubelet's value repeated over its frames; ValueError (one line) for a map not drawn for clips."""
    divided = getattr(clip.analysis.attentions.model.config, "divided_attention", False)
    if divided and settings.kind in ("attention", "temporal"):
        return _divided_map(clip, settings.kind, settings.layer % len(clip.analysis.attentions), settings.head,
                            settings.query)[0]
    if settings.kind not in ("attention", "rollout", "norms") or (divided and settings.kind == "rollout"):
        # (similarity: similarity_clip_map, which reads the checkpoint's final norm)
        raise ValueError(f"{MAP_KINDS.get(settings.kind, settings.kind)} is not drawn from the clip's forward alone: "
                         "use explain_analysed (a class's maps: clip_class_map)")
    folded = attention_map(clip.analysis, settings)  # (t*gh, gw): row-major is the time-major token order
    return clip.maps(folded.reshape(-1))


def layer_tokens(checkpoint: Checkpoint, clip: ClipAnalysis, layer: int) -> torch.Tensor:
    """Every token of layer ``layer``'s output (0-based, negative from the end) after the final norm, as the image
    page's dense views read them: ``(T, D)`` float32, the prefix tokens first, then the tubelets time-major; kept in
    the clip's analysis."""
    L = len(clip.analysis.attentions)
    if isinstance(layer, bool) or not isinstance(layer, int) or not -L <= layer < L:
        raise ValueError(f"layer {str(layer)[:40]} is out of range: this model has {L} layers")
    index = layer % L

    def compute() -> torch.Tensor:
        model = checkpoint.model
        parameter = next(model.parameters())
        with torch.inference_mode():
            return model.norm(clip.analysis.hidden[index + 1][None].to(parameter.device, parameter.dtype))[0].float(
                ).cpu()  # (T, D)

    return clip.analysis.cache.get_or_compute(("clip tokens", index), compute)


def similarity_clip_map(checkpoint: Checkpoint, clip: ClipAnalysis, layer: int = -1, query: int = 0) -> np.ndarray:
    """The cosine similarity of token ``query`` to every tubelet at ``layer``: ``(frames, gh, gw)``, a tubelet's value
    repeated over its frames; a patch's nearest patches in the other frames are where it is highest."""
    from vit.explain.methods.dense import similarity, unit_tokens

    tokens = layer_tokens(checkpoint, clip, layer)  # (T, D)
    if not 0 <= query < tokens.shape[0]:
        raise ValueError(f"query token {query} is out of range: this clip has {tokens.shape[0]} tokens")
    return clip.maps(similarity(unit_tokens(tokens[clip.analysis.num_prefix_tokens:]), tokens[query]))


def clip_pca(checkpoint: Checkpoint, clip: ClipAnalysis, layer: int = -1) -> np.ndarray:
    """The PCA colours of layer ``layer``'s tubelets fitted on the whole clip (so a colour means one direction in
    every frame: the image page's ``dense.pca_images``): ``(frames, gh, gw, 3)`` in (0, 1)."""
    from vit.explain.methods.dense import pca_images

    tokens = layer_tokens(checkpoint, clip, layer)[clip.analysis.num_prefix_tokens:]  # (t*gh*gw, D)
    [colours], _ = pca_images([tokens])  # (t*gh*gw, 3)
    return np.moveaxis(clip.maps(colours.T), 0, -1)  # (3, frames, gh, gw) -> (frames, gh, gw, 3)


def lens_clip_map(checkpoint: Checkpoint, clip: ClipAnalysis, layer: int = -1, class_index: int | None = None
                  ) -> np.ndarray:
    """The logit lens on a clip: the probability of ``class_index`` (default the predicted) when the model's final
    norm, pooling and head read one token of layer ``layer``'s output as if every token were it
    (``mechanism.token_readout``: a mean-pooled classifier's fc_norm and head, a CLS classifier's norm and head),
    ``(frames, gh, gw)``, a tubelet's value repeated over its frames; from the clip's kept states, no new forward."""
    from vit.explain.mechanism.components import token_readout

    model, wanted = checkpoint.model, _class_of(checkpoint, clip, class_index, "the logit lens")
    L = len(model.blocks)
    if isinstance(layer, bool) or not isinstance(layer, int) or not -L <= layer < L:
        raise ValueError(f"layer {str(layer)[:40]} is out of range: this model has {L} layers")

    def compute() -> torch.Tensor:
        parameter = next(model.parameters())
        with torch.inference_mode():
            tokens = clip.analysis.hidden[layer % L + 1].to(parameter.device, parameter.dtype)  # (T, D)
            return token_readout(model, tokens).float().softmax(dim=-1).cpu()  # (T, classes)

    probabilities = clip.analysis.cache.get_or_compute(("clip lens", layer % L), compute)
    return clip.maps(probabilities[clip.analysis.num_prefix_tokens:, wanted])


def clip_logit_attribution(checkpoint: Checkpoint, clip: ClipAnalysis, class_index: int | None = None):
    """Direct logit attribution of a clip's class logit (default the predicted) into each layer's heads, attention
    biases, MLPs, the embedding and the biases (``mechanism.direct_logit_attribution``: exact, the parts sum to the
    logit); refused in one line for TimeSformer, whose blocks add a temporal branch the split has no part for."""
    from vit.explain.mechanism.components import direct_logit_attribution

    wanted = _class_of(checkpoint, clip, class_index, "direct logit attribution")
    if is_divided(checkpoint):
        raise ValueError("direct logit attribution splits each block into its heads and MLP, and TimeSformer's blocks "
                         "add a temporal attention branch before them; use the logit lens or AttnLRP")
    device = next(checkpoint.model.parameters()).device
    return direct_logit_attribution(checkpoint.model, clip_pixels(clip.frames, checkpoint.preprocessing).to(device),
                                    wanted)


def _class_of(checkpoint: Checkpoint, clip: ClipAnalysis, class_index: int | None, what: str) -> int:
    """``class_index`` checked (default the predicted); ValueError in one line for a model without classes."""
    names = checkpoint.class_names
    if checkpoint.model.head is None or not names:
        raise ValueError(f"{what} explains a class, and this model has no classifier: choose attention, rollout or "
                         "norms")
    wanted = clip.analysis.prediction.class_index if class_index is None else class_index
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted < len(names):
        raise ValueError(f"class {str(wanted)[:40]} is out of range: this model has {len(names)} classes")
    return wanted


def clip_class_map(checkpoint: Checkpoint, clip: ClipAnalysis, kind: str, class_index: int | None = None,
                   layer: int | None = None, query: int = 0, progress: Progress | None = None) -> np.ndarray:
    """One class's ``(frames, gh, gw)`` map of a clip (``CLASS_CLIP_KINDS``), cached in the clip's analysis:
    "class", Chefer et al.'s gradient rollout up to ``layer`` (default the last), row ``query`` (a token; a mean-pooled
    classifier reads every row alike), each tubelet's value repeated over its frames; "legrad", LeGrad from ``layer``
    (default -2, the authors') on, the classifier's pooling read at each layer; "attnlrp", each frame's pixels'
    relevance summed over its patches (a frame's own, not its tubelet's). ``class_index``: default the predicted.
    Each refused against its memory bound (``vit.costs.plan``) before the work; ValueError in one line."""
    from vit.costs import plan
    from vit.costs.memory import CHUNK_BYTES
    from vit.explain.methods.relevance import attnlrp, legrad, patch_sums
    from vit.explain.views.method_maps import input_class_relevance, reported_blocks

    why = refusal(checkpoint, kind)
    if why is not None or kind not in CLASS_CLIP_KINDS:
        raise ValueError(why or f"{kind} is not one class's map; choose one of: {', '.join(CLASS_CLIP_KINDS)}")
    what = "the class map" if kind == "class" else MAP_KINDS[kind].split(" (")[0]
    model, wanted = checkpoint.model, _class_of(checkpoint, clip, class_index, what)
    folded, L = clip.analysis.grid, len(model.blocks)
    device = next(model.parameters()).device

    def pixels() -> torch.Tensor:
        return clip_pixels(clip.frames, checkpoint.preprocessing).to(device)  # (1, frames, C, H, W)

    if kind == "class":
        relevance = clip.analysis.cache.get_or_compute(("clip class", wanted), lambda: input_class_relevance(
            model, pixels, folded, wanted, progress))
        row = relevance.row(query, -1 if layer is None else layer)[0]  # (T,)
        return clip.maps(row[clip.analysis.num_prefix_tokens:].float())
    if kind == "legrad":
        start = -2 if layer is None else layer
        plan.decide(plan.legrad(model, folded, start))

        def compute() -> np.ndarray:
            with reported_blocks(model, progress, L - 1 + len(range(L)[start:])):
                values = legrad(model, pixels(), wanted, start, budget=CHUNK_BYTES)  # (1, t*gh, gw)
            return clip.maps(values[0].reshape(-1).float().cpu())

        return clip.analysis.cache.get_or_compute(("clip legrad", wanted, start % L), compute)
    other = ("attention or rollout" if getattr(model, "pool_blocks", None) is not None  # POOLER_REFUSAL
             else "LeGrad or the class map, which run in chunks")
    # each block again in the backward past the whole path's bound: one block's graph at a time
    checkpointed = plan.decide(plan.attnlrp(model, folded, other=other)) == "chunks"

    def compute_lrp() -> np.ndarray:
        with reported_blocks(model, progress, 2 * L if checkpointed else L):
            relevance = attnlrp(model, pixels(), wanted, checkpointed=checkpointed)[0]  # (frames, H, W)
        return patch_sums(relevance, clip.grid[1:]).float().cpu().numpy()  # (frames, gh, gw)

    return clip.analysis.cache.get_or_compute(("clip attnlrp", wanted), compute_lrp)


def clip_cam_map(checkpoint: Checkpoint, clip: ClipAnalysis, kind: str, class_index: int | None = None,
                 layer: int | None = None, progress: Progress | None = None) -> np.ndarray:
    """A CAM of ``CLIP_CAM_KINDS`` (``vit.explain.methods.cam``) of layer ``layer``'s first norm (default the last
    block's) over every tubelet, as pytorch-grad-cam's on the 3D feature map ``(B, D, t, gh, gw)``: ``(frames, gh,
    gw)``, each tubelet's value repeated over its frames, ReLU applied, not normalised; Grad-CAM and LayerCAM for
    ``class_index`` (default the predicted), EigenCAM for none. Refused against its memory bound before the work, as for
    images; cached in the clip's analysis. ValueError in one line."""
    from vit.costs import plan
    from vit.explain.methods.cam import cam
    from vit.explain.views.method_maps import reported_blocks

    why = refusal(checkpoint, kind)
    if why is not None or kind not in CLIP_CAM_KINDS:
        raise ValueError(why or f"{kind} is not a CAM of clips; choose one of: {', '.join(CLIP_CAM_KINDS)}")
    model, L = checkpoint.model, len(checkpoint.model.blocks)
    layer = -1 if layer is None else layer
    if isinstance(layer, bool) or not isinstance(layer, int) or not -L <= layer < L:
        raise ValueError(f"layer {str(layer)[:40]} is out of range: this model has {L} layers")
    name = MAP_KINDS[kind].split(" (")[0]
    wanted = None if kind == "eigencam" else _class_of(checkpoint, clip, class_index, name)
    # the graph from the explained block on, as for an image's CAM
    plan.decide(plan.gradient(model, clip.analysis.grid, name, layers=len(range(L)[layer:]), other="a later layer"))

    def compute() -> np.ndarray:
        pixels = clip_pixels(clip.frames, checkpoint.preprocessing).to(next(model.parameters()).device)
        residual = clip.analysis.block_input(layer)  # from the analysis's forward: the blocks before run once
        with reported_blocks(model, progress, L if residual is None else len(range(L)[layer:])):
            values = cam(model, pixels, kind, wanted, layer, residual=None if residual is None else residual[None])
        return clip.maps(values[0].reshape(-1).float().cpu())  # values: (1, t*gh, gw)

    return clip.analysis.cache.get_or_compute(("clip cam", kind, wanted, layer % L), compute)


def head_clip_maps(clip: ClipAnalysis, query: int, layer: int, kind: str = "attention") -> np.ndarray:
    """Every head's map of ``query`` in ``layer``: ``(heads, frames, gh, gw)`` (``kind`` "temporal": TimeSformer's
    temporal attention's)."""
    if getattr(clip.analysis.attentions.model.config, "divided_attention", False):
        heads = clip.analysis.attentions.num_heads
        return np.stack([_divided_map(clip, kind, layer, h, query)[0] for h in range(heads)])
    maps = head_maps(clip.analysis, query, layer)  # (H, t*gh, gw)
    return clip.maps(maps.reshape(maps.shape[0], -1))


@dataclass
class ClipExplanation:
    """A clip's map (``explain_clip``): ``map`` ``(frames, gh, gw)``, each frame's map over the region of that frame
    the model saw (``seen``), every head's ``(heads, frames, gh, gw)`` for an attention map, and the prediction."""

    method: str
    map: np.ndarray  # (frames, gh, gw) float32
    frames: list[Image.Image]  # the sampled frames, as decoded
    seen: list[Image.Image]  # each frame's region the model saw (after the processor's crop)
    grid: tuple[int, int, int]  # (tubelets, gh, gw)
    query: int  # the token whose map it is (time-major)
    prediction: object | None  # vit.core.inference.Prediction, None without a classifier
    heads: np.ndarray | None  # (heads, frames, gh, gw) for "attention", else None

    def overlays(self, opacity: float = 0.5, colormap: str = "inferno") -> list[Image.Image]:
        """Each frame with its map over it, on one colour scale for the whole clip."""
        low, high = float(self.map.min()), float(self.map.max())
        return [draw_overlay(frame, m, opacity, colormap, vmin=low, vmax=high) for frame, m in zip(
            self.seen, self.map, strict=True)]


def query_token(grid: tuple[int, int, int], tubelet: int, query: int | Sequence[int] | None, prefix: int = 0
                ) -> int:
    """A query given as a token index (the ``prefix`` tokens first, then the patches time-major), or as ``(frame, row,
    col)``, -> its token; 0 when None."""
    if query is None:
        return 0
    if isinstance(query, (tuple, list)):
        if len(query) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in query):
            raise ValueError(f"a clip's query is a token index or (frame, row, col), got {str(query)[:40]}")
        return prefix + clip_token(grid, query[0] // tubelet, query[1], query[2])
    tokens = prefix + grid[0] * grid[1] * grid[2]
    if isinstance(query, bool) or not isinstance(query, int) or not -tokens <= query < tokens:
        raise ValueError(f"query {str(query)[:40]} is out of range: this clip has {tokens} tokens "
                         f"({grid[0]} x {grid[1]} x {grid[2]} tubelets)")
    return query % tokens


def explain_clip(checkpoint: Checkpoint, frames: Sequence[Image.Image], method: str = "attention",
                 layer: int | None = None, head: int | None = None, query: int | Sequence[int] | None = None,
                 max_tokens: int | None = None, class_index: int | None = None) -> ClipExplanation:
    """The ``method`` map (``CLIP_MAP_KINDS``; TimeSformer's ``DIVIDED_MAP_KINDS``) of a clip's frames (sampled to
    the model's ``num_frames``): ``layer``
    (attention, norms, the CAMs; rollout's and the class map's last layer, default the last; LeGrad's first, default
    -2), ``head`` (attention; default the mean), ``query`` (attention, rollout, class: a token or ``(frame, row,
    col)``; default token 0), ``class_index`` (class, legrad, attnlrp, gradcam, layercam; default the predicted).
    ValueError in one line otherwise (``refusal`` for a map not drawn for clips)."""
    check_clip_settings(checkpoint, method, layer, head, query, class_index)
    return explain_analysed(checkpoint, analyse_clip(checkpoint, frames, max_tokens=max_tokens), method, layer, head,
                            query, class_index)


def check_clip_settings(checkpoint: Checkpoint, method: str, layer: int | None, head: int | None,
                        query: int | Sequence[int] | None, class_index: int | None = None) -> None:
    """ValueError (one line) for a method not drawn for clips (``refusal``), or a setting it does not read or out of
    range."""
    why = refusal(checkpoint, method)
    if why is not None:
        raise ValueError(why)
    if method == "norms" and (head is not None or query is not None):
        raise ValueError("norms reads layer alone")
    if method in ("rollout", "class", "legrad", "attnlrp", "similarity", "lens", *CLIP_CAM_KINDS) and head is not None:
        raise ValueError(f"{method} fuses every head; leave head out")
    if method in ("legrad", "attnlrp", "lens") and query is not None:
        raise ValueError(f"{method} explains the classifier's pooling of every tubelet; leave query out")
    if method in CLIP_CAM_KINDS and query is not None:
        raise ValueError(f"{method} weighs a layer's feature map over every tubelet; leave query out")
    if method == "attnlrp" and layer is not None:
        raise ValueError("attnlrp runs through every layer to the pixels; leave layer out")
    if class_index is not None and method not in CLASS_READ_KINDS:
        raise ValueError(f"{method} is not one class's map; class is read by {', '.join(CLASS_READ_KINDS)}")
    model = checkpoint.model
    L, H = len(model.blocks), model.config.num_heads
    for name, value, count in (("layer", layer, L), ("head", head, H)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not -count <= value < count):
            raise ValueError(f"{name} {str(value)[:40]} is out of range: this model has {count} {name}s")


def explain_analysed(checkpoint: Checkpoint, clip: ClipAnalysis, method: str = "attention", layer: int | None = None,
                     head: int | None = None, query: int | Sequence[int] | None = None,
                     class_index: int | None = None, progress: Progress | None = None) -> ClipExplanation:
    """``explain_clip`` on a clip already through the model (``analyse_clip``): the explorer redraws from it (a
    class's maps are cached in ``clip``); ``progress(blocks run, total)`` while a class's map runs."""
    check_clip_settings(checkpoint, method, layer, head, query, class_index)
    model = checkpoint.model
    L, H = len(model.blocks), model.config.num_heads
    token = query_token(clip.grid, clip.tubelet, query, model.num_prefix_tokens)
    if method in CLASS_CLIP_KINDS:
        return _explanation(checkpoint, clip, method, clip_class_map(checkpoint, clip, method, class_index, layer,
                                                                      token, progress), token)
    if method in CLIP_CAM_KINDS:
        return _explanation(checkpoint, clip, method, clip_cam_map(checkpoint, clip, method, class_index, layer,
                                                                    progress), token)
    layer = -1 if layer is None else layer
    if method == "similarity":
        return _explanation(checkpoint, clip, method, similarity_clip_map(checkpoint, clip, layer, token), token)
    if method == "lens":
        return _explanation(checkpoint, clip, method, lens_clip_map(checkpoint, clip, layer, class_index), token)
    settings = MapSettings(kind=method, layer=layer, end_layer=layer, head=None if head is None else head % H,
                           query=token)
    heads = head_clip_maps(clip, token, layer % L, method) if method in ("attention", "temporal") else None
    return _explanation(checkpoint, clip, method, clip_map(clip, settings), token, heads)


def _explanation(checkpoint: Checkpoint, clip: ClipAnalysis, method: str, drawn: np.ndarray, token: int,
                 heads: np.ndarray | None = None) -> ClipExplanation:
    return ClipExplanation(method, drawn.astype(np.float32), clip.frames,
                           [seen_region(f, checkpoint.preprocessing) for f in clip.frames], clip.grid, token,
                           clip.analysis.prediction if checkpoint.class_names else None, heads)


# A clip through a model opened by the library road (PE video: ``vit.sources.library_road.pe_video``): a timm trunk's
# spatial attention within each frame ("attention") and a temporal encoder's over the CLS and one token a frame
# ("temporal"), and each frame's attention-pooling head ("probe": what its frame vector reads), the libraries' own,
# recorded in one forward and laid on the frames' grids by the model's layout
LIBRARY_CLIP_KINDS = ("attention", "rollout", "temporal", "probe")


def explain_library_clip(checkpoint: Checkpoint, frames: Sequence[Image.Image], method: str = "attention",
                         layer: int | None = None, head: int | None = None,
                         query: int | Sequence[int] | None = None) -> ClipExplanation:
    """The ``method`` map of a clip's frames through a library-road video model (``checkpoint.model.record``:
    PE video): ``attention`` a trunk layer's (default the last) row of ``query`` within each frame (a frame's token
    index, 0 its CLS, the default: its row in every frame; or ``(frame, row, col)``: that patch's row on its own
    frame, the others 0); ``temporal`` a temporal layer's row of ``query`` (0 the CLS, ``1 + f`` frame ``f``) over
    the frames, each frame's weight over its whole grid; ``rollout`` the trunk's attention rolled out within each
    frame from its first layer to ``layer`` (``methods.attention.rollout``: heads averaged, the residual added),
    ``query``'s row laid as attention's; ``probe`` each frame's attention-pooling head over its patches (no layer,
    no query). ``head`` None: the heads' mean; ``heads`` holds each head's map. ValueError (one
    line) for another method or a setting out of range."""
    model = checkpoint.model
    layer, asked, H = check_library_clip_settings(checkpoint, method, layer, head, query, len(frames))
    (gh, gw), prefix, count = model.layout.grid, model.layout.num_prefix_tokens, len(frames)
    temporal = method == "temporal"
    token = asked if isinstance(asked, int) else prefix + asked[1] * gw + asked[2]
    pixels = clip_pixels(frames, checkpoint.preprocessing).to(next(model.parameters()).device)
    if method == "rollout":
        recorded = model.record(pixels, frame_layers=range(layer + 1))
        B, F = pixels.shape[:2]
        rolled = rollout([recorded.spatial[i].flatten(0, 1) for i in range(layer + 1)],
                         num_prefix_tokens=prefix)  # (B*F, T, T)
        drawn = recorded.on_frames(rolled.reshape(B, F, 1, *rolled.shape[1:]), asked)[0]  # (frames, gh, gw)
        heads = None
    elif method == "probe":
        recorded = model.record(pixels, probe=True)
        drawn = recorded.placed_probe(head if head is None else head % H)[0]  # (frames, gh, gw)
        heads = torch.stack([recorded.placed_probe(h)[0] for h in range(H)])
    else:
        recorded = model.record(pixels, layers=[layer] if temporal else (), frame_layers=() if temporal else [layer])
        drawn = recorded.placed(layer, asked, head if head is None else head % H, temporal)[0]  # (frames, gh, gw)
        heads = torch.stack([recorded.placed(layer, asked, h, temporal)[0] for h in range(H)])
    return ClipExplanation(method, drawn.float().cpu().numpy(), list(frames),
                           [seen_region(f, checkpoint.preprocessing) for f in frames], (count, gh, gw), token, None,
                           None if heads is None else heads.float().cpu().numpy())


def check_library_clip_settings(checkpoint: Checkpoint, method: str, layer: int | None, head: int | None,
                                query: int | Sequence[int] | None, count: int | None = None
                                ) -> tuple[int, int | tuple[int, int, int], int]:
    """``explain_library_clip``'s settings checked for a clip of ``count`` frames (default the model's
    ``num_frames``, as a clip is sampled), before any frame is decoded: the layer (default the last, as an index
    from 0), the query (a token, or a frame's patch) and the heads its map reads. ValueError (one line)."""
    model = checkpoint.model
    count = model.num_frames if count is None else count
    if method not in LIBRARY_CLIP_KINDS:
        raise ValueError(f"{MAP_KINDS.get(method, method).split(' (')[0]} is not drawn for this video model opened as "
                         f"its library builds it; choose one of: {', '.join(LIBRARY_CLIP_KINDS)}")
    temporal = method == "temporal"
    L, H = (model.num_layers, model.num_heads) if temporal else (model.num_frame_layers, model.frames.num_heads)
    if method == "probe":
        if layer is not None or query is not None:
            raise ValueError("probe is each frame's attention-pooling head: it reads head alone")
        if model.pool is None:
            raise ValueError("its frames' trunk has no attention-pooling head; choose attention, rollout or temporal")
        H = model.pool.num_heads
    if method == "rollout" and head is not None:
        raise ValueError("rollout averages every head; leave head out")
    for name, value, n in (("layer", layer, L), ("head", head, H)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not -n <= value < n):
            raise ValueError(f"{name} {str(value)[:40]} is out of range: "
                             f"{'its temporal encoder' if temporal else 'its frames trunk'} has {n} {name}s")
    asked = _library_query(query, temporal, count, model.layout.grid, model.layout.num_prefix_tokens)
    return (-1 if layer is None else layer) % L, asked, H


def _library_query(query: int | Sequence[int] | None, temporal: bool, count: int, grid: tuple[int, int],
                   prefix: int) -> int | tuple[int, int, int]:
    """``explain_library_clip``'s query checked: a token index (0 when None; the temporal layers' ``1 + count``
    tokens, or a frame's ``prefix + gh * gw``), or a frame's patch ``(frame, row, col)``. ValueError (one line)."""
    (gh, gw) = grid
    if isinstance(query, (tuple, list)) and not temporal:
        if len(query) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in query) \
                or not (0 <= query[0] < count and 0 <= query[1] < gh and 0 <= query[2] < gw):
            raise ValueError(f"a patch's query is (frame, row, col) within {count} x {gh} x {gw}, got "
                             f"{str(query)[:40]}")
        return int(query[0]), int(query[1]), int(query[2])
    tokens, what = (1 + count, "the CLS, then one a frame") if temporal else (prefix + gh * gw, "a frame's")
    if query is None:
        return 0
    if isinstance(query, bool) or not isinstance(query, int) or not -tokens <= query < tokens:
        raise ValueError(f"query {str(query)[:40]} is not one of the {tokens} tokens ({what}); give a token index"
                         f"{'' if temporal else ' or (frame, row, col)'}")
    return query % tokens
