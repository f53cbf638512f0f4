"""The vision towers inside vision-language models, opened from the VLM's own folder without its language model:
LLaVA 1.5 / NeXT / OneVision (HF ``llava``, ``llava_next``, ``llava_onevision``), PaliGemma and PaliGemma 2
(``paligemma``) and Gemma 3 (``gemma3``), without importing transformers.

The tower opened here ends where the language model reads it (HF ``get_image_features``):

- LLaVA: the tower's hidden state after layer ``vision_feature_layer`` (-2 in LLaVA 1.5 and NeXT, the
  second-to-last layer's output; -1 in OneVision), with no final norm; the ``"default"``
  ``vision_feature_select_strategy`` leaves the first token out (CLIP's CLS), ``"full"`` keeps them all; then
  ``LlavaMultiModalProjector`` (linear, GELU, linear). The tower has the layers up to that one, and no more.
- PaliGemma: the SigLIP tower without its attention-pooling head (``vision_use_head`` false), after its
  ``post_layernorm``; then one linear to the language model's width.
- Gemma 3: the same at 896 px; then ``Gemma3MultiModalProjector``: a 4 x 4 average pool over the 64 x 64 grid
  (256 tokens), Gemma's RMSNorm and a bias-free linear.

The projector is ``ViT.project`` (``vit.model.blocks.Projector``), and ``ViT.encode``'s embedding the mean of the
patch tokens it reads. Only the tensors these need are read (``wanted``): the tower's embeddings, its layers up to
the one read, the norms it uses and the projector, so a 7B model's language model is never loaded (from a sharded
folder, or from the Hub, only the shards that hold them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch

from vit.model import ViTConfig
from vit.sources.ports.families import import_clip, import_siglip
from vit.sources.ports.families.import_dinov3 import _Taker, activation

# model_type -> the architectures whose tower opens (the bare ...Model has the same tower and projector keys)
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "llava": ("LlavaForConditionalGeneration", "LlavaModel"),
    "llava_next": ("LlavaNextForConditionalGeneration", "LlavaNextModel"),
    "llava_next_video": ("LlavaNextVideoForConditionalGeneration", "LlavaNextVideoModel"),
    "llava_onevision": ("LlavaOnevisionForConditionalGeneration", "LlavaOnevisionModel"),
    "paligemma": ("PaliGemmaForConditionalGeneration", "PaliGemmaModel"),
    "gemma3": ("Gemma3ForConditionalGeneration", "Gemma3Model"),
}
NAMES = {"llava": "LLaVA", "llava_next": "LLaVA-NeXT", "llava_next_video": "LLaVA-NeXT-Video",
         "llava_onevision": "LLaVA-OneVision",
         "paligemma": "PaliGemma", "gemma3": "Gemma 3"}
# transformers' defaults where a config.json leaves them out: (vision_feature_layer, vision_feature_select_strategy)
FEATURE_DEFAULTS = {"llava": (-2, "default"), "llava_next": (-2, "default"), "llava_next_video": (-2, "default"),
                    "llava_onevision": (-1, "full")}
TOWERS = {"clip_vision_model": "CLIP", "siglip_vision_model": "SigLIP"}
# Where the tower and projector live: the Hub's layout (transformers 4, and what transformers 5 saves) and
# transformers 5's in memory; the CLIP / SigLIP tower's own "vision_model." in the older one. Longest first.
TOWER_PREFIXES = ("model.vision_tower.vision_model.", "model.vision_tower.", "vision_tower.vision_model.",
                  "vision_tower.")
PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")
OPENAI_MEAN, OPENAI_STD = import_clip.OPENAI_MEAN, import_clip.OPENAI_STD


@dataclass(frozen=True)
class Reading:
    """What a VLM's language model reads of its tower, from its config.json."""

    vision: dict  # the tower's config (vision_config)
    depth: int  # the layers the tower runs
    final_norm: bool  # its post_layernorm on the tokens read
    skip: int  # leading tokens the projector leaves out
    projector: str  # ViTConfig.projector; "none" when the projector is left out
    note: str  # one sentence: what the tower opened here is


def _feature_layers(value, total: int) -> list[int]:
    """``vision_feature_layer`` (an index into ``hidden_states``: 0 the embeddings, -1 the last layer's output) ->
    how many layers run to each, in order."""
    layers = value if isinstance(value, list) else [value]
    if not layers or not all(isinstance(v, int) and not isinstance(v, bool) for v in layers):
        raise ValueError(f"vision_feature_layer must be a layer index or a list of them, got {str(value)[:40]}")
    depths = [v if v >= 0 else total + 1 + v for v in layers]
    if not all(1 <= d <= total for d in depths):
        raise ValueError(f"vision_feature_layer {str(value)[:40]} reads no layer of a {total}-layer tower")
    return depths


def reading(config_json: Mapping) -> Reading:
    """What the language model of the VLM ``config_json`` (a ``config.json`` of ``ARCHITECTURES``' model types)
    reads of its tower. ValueError (one line) for what this program cannot open."""
    model_type = str(config_json.get("model_type"))
    vision = config_json.get("vision_config")
    if not isinstance(vision, Mapping) or vision.get("model_type") not in TOWERS:
        kind = vision.get("model_type") if isinstance(vision, Mapping) else None
        raise ValueError(f"{NAMES.get(model_type, model_type)}'s vision tower {str(kind)[:40]!r} is not supported; "
                         f"supported: {', '.join(TOWERS)}")
    vision = dict(vision)
    tower = TOWERS[vision["model_type"]]
    total = vision.get("num_hidden_layers", 12)
    if isinstance(total, bool) or not isinstance(total, int) or not 0 < total <= 256:
        raise ValueError(f"vision_config.num_hidden_layers must be a whole number from 1 to 256, got "
                         f"{str(total)[:40]}")
    name = NAMES[model_type]
    if model_type not in FEATURE_DEFAULTS:  # PaliGemma, Gemma 3: the last hidden state, after post_layernorm
        projector = "gemma3" if model_type == "gemma3" else "linear"
        how = ("then Gemma3MultiModalProjector (an average pool, RMSNorm, a linear)" if projector == "gemma3"
               else "then one linear")
        return Reading(vision, total, True, 0, projector,
                       f"{name} reads this {tower} tower's last layer after its final norm, without its "
                       f"attention-pooling head; {how}, the tower's ViT.project.")
    layer, strategy = FEATURE_DEFAULTS[model_type]
    layer = config_json.get("vision_feature_layer", layer)
    strategy = config_json.get("vision_feature_select_strategy", strategy)
    if strategy not in ("default", "full"):
        raise ValueError(f"vision_feature_select_strategy {str(strategy)[:40]!r} is not supported; supported: "
                         "default, full")
    depths = _feature_layers(layer, total)
    skip = 1 if strategy == "default" else 0
    dropped = "its first token (the CLS)" if skip and tower == "CLIP" else "its first token" if skip else "no token"
    kept = (f"its first {depths[0]} layers (of {total}; vision_feature_layer {layer})" if depths[0] < total
            else f"all {total} layers (vision_feature_layer {layer})")
    if len(depths) > 1:
        return Reading(vision, max(depths), False, skip, "none",
                       f"{name} reads layers {layer} of this {tower} tower concatenated; the tower opened here has "
                       f"its first {max(depths)} layers (of {total}), and the projector is left out.")
    return Reading(vision, depths[0], False, skip, "mlp",
                   f"{name} reads this {tower} tower after {kept}, without a final norm, leaving out {dropped} "
                   f"(strategy {strategy!r}); the tower opened here ends there, and its projector (linear, "
                   "activation, linear) is ViT.project.")


def _tower_key(key: str) -> str | None:
    """A tower tensor's name inside the tower (``encoder.layers.3.mlp.fc1.weight``), None for another tensor."""
    return next((key[len(p):] for p in TOWER_PREFIXES if key.startswith(p)), None)


def wanted(config_json: Mapping) -> Callable[[str], bool]:
    """Which of the VLM's tensors opening its tower reads: the embeddings, CLIP's pre-norm, the layers up to the one
    read, the final norm where it is read, and the projector; never the language model or the pooling head."""
    read = reading(config_json)
    layers = tuple(f"encoder.layers.{i}." for i in range(read.depth))
    tower = ("embeddings.", "pre_layrnorm.", *layers, *(("post_layernorm.",) if read.final_norm else ()))
    projector = PROJECTOR_PREFIXES if read.projector != "none" else ()

    def wants(key: str) -> bool:
        inner = _tower_key(key)
        return inner.startswith(tower) if inner is not None else key.startswith(projector)

    return wants


def _projector_prefix(state: Mapping[str, torch.Tensor]) -> str:
    for prefix in PROJECTOR_PREFIXES:
        if any(k.startswith(prefix) for k in state):
            return prefix
    raise ValueError("the VLM's weights hold no multi_modal_projector")


def config_from_hf(config_json: Mapping, state: Mapping[str, torch.Tensor]) -> ViTConfig:
    """Our config for the tower of the VLM ``config_json``, the projector's width from its weights in ``state``
    (``wanted``'s tensors; meta tensors will do): a config.json leaves the language model's width out where it is
    transformers' default for that model."""
    read = reading(config_json)
    vision = read.vision
    if vision["model_type"] == "clip_vision_model":
        tower = import_clip.config_from_hf(vision)
    else:
        tower = import_siglip.config_from_hf({**vision, "vision_use_head": True})  # its head is never read here
    # the tokens the language model leaves out, with or without the projector (a list of layers leaves it out)
    projector: dict = dict(projector_skip=read.skip)
    if read.projector != "none":
        prefix = _projector_prefix(state)
        first = {"mlp": "linear_1.weight", "linear": "linear.weight",
                 "gemma3": "mm_input_projection_weight"}[read.projector]
        weight = state.get(prefix + first)
        if weight is None or weight.dim() != 2:
            raise ValueError(f"the VLM's weights lack a two-dimensional {prefix + first}")
        width = weight.shape[1] if read.projector == "gemma3" else weight.shape[0]
        projector.update(projector=read.projector, projector_dim=int(width))
        if read.projector == "mlp":
            projector.update(projector_bias=prefix + "linear_1.bias" in state,
                             projector_activation=activation(config_json.get("projector_hidden_act", "gelu")))
        if read.projector == "gemma3":
            side = tower.grid_size[0]
            per_side = int(config_json.get("mm_tokens_per_image", 256) ** 0.5)
            if not 0 < per_side <= side:
                raise ValueError(f"mm_tokens_per_image {config_json.get('mm_tokens_per_image')} does not fit a "
                                 f"{side}x{side} patch grid")
            projector["projector_pool"] = side // per_side  # Gemma3MultiModalProjector's kernel_size
    return replace(tower, num_layers=read.depth, final_norm=read.final_norm, pooling="avg", projection_dim=0,
                   **projector)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from ``wanted``'s tensors of a VLM: the tower through the CLIP or SigLIP mapping, the
    projector's by name; a tensor with no place is an error."""
    tower = {inner: v for k, v in state.items() if (inner := _tower_key(k)) is not None}
    if config.pre_norm:  # CLIP's ln_pre: the one tower of the two that has it
        ours = import_clip.state_dict_from_hf(tower, config)
    else:
        ours = import_siglip.state_dict_from_hf(tower, config)
    rest = {k: v for k, v in state.items() if _tower_key(k) is None}
    if config.projector == "none":
        if rest:
            raise ValueError(f"the VLM's weights hold {len(rest)} tensor(s) this tower has no place for: "
                             f"{', '.join(sorted(rest)[:3])}")
        return ours
    prefix = _projector_prefix(rest)
    take = _Taker({k[len(prefix):]: v for k, v in rest.items() if k.startswith(prefix)}, "the VLM's projector")
    if len(take.state) != len(rest):
        raise ValueError(f"the VLM's weights hold tensors outside {prefix} this tower has no place for")
    if config.projector == "gemma3":
        ours["projector.fc1.weight"] = take("mm_input_projection_weight").t()  # Gemma 3 computes x @ weight
        ours["projector.norm.weight"] = 1 + take("mm_soft_emb_norm.weight")  # Gemma's RMSNorm scales by 1 + weight
    else:
        names = (("fc1", "linear_1"), ("fc2", "linear_2")) if config.projector == "mlp" else (("fc1", "linear"),)
        for mine, theirs in names:
            ours[f"projector.{mine}.weight"] = take(f"{theirs}.weight")
            if config.projector == "linear" or config.projector_bias:
                ours[f"projector.{mine}.bias"] = take(f"{theirs}.bias")
    take.check_all_used()
    return ours


def tower_architecture(config_json: Mapping) -> str:
    """The HF architecture of the tower alone (``CLIPVisionModel``, ``SiglipVisionModel``): whose image processor
    defaults a folder without one gets."""
    vision = config_json.get("vision_config")
    return "SiglipVisionModel" if isinstance(vision, Mapping) and vision.get("model_type") == "siglip_vision_model" \
        else "CLIPVisionModel"


def image_processor(processor: Mapping | None, config_json: Mapping) -> tuple[Mapping | None, str | None]:
    """The image processor settings for the one image the tower is shown, and a sentence on what is not shown, from
    the VLM's own processor settings. LLaVA-NeXT and OneVision split an image into tiles at one of
    ``image_grid_pinpoints`` and add a base view, the whole image resized to a square and, where the processor
    crops, its centre cropped as every tile is (``LlavaNextImageProcessor._preprocess``): that view is the one
    shown. ValueError for settings this program does not reproduce."""
    if processor is None:
        return None, None
    model_type = str(config_json.get("model_type"))
    if model_type in ("llava_next", "llava_next_video", "llava_onevision"):
        onevision = model_type == "llava_onevision"
        size = processor.get("size") or ({"height": 384, "width": 384} if onevision else {"shortest_edge": 224})
        size = size if isinstance(size, Mapping) else {}
        # the base view's square: LlavaNextImageProcessor's (height, width) when both are set, else shortest_edge
        # twice; its second resize (to size again) leaves that square as it is
        side = size.get("height") if size.get("height") and size.get("height") == size.get("width") \
            else size.get("shortest_edge")
        if isinstance(side, bool) or not isinstance(side, int) or side <= 0:
            raise ValueError(f"the image processor's size {str(size)[:60]} names no square tile")
        # then the centre crop_size, as for every tile (OneVision's processor does not crop unless asked)
        crop = None
        if processor.get("do_center_crop", not onevision):
            crop_size = processor.get("crop_size") or ({} if onevision else {"height": 224, "width": 224})
            crop = crop_size.get("height") if isinstance(crop_size, Mapping) else None
            if isinstance(crop, bool) or not isinstance(crop, int) or crop_size.get("width") != crop \
                    or not 0 < crop <= side:
                raise ValueError(f"the image processor's crop_size {str(crop_size)[:60]} names no square crop "
                                 f"within its {side}x{side} base view")
        crops = crop is not None and crop < side  # a crop of the whole square crops nothing
        tile = {"size": {"height": side, "width": side}, "do_resize": True, "do_center_crop": crops,
                "crop_size": {"height": crop, "width": crop}, "resample": processor.get("resample", 3),
                "do_normalize": processor.get("do_normalize", True),
                "image_mean": processor.get("image_mean", OPENAI_MEAN),
                "image_std": processor.get("image_std", OPENAI_STD)}
        cropped = f", then its centre {crop}x{crop}" if crops else ""
        return tile, (f"{NAMES[model_type]} shows the model the image as tiles (anyres): here the base tile alone, "
                      f"the whole image resized to {side}x{side}{cropped}, not the high-resolution tiles.")
    if model_type == "llava" and processor.get("do_pad"):
        raise ValueError("its image processor pads each image to a square before resizing (LlavaImageProcessor "
                         "do_pad), which this program does not reproduce; set do_pad to false in its "
                         "preprocessor_config.json to open it with the centre crop")
    if model_type == "gemma3" and processor.get("do_pan_and_scan"):
        return processor, ("Gemma 3 pans and scans this image into crops as well (do_pan_and_scan): here the whole "
                           "image alone, its first view.")
    return processor, None
