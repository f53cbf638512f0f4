"""The captions of the maps: what a drawn map means, for its settings and the analysis it was drawn from, as
Markdown (class names escaped: they are data). The explorer's main map and ``vit.explain``'s ``Explanation`` both
read them, so a map says the same in a notebook as on the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vit.core.text import escape_markdown
from vit.explain.methods.captum_maps import ATTRIBUTION_METHODS, Options
from vit.explain.methods.captum_maps import caption as attribution_caption
from vit.explain.views.attention_maps import METHOD_MAP_KINDS, MapSettings, is_method_map, method_of, resolved_class
from vit.explain.views.image_analysis import Analysis


def token_label(token: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
                prefix_names: Sequence[str] = ()) -> str:
    """'CLS' for token 0, 'DIST' / 'REG 2' for other prefix tokens named in ``prefix_names``
    (``ViTConfig.prefix_token_names``), 'patch row 2, col 3' (counted from 1, top left) for a patch token."""
    if token < 0 or token >= num_prefix_tokens + grid[0] * grid[1]:
        raise ValueError(f"token {token} is out of range for a {grid[0]}x{grid[1]} grid")
    if token < num_prefix_tokens:
        if token < len(prefix_names):
            return prefix_names[token]
        return "CLS" if token == 0 else f"prefix token {token}"
    row, col = divmod(token - num_prefix_tokens, grid[1])
    return f"patch row {row + 1}, col {col + 1}"


# What a mean-pooling model's rollout and class map start from when no query is given (MapSettings.readout)
READOUT = "the mean of the patch tokens (what the classifier reads: this model has no CLS token)"


def _query_phrase(query: int, analysis: Analysis) -> str:
    """'the CLS token', 'the REG 1 token' or 'the query patch row 2, col 3 (outlined)', for the captions."""
    if query == 0 and analysis.has_cls:
        return "the CLS token"
    label = token_label(query, analysis.grid, analysis.num_prefix_tokens, analysis.prefix_names)
    return f"the {label} token" if query < analysis.num_prefix_tokens else f"the query {label} (outlined)"


def describe_map(settings: MapSettings, analysis: Analysis, class_names: list[str],
                 options: Mapping[str, object] | None = None, pixels: bool = False) -> str:
    """A caption that says what the drawn map means; ``options``: an attribution's (``captum_maps.Options``), which
    its caption names (default: captum's and the RISE authors'); ``pixels``: a pixel method's map on the input's
    pixels, not summed per patch."""
    s, L, H = settings, analysis.num_layers, analysis.num_heads
    who = READOUT if s.readout else _query_phrase(s.query, analysis)
    if analysis.staged and s.kind in ("attention", "rollout"):
        return _describe_stage_map(s, analysis)
    if analysis.staged and s.kind == "class":
        name = escape_markdown(class_names[resolved_class(s, analysis)])
        end = s.end_layer % L
        return (f"**Relevance for “{name}”** through layers 1–{end + 1}: each layer's attention weighted by its "
                f"gradient for the “{name}” score, positive parts only, rolled out (Chefer et al., 2021) from what "
                f"the average pooling reads, through each {_downsampling(analysis)} as the 2×2 tokens it is built "
                "from.")
    if s.kind == "attention":
        layer = s.layer % L
        heads = f"head {s.head + 1}" if s.head is not None else f"the {s.fusion} over its {H} heads"
        keys = "the CLS key" if analysis.has_cls else "the prefix keys" if analysis.num_prefix_tokens else "no key"
        text = (f"**Layer {layer + 1} of {L}, {heads}**: how much {who} attends to each patch in this layer "
                f"(one row of the attention matrix, {keys} left out){_window_phrase(s.query, layer, analysis)}.")
        if s.query == 0 and layer == L - 1 and analysis.has_cls:
            if class_names:
                text += " The classifier reads the CLS token after this layer, so bright patches fed the prediction."
            else:  # a feature model (DINO): no classifier to feed
                text += " The CLS token after this layer is the model's image embedding, so bright patches shaped it."
        return text
    if s.kind == "norms":
        layer = s.layer % L
        return (f"**Token norms after layer {layer + 1} of {L}**: the length of each patch token's output vector. "
                "A few patches far brighter than the rest are the high-norm \"artifact\" tokens of Darcet et al. "
                "(2023), which register tokens remove.")
    if is_method_map(s.kind):
        return describe_method_map(settings, analysis, class_names, options, pixels)
    if s.kind == "probe":
        heads = f"head {s.head + 1}" if s.head is not None else f"the {s.fusion} over its {H} heads"
        return (f"**Attention-pooling probe, {heads}**: this model has no CLS token; its embedding is what a learned "
                "probe reads from the last layer's tokens (SigLIP's MAP head). Bright patches are those the probe "
                "attends to: the map the CLS row gives for other models.")
    end = s.end_layer % L
    if s.kind == "probe_rollout":
        dropped = f", the lowest {s.discard_ratio:.0%} of each row dropped" if s.discard_ratio > 0 else ""
        return (f"**Attention rollout through layers 1–{end + 1}, ending with the pooling probe** (heads fused by "
                f"{s.fusion}{dropped}): how much of the pooled embedding flows from each input patch, following the "
                "probe's attention, then attention and the residual connections down the layers (Abnar & Zuidema, "
                "2020). This model has no CLS token; the probe is what its embedding reads.")
    if s.kind == "rollout":
        dropped = f", the lowest {s.discard_ratio:.0%} of each row dropped" if s.discard_ratio > 0 else ""
        of = who if s.readout else f"{who}'s representation"
        return (f"**Attention rollout through layers 1–{end + 1}** (heads fused by {s.fusion}{dropped}): "
                f"how much of {of} after layer {end + 1} flows from each input patch, "
                "following attention and the residual connections (Abnar & Zuidema, 2020).")
    name = escape_markdown(class_names[resolved_class(s, analysis)])  # the caption is Markdown; names are data
    which = "the predicted class" if s.class_index is None else "the chosen class"
    return (f"**Relevance for “{name}”** ({which}) through layers 1–{end + 1}: attention weighted by its gradient "
            f"for the “{name}” score, positive parts only, rolled out (Chefer et al., 2021). Bright patches "
            f"are evidence for “{name}” as read by {who}.")


def _window_phrase(query: int, layer: int, analysis: Analysis) -> str:
    """SAM's / ViTDet's ', in its 14×14 window: rows 15–28, cols 1–14 of the grid (zero outside it)' for a patch
    query in a windowed layer, ', over the whole grid (one of its global layers; …)' in a global one, else ''."""
    if not analysis.window or query < analysis.num_prefix_tokens:
        return ""
    w = analysis.window
    if not analysis.windowed(layer):
        return f", over the whole grid (one of its global layers; the others attend within {w}×{w} windows)"
    (gh, gw), (row, col) = analysis.grid, divmod(query - analysis.num_prefix_tokens, analysis.grid[1])
    r0, c0 = row // w * w, col // w * w  # windows tile the grid from its top left (window_partition)
    r1, c1 = min(r0 + w, gh), min(c0 + w, gw)
    cut = " cut by the grid's edge," if (r1 - r0, c1 - c0) != (w, w) else ""
    rows = f"rows {r0 + 1}–{r1}" if r1 - r0 > 1 else f"row {r1}"
    cols = f"cols {c0 + 1}–{c1}" if c1 - c0 > 1 else f"col {c1}"
    return f", in its {w}×{w} window:{cut} {rows}, {cols} of the grid (zero outside it: this layer attends in windows)"


def _describe_stage_map(settings: MapSettings, analysis: Analysis) -> str:
    """``describe_map`` for a model with stages (Swin, Hiera): the layer's own grid, its windows, the covering token."""
    from vit.model.stages import covering_token

    s, L = settings, analysis.num_layers
    layer = (s.layer if s.kind == "attention" else s.end_layer) % L
    lay = analysis.layouts[layer]
    (lh, lw), cell = lay.grid, -(-analysis.grid[0] // lay.grid[0])
    row, col = divmod(covering_token(s.query, analysis.grid, lay.grid), lw)
    who = (f"the token at row {row + 1}, col {col + 1} of layer {layer + 1}'s {lh}×{lw} grid"
           + (f" (each cell {cell}×{cell} patches), the one covering the clicked patch" if cell > 1 else ""))
    if s.kind == "rollout":
        return (f"**Attention rollout through layers 1–{layer + 1}** (heads fused by {s.fusion}), through each "
                f"{_downsampling(analysis)} as the 2×2 tokens it is built from: how much of {who} flows from each "
                "input patch (Abnar & Zuidema, 2020).")
    heads = f"head {s.head + 1}" if s.head is not None else f"the {s.fusion} over its {analysis.heads_in(layer)} heads"
    (wh, ww), (sh, sw) = lay.window_hw, lay.shift_hw  # timm's Swin: non-square where the grid is narrow
    shift = f", shifted by {sh}" if sh == sw else f", shifted by {sh} rows and {sw} columns"
    where = (f"in its {wh}×{ww} window" + (shift if lay.shift else "") + " (zero outside it)") if lay.window \
        else "over the whole grid"
    if lay.stride > 1:  # Hiera's / SAM 2's pooled queries read the previous stage's grid
        kh, kw = lay.key_grid
        where = (f"of the previous stage's {kh}×{kw} grid, which this layer pools its queries from"
                 + (f", in its {wh * lay.stride}×{ww * lay.stride} window (zero outside it)" if lay.window else ""))
    return f"**Layer {layer + 1} of {L}, {heads}**: how much {who} attends to each token {where}."


def _downsampling(analysis) -> str:
    """What opens a later stage: Swin's patch merging or Hiera's query pooling."""
    return "query pooling" if any(lay.stride > 1 for lay in analysis.layouts) else "patch merging"


CAM_CAPTIONS = {  # how each CAM weighs the channels (pytorch-grad-cam's get_cam_weights / get_cam_image)
    "gradcam": ("Grad-CAM", "the channels weighted by their mean gradient of the class score (Selvaraju et al., 2017)"),
    "gradcam++": ("Grad-CAM++", "the channels weighted by their positive gradients times Grad-CAM++'s coefficients "
                 "(Chattopadhay et al., 2018)"),
    "xgradcam": ("XGrad-CAM", "the channels weighted by their activation-weighted gradients (Fu et al., 2020)"),
    "layercam": ("LayerCAM", "each token's channels weighted by their own positive gradient (Jiang et al., 2021)"),
    "scorecam": ("Score-CAM", "the channels weighted by the softmax of the class score of the image masked by each "
                "(Wang et al., 2020)"),
}


def describe_method_map(settings: MapSettings, analysis: Analysis, class_names: list[str],
                        options: Mapping[str, object] | None = None, pixels: bool = False) -> str:
    """The caption of a ``METHOD_MAP_KINDS`` map or a plugin's (``pixels``: a pixel method's on the input's pixels)."""
    s = settings
    who = _query_phrase(s.query, analysis)
    if s.kind not in METHOD_MAP_KINDS:  # a plugin's: its title and what it applies to, in its own words
        method = method_of(s.kind)
        explained = (f" for “{escape_markdown(class_names[resolved_class(s, analysis)])}”"
                     if method.class_specific else "")
        return (f"**{escape_markdown(method.title)}**{explained}, from the plugin {escape_markdown(method.plugin)}: "
                f"{escape_markdown(method.applies_to)}.")
    if s.kind == "eigencam":
        return (f"**EigenCAM**: block {s.end_layer % analysis.num_layers + 1}'s first-norm tokens projected on their "
                "first principal component, ReLU (Muhammad & Yeasin, 2020; pytorch-grad-cam's definition). It "
                "explains no class.")
    if s.kind == "flow":
        return (f"**Attention flow through layers 1–{s.end_layer % analysis.num_layers + 1}** (heads fused by "
                f"{s.fusion}): the maximum flow from {who} down to each input patch, when every layer's attention "
                "plus the residual is a capacity (Abnar & Zuidema, 2020). Unlike rollout, a path counts only "
                "as much as its narrowest layer.")
    name = escape_markdown(class_names[resolved_class(s, analysis)])  # the caption is Markdown; names are data
    which = "the predicted class" if s.class_index is None else "the chosen class"
    L = analysis.num_layers
    first = s.start_layer % L + 1
    where = ("at the last layer" if first == L else "at each of the last two layers" if first == L - 1
             else f"at each of layers {first}–{L}")
    if s.kind == "legrad" and analysis.staged:
        return (f"**LeGrad for “{name}”** ({which}): {where}, the gradient of the "
                f"“{name}” score (the model's norm, average pooling and classifier applied to that layer's tokens) "
                "with respect to that layer's attention in its windows, positive parts averaged over heads and "
                "queries, placed un-shifted on the layer's grid, upsampled to the patches and summed (Bousselham "
                "et al., 2024).")
    if s.kind == "legrad":
        return (f"**LeGrad for “{name}”** ({which}): {where}, the gradient of the "
                f"“{name}” score read at that layer with respect to that layer's attention, positive parts "
                "averaged over heads and queries, summed (Bousselham et al., 2024).")
    # captum's and RISE (vit.explain.methods.captum_maps), with the options it ran with
    if s.kind in ATTRIBUTION_METHODS:
        title, how = attribution_caption(s.kind, Options.of(s.kind, options), pixels)
        return f"**{title} for “{name}”** ({which}): {how}."
    if s.kind in CAM_CAPTIONS:
        layer = s.end_layer % L + 1
        title, how = CAM_CAPTIONS[s.kind]
        return (f"**{title} for “{name}”** ({which}): {how} of block "
                f"{layer}'s first-norm tokens on its grid, ReLU (pytorch-grad-cam's definition; its ViT tutorial "
                "reads the last block's).")
    if s.kind == "attn-gradcam":
        return (f"**GradCAM on the last attention for “{name}”** ({which}): the last layer's attention from CLS to "
                "the patches, each head weighted by its mean gradient of the class score there, averaged over heads, "
                "ReLU (Chefer, Gur & Wolf, 2021's baseline).")
    if s.kind == "lrp-partial":
        return (f"**Partial LRP for “{name}”** ({which}): the LRP relevance of the last layer's attention, positive "
                "parts averaged over heads, CLS's row (Voita et al., 2019; Chefer, Gur & Wolf, 2021's baseline).")
    if s.kind == "lrp-full":
        return (f"**Full LRP for “{name}”** ({which}): relevance propagated to the pixels by plain LRP rules, summed "
                f"per patch (Chefer, Gur & Wolf, 2021's baseline). Red patches are evidence for “{name}”, blue ones "
                "against it.")
    if s.kind == "lrp":
        return (f"**LRP transformer attribution for “{name}”** ({which}): each layer's attention relevance "
                f"(layer-wise relevance propagation) times its gradient, positive parts, rolled out, read by {who} "
                "(Chefer, Gur & Wolf, 2021).")
    return (f"**AttnLRP for “{name}”** ({which}): relevance propagated back to the pixels, summed per patch "
            f"(Achtibat et al., 2024). Red patches are evidence for “{name}”, blue ones against it; white is "
            "neutral.")
