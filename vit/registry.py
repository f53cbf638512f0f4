"""One list of what exists: every map method and every model family, each registered once, low in the house.

The explorer's pickers, ``vit.methods()`` and ``vit.explain``'s refusals, the CLI's ``--methods``, the loader's
model_type dispatch and the docs' tables read these lists (``methods()``, ``families()``, ``table()``); the old
names (``attention_maps.MAP_KINDS``, ``MAP_CONTROLS``, ``CAM_KINDS``, ...) are derived from them.

Packages outside this repository add to them through Python entry points: group ``vit.methods`` (a ``Method`` with
a ``draw`` callable) and group ``vit.families`` (a ``Family`` with an ``open`` callable and its config.json
model_types). Each entry point names a ``Method`` or ``Family`` object, or a function of no arguments returning a
list of them::

    [vit.methods]
    mymap = my_package.maps:METHOD

They are read once, on first use (never at ``import vit``); a plugin that fails to load or is malformed is skipped
with one line on stderr naming it (``skipped_plugins()`` keeps those lines).

This module imports nothing from ``vit`` and no torch: an importer is a module path, imported only when used.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from types import ModuleType

# The groups of methods, in the docs' order: how the code groups them (attention_maps.CAM_KINDS, CHEFER_BASELINES,
# PROBE_MAP_KINDS; the maps of typed labels that vit.ask draws).
GROUPS = ("attention", "gradient", "relevance", "cam", "model-agnostic", "chefer baseline", "probe", "words")
# What a map may read: the explorer's controls (attention_maps.MapSettings), and for a typed-label map its label.
CONTROLS = ("query", "layer", "end_layer", "start_layer", "head", "fusion", "discard_ratio", "class", "label")
# What a plugin's draw is given (see Method.draw): the class, the last layer it explains (or reads), the query token
PLUGIN_READS = ("class", "end_layer", "query")
FAMILY_KINDS = ("image", "windowed / hierarchical", "vlm tower", "video")
METHOD_GROUP, FAMILY_GROUP = "vit.methods", "vit.families"  # the entry-point groups
NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,39}")  # a method's key: a share link's map=, a CLI word


@dataclass(frozen=True)
class Method:
    """One map method. ``name`` is its key everywhere (``vit.explain(..., name)``, a share link's ``map=``, the
    CLI's ``--methods``); ``title`` the explorer's label; ``reads`` the controls it reads (``CONTROLS``), which the
    page shows and ``vit.explain`` accepts; ``applies_to`` in words, quoted by refusals; ``group`` one of ``GROUPS``;
    ``own_pass``: drawn by ``vit.explain.views.method_maps.model_method_map`` in a pass of its own (the explorer's
    "More" picker) rather than from the analysis' forward; ``module`` where it is computed; ``paper`` and ``code`` its
    reference (the paper, and the authors' code it is held equal to by ``test``, a ``tests/FILE.py::FUNCTION``);
    ``cost`` the ``vit.costs.plan`` entry asked before the work; ``question``, ``runs`` and ``tolerance`` what the docs'
    "Which map should I use?" page says of it.

    A plugin's method has ``draw(model, x, target, layer, query)``: ``model`` the ``vit.model.ViT`` in eval mode,
    ``x`` the preprocessed image ``(1, C, H, W)`` on the model's device, ``target`` the explained class index (None
    unless ``class_specific``), ``layer`` the last layer it explains or reads (from 0; the page's layer slider,
    ``vit.explain``'s ``layer``, default the last), ``query`` the query token (0 is CLS); it returns the
    ``(grid_h, grid_w)`` map of the patches (a tensor or an array; ``(1, gh, gw)`` is taken too). It raises
    ValueError with a one-line message for a model it does not apply to. Its ``reads`` are among ``PLUGIN_READS``;
    ``cost`` is ``"forward"`` (default) or ``"gradient"`` (default for a class-specific one)."""

    name: str
    title: str
    reads: tuple[str, ...]
    applies_to: str
    group: str
    class_specific: bool = False
    signed: bool = False  # negative values are evidence against the class: drawn on a diverging scale around 0
    pixels: bool = False  # vit.explain's map is on the model's input pixels (H, W), not the patch grid
    own_pass: bool = False
    module: str = ""
    paper: str = ""
    code: str = ""
    test: str = ""
    cost: str | None = None
    question: str = ""  # the question its map answers, for the docs' "Which map should I use?"
    runs: str = ""  # what one map costs, in passes of the model (a plugin's: said from its cost)
    tolerance: str = ""  # how close ``test`` holds it to its reference (the test's own rtol and atol)
    draw: Callable | None = field(default=None, compare=False, repr=False)
    plugin: str | None = None  # the distribution that registered it; None for the built-ins

    @property
    def reference(self) -> str:
        """The paper, then the code it equals."""
        return "; ".join(filter(None, (self.paper, self.code)))


@dataclass(frozen=True)
class Family:
    """One model family. ``kind`` one of ``FAMILY_KINDS``; ``opens_from`` in words (HF model_types, timm names,
    files); ``importer`` the module that reads it (a path, imported by ``load_importer``); ``hf_model_types`` the
    config.json model_types it opens; ``maps`` which maps it draws and which it refuses, in one line; ``road``
    how it runs: ``"port"`` (its weights in our ``ViT``) or ``"library"`` (the library's own modules, its attention
    recorded: ``vit.load`` alone so far, ``Checkpoint.road``).

    A plugin's family has ``open(folder, config_json, map_location) -> vit.checkpoint.Checkpoint`` for an HF-style
    folder whose config.json has one of its ``hf_model_types``. Opening runs it twice, as every family's: first with
    ``map_location="meta"`` (check the config and every weight's name and shape from the files' headers: no data),
    then on the device. It raises ``vit.checkpoint.CheckpointError`` (``vit.sources.files.SourceError``) with a
    one-line message for what it cannot open; ``vit.sources.open.read_hf_weights`` and ``build_model`` do the
    reading and the checking."""

    name: str
    title: str
    kind: str
    opens_from: str
    importer: str
    hf_model_types: tuple[str, ...] = ()
    maps: str = ""
    open: Callable | None = field(default=None, compare=False, repr=False)
    plugin: str | None = None
    road: str = "port"

    def load_importer(self) -> ModuleType:
        """The importer module, imported now."""
        return importlib.import_module(self.importer)


_LIBRARY_MAPS = ("attention (any layer, head, query) and rollout; for classifiers the class map (gradient rollout), "
                 "LeGrad, the CAMs, captum's attributions and RISE; AttnLRP for transformers classifiers; PCA and "
                 "similarity of the last hidden states; the other maps (flow, norms, Chefer's LRP, the probe) "
                 "refused in one line (issue 91); the explorer draws them too; vit-predict and vit-evaluate "
                 "classify with them, the other commands read ports only for now")
_CAM_READS = ("class", "end_layer")
_CAM_APPLIES = "classifiers, every family (pytorch-grad-cam's, on the last block's norm1 tokens)"
_CAM_TEST = "tests/test_cam.py::test_cam_of_the_last_blocks_norm1_equals_pytorch_grad_cam"
_CHEFER_CODE = "Transformer-Explainability's ViT_explanation_generator.py / ViT_orig_LRP.py (Chefer et al.)"
_DENSE_APPLIES = "a CLIP (every token through its projection)"
_AGNOSTIC_APPLIES = "classifiers of one patch grid (the model's logits; models with stages refused)"
_CAPTUM_TEST = "tests/test_captum_methods.py::test_each_captum_method_equals_captums_own_call_on"
# a pixel method's map on the input's pixels (Method.pixels), equal to captum's attribution summed over the channels
_CAPTUM_PIXELS_TEST = ("tests/test_captum_methods.py::"
                       "test_a_pixel_methods_map_is_captums_attribution_summed_over_the_channels_on_the_input_pixels")
# What the docs' "Which map should I use?" says of several methods (Method.runs, Method.tolerance)
_FORWARD = "none of its own: the analysis' forward"
_BACKWARD = "a forward and a backward"
_LRP_PASS = "a forward and a relevance pass back"
_CAM_TOL = "rtol 0, atol 1e-5"
_CAPTUM_TOL = "rtol 1e-3, atol 1e-5 × the map's largest value"
_DENSE_QUESTION = "Which patches match a typed label, patch by patch (training-free segmentation)?"
_DENSE_RUNS = "one forward, its last block changed"

# The built-in methods, in the explorer's order (its map picker's, vit.methods()'s).
BUILTIN_METHODS: tuple[Method, ...] = (
    Method("attention", "Attention of one layer", ("query", "layer", "head", "fusion"), "every model", "attention",
           module="vit.explain.views.attention_maps",
           paper="Dosovitskiy et al. 2021; DINO's visualize_attention (Caron "
           "et al. 2021)", code="the model's own post-softmax attention (transformers' output_attentions)",
           test="tests/test_api.py::test_the_attention_map_is_the_models_own_attention_row", cost="analysis",
           question="Where does this query token look, in one layer and head?",
           runs=_FORWARD, tolerance="rtol 0, atol 1e-6"),
    Method("rollout", "Attention rollout", ("query", "end_layer", "fusion", "discard_ratio"), "every model",
           "attention", module="vit.explain.methods.attention", paper="Abnar & Zuidema 2020",
           code="their rollout by hand (a later layer multiplied on the left, the residual added)",
           test="tests/test_attention.py::test_rollout_two_layers_by_hand_multiplies_later_layer_on_the_left",
           cost="analysis",
           question="Which patches reach the query through every layer's attention, residuals included?",
           runs=_FORWARD, tolerance="hand-computed tensors, assert_close's float32 defaults"),
    Method("class", "Class-specific (gradient rollout)", ("class", "end_layer", "query"),
           "classifiers (a model with a head, or a CLIP / SigLIP after vit.ask); a VLM's tower: vit.explain_word",
           "gradient", class_specific=True, module="vit.explain.methods.attention", paper="Chefer et al. 2021b",
           code="Transformer-MM-Explainability's interpret() (their CLIP notebook)",
           test="tests/test_prompts.py::test_prompt_rollout_equals_the_notebooks_interpret", cost="class_map",
           question="Which patches does the class's gradient pick out in the attention, through the layers?",
           runs=_BACKWARD, tolerance="rtol 1e-5, atol 1e-6"),
    Method("legrad", "LeGrad (class-specific)", ("class", "start_layer"),
           "classifiers; CLIP / SigLIP through vit.ask; a VLM's tower through vit.explain_word", "gradient",
           class_specific=True, own_pass=True, module="vit.explain.methods.relevance", paper="Bousselham et al. 2024",
           code="the authors' LeGrad (its layer_index, their ViT wrapper)",
           test="tests/test_relevance.py::test_legrad_matches_the_authors_code_on_hf_vit", cost="legrad",
           question="Which patches does each layer's attention gradient tie to the class score?",
           runs="a forward, then a backward per layer explained", tolerance="rtol 1e-4, atol 1e-5"),
    Method("lrp", "LRP transformer attribution (class-specific)", ("class", "end_layer", "query"),
           "classifiers with a CLS token", "relevance", class_specific=True, own_pass=True,
           module="vit.explain.methods.relevance", paper="Chefer et al. 2021a",
           code="Transformer-Explainability's generate_LRP (transformer_attribution)",
           test="tests/test_relevance.py::test_transformer_attribution_matches_the_authors_code", cost="gradient",
           question="Which patches carry the class's relevance back through the attention?",
           runs=_LRP_PASS, tolerance="rtol 1e-4, atol 3e-5 in float32, over the map's scale"),
    Method("attnlrp", "AttnLRP (class-specific, signed)", ("class",),
           "classifiers; a VLM's tower through vit.explain_word", "relevance", class_specific=True, signed=True,
           own_pass=True, module="vit.explain.methods.relevance", paper="Achtibat et al. 2024",
           code="lxt's AttnLRP rules (efficient, on transformers' ViT)",
           test="tests/test_relevance.py::test_attnlrp_matches_lxt_rules_on_hf_vit", cost="attnlrp",
           question="How much does each patch add to, or take from, the class logit (relevance conserved)?",
           runs="a forward and a backward under lxt's rules", tolerance="rtol 1e-5, atol 1e-5"),
    Method("gradcam", "Grad-CAM (class-specific)", _CAM_READS, _CAM_APPLIES, "cam", class_specific=True,
           own_pass=True, module="vit.explain.methods.cam", paper="Selvaraju et al. 2017",
           code="pytorch-grad-cam's GradCAM", test=_CAM_TEST, cost="gradient",
           question="Which patches' last-block features does the class's mean gradient weigh up?",
           runs=_BACKWARD, tolerance=_CAM_TOL),
    Method("gradcam++", "Grad-CAM++ (class-specific)", _CAM_READS, _CAM_APPLIES, "cam", class_specific=True,
           own_pass=True, module="vit.explain.methods.cam", paper="Chattopadhay et al. 2018",
           code="pytorch-grad-cam's GradCAMPlusPlus", test=_CAM_TEST, cost="gradient",
           question="As Grad-CAM, with weights that favour several instances of the class",
           runs=_BACKWARD, tolerance=_CAM_TOL),
    Method("xgradcam", "XGrad-CAM (class-specific)", _CAM_READS, _CAM_APPLIES, "cam", class_specific=True,
           own_pass=True, module="vit.explain.methods.cam", paper="Fu et al. 2020", code="pytorch-grad-cam's XGradCAM",
           test=_CAM_TEST, cost="gradient",
           question="As Grad-CAM, with gradients scaled by the activations (its axioms)",
           runs=_BACKWARD, tolerance=_CAM_TOL),
    Method("eigencam", "EigenCAM (first principal component)", ("end_layer",),
           "every model (pytorch-grad-cam's, on the last block's norm1 tokens)", "cam", own_pass=True,
           module="vit.explain.methods.cam", paper="Muhammad & Yeasin 2020", code="pytorch-grad-cam's EigenCAM",
           test=_CAM_TEST, cost="gradient",
           question="What is the dominant pattern in the last block's tokens, whatever the class?",
           runs="a forward and an SVD of the last block's tokens", tolerance=_CAM_TOL),
    Method("layercam", "LayerCAM (class-specific)", _CAM_READS, _CAM_APPLIES, "cam", class_specific=True,
           own_pass=True, module="vit.explain.methods.cam", paper="Jiang et al. 2021",
           code="pytorch-grad-cam's LayerCAM",
           test=_CAM_TEST, cost="gradient",
           question="Which patches have positive gradient for the class, weighed patch by patch?",
           runs=_BACKWARD, tolerance=_CAM_TOL),
    Method("scorecam", "Score-CAM (class-specific, one forward per channel)", _CAM_READS,
           "classifiers, every family (one forward per channel: seconds to minutes)", "cam", class_specific=True,
           own_pass=True, module="vit.explain.methods.cam", paper="Wang et al. 2020",
           code="pytorch-grad-cam's ScoreCAM",
           test=_CAM_TEST, cost="gradient",
           question="Which of the last block's channels, used as masks, raise the class score?",
           runs="a forward per channel of the last block (768 on a ViT-B), in batches", tolerance=_CAM_TOL),
    # The model-agnostic baselines (vit.explain.methods.captum_maps): captum's own attributions of the logits, and RISE.
    Method("integrated_gradients", "Integrated Gradients (class-specific, signed; captum)", ("class",),
           _AGNOSTIC_APPLIES, "model-agnostic", class_specific=True, signed=True, pixels=True, own_pass=True,
           module="vit.explain.methods.captum_maps", paper="Sundararajan et al. 2017",
           code="captum's IntegratedGradients",
           test=_CAPTUM_PIXELS_TEST, cost="attribution",
           question="How much does each pixel move the logit from the baseline, along the straight path?",
           runs="50 forwards and backwards (captum's n_steps)", tolerance=_CAPTUM_TOL),
    Method("smoothgrad", "SmoothGrad (class-specific, signed; captum)", ("class",), _AGNOSTIC_APPLIES,
           "model-agnostic", class_specific=True, signed=True, pixels=True, own_pass=True,
           module="vit.explain.methods.captum_maps", paper="Smilkov et al. 2017",
           code="captum's NoiseTunnel(Saliency), nt_type='smoothgrad'",
           test=_CAPTUM_PIXELS_TEST, cost="attribution",
           question="Which pixels is the logit sensitive to, on average over noisy copies?",
           runs="5 forwards and backwards (captum's nt_samples)", tolerance=_CAPTUM_TOL),
    Method("input_x_gradient", "Input x Gradient (class-specific, signed; captum)", ("class",), _AGNOSTIC_APPLIES,
           "model-agnostic", class_specific=True, signed=True, pixels=True, own_pass=True,
           module="vit.explain.methods.captum_maps", paper="Shrikumar et al. 2016",
           code="captum's InputXGradient", test=_CAPTUM_PIXELS_TEST,
           cost="attribution",
           question="Which pixels, times their gradient, push the logit (first order)?",
           runs=_BACKWARD, tolerance=_CAPTUM_TOL),
    Method("occlusion", "Occlusion of patches (class-specific, signed; captum)", ("class",), _AGNOSTIC_APPLIES,
           "model-agnostic", class_specific=True, signed=True, own_pass=True, module="vit.explain.methods.captum_maps",
           paper="Zeiler & Fergus 2014", code="captum's Occlusion", test=_CAPTUM_TEST,
           cost="attribution",
           question="How much does the logit change when a window of pixels is blanked?",
           runs="a forward per window (one patch each by default)", tolerance=_CAPTUM_TOL),
    Method("feature_ablation", "Feature ablation of patches (class-specific, signed; captum)", ("class",),
           _AGNOSTIC_APPLIES, "model-agnostic", class_specific=True, signed=True, own_pass=True,
           module="vit.explain.methods.captum_maps", paper="captum's perturbation baseline (Kokhlikyan et al. 2020)",
           code="captum's FeatureAblation", test=_CAPTUM_TEST, cost="attribution",
           question="How much does the logit change when one patch alone is replaced by the baseline?",
           runs="a forward per patch", tolerance=_CAPTUM_TOL),
    Method("kernel_shap", "KernelSHAP of patches (class-specific, signed; captum)", ("class",), _AGNOSTIC_APPLIES,
           "model-agnostic", class_specific=True, signed=True, own_pass=True, module="vit.explain.methods.captum_maps",
           paper="Lundberg & Lee 2017", code="captum's KernelShap", test=_CAPTUM_TEST,
           cost="attribution",
           question="What is each patch's Shapley share of the logit, estimated from random coalitions?",
           runs="25 forwards (captum's n_samples)", tolerance=_CAPTUM_TOL),
    Method("rise", "RISE (class-specific, random masks)", ("class",), _AGNOSTIC_APPLIES, "model-agnostic",
           class_specific=True, own_pass=True, module="vit.explain.methods.rise", paper="Petsiuk et al. 2018",
           code="the authors' RISE (eclique/RISE's explanations.py)",
           test="tests/test_captum_methods.py::test_rise_equals_the_authors_code_with_the_same_masks",
           cost="attribution",
           question="Which patches keep the class score high under random masks?",
           runs="6,000 forwards (the authors' number of masks)", tolerance="rtol 0, atol 1e-6"),
    Method("attn-gradcam", "GradCAM on the last attention (class-specific, Chefer's baseline)", ("class",),
           "classifiers with a CLS token and one grid (Chefer et al.'s baseline)", "chefer baseline",
           class_specific=True, own_pass=True, module="vit.explain.methods.cam", paper="Chefer et al. 2021a's baseline",
           code=f"generate_cam_attn of {_CHEFER_CODE}",
           test="tests/test_chefer_baselines.py::test_attention_gradcam_equals_their_generate_cam_attn",
           cost="gradient",
           question="Which patches does the last attention, weighed by its gradient, send to CLS?",
           runs=_BACKWARD, tolerance="rtol 1e-5, atol 1e-5"),
    Method("lrp-partial", "Partial LRP, last attention (class-specific, Chefer's baseline)", ("class",),
           "classifiers with a CLS token, where Chefer's LRP has rules (their baseline)", "chefer baseline",
           class_specific=True, own_pass=True, module="vit.explain.methods.relevance",
           paper="Voita et al. 2019; Chefer et al. 2021a's baseline", code=f"generate_LRP_last_layer of {_CHEFER_CODE}",
           test="tests/test_chefer_baselines.py::test_partial_lrp_equals_their_last_layer_relprop", cost="gradient",
           question="Which patches carry the relevance of the last attention layer alone?",
           runs=_LRP_PASS, tolerance="rtol 1e-5, atol 1e-7"),
    Method("lrp-full", "Full LRP to the pixels (class-specific, signed, Chefer's baseline)", ("class",),
           "classifiers with a CLS token, where Chefer's LRP has rules (their baseline)", "chefer baseline",
           class_specific=True, signed=True, own_pass=True, module="vit.explain.methods.relevance",
           paper="Binder et al. 2016; Chefer et al. 2021a's baseline", code=f"generate_full_lrp of {_CHEFER_CODE}",
           test="tests/test_chefer_baselines.py::test_full_lrp_equals_their_full_relprop", cost="gradient",
           question="Which pixels carry the class's LRP relevance through the whole network?",
           runs=_LRP_PASS, tolerance="rtol 1e-5, atol 1e-7"),
    Method("flow", "Attention flow (max-flow, slow)", ("query", "end_layer", "fusion"),
           "every model (seconds: a max-flow per patch)", "attention", own_pass=True,
           module="vit.explain.methods.attention_flow", paper="Abnar & Zuidema 2020",
           code="their attention-flow procedure (networkx's maximum_flow_value on the layered graph)",
           test="tests/test_relevance.py::test_attention_flow_matches_the_reference_procedure_with_two_prefix_tokens",
           cost="flow",
           question="How much attention can flow from each patch to the query through the layers (max-flow)?",
           runs="a max-flow per patch on the layered attention graph (seconds)", tolerance="rtol 1e-9, atol 1e-12"),
    Method("norms", "Token norms (one layer's output)", ("layer",), "every model", "attention",
           module="vit.explain.views.attention_maps", paper="Darcet et al. 2024 (high-norm tokens)",
           code="each layer's output by hand (the hook_resid_post tensor's norm)",
           test="tests/test_chunked.py::test_token_norms_are_the_norms_of_each_layers_output", cost="analysis",
           question="Which tokens come out of a layer with outsized norms (high-norm tokens)?",
           runs=_FORWARD, tolerance="rtol 0, atol 1e-6"),
    Method("probe", "Pooling probe (what the embedding reads)", ("head", "fusion"),
           "models with an attention-pooling head (SigLIP)", "probe", module="vit.explain.views.attention_maps",
           paper="Zhai et al. 2023 (SigLIP's MAP head)", code="the model's own pooling attention",
           test="tests/test_family_explorer.py::test_a_model_without_cls_shows_its_pooling_probe_first_and_exactly",
           cost="analysis",
           question="Where does the pooling head's probe look to form the embedding?",
           runs=_FORWARD, tolerance="rtol 0, atol 1e-6"),
    Method("probe_rollout", "Attention rollout from the pooling probe", ("end_layer", "fusion", "discard_ratio"),
           "models with an attention-pooling head (SigLIP)", "probe", module="vit.explain.views.attention_maps",
           paper="Abnar & Zuidema 2020, from Zhai et al. 2023's probe", code="rollout by hand from the probe's row",
           test="tests/test_family_explorer.py::test_a_model_without_cls_shows_its_pooling_probe_first_and_exactly",
           cost="analysis",
           question="Which patches reach the pooling probe through every layer's attention?",
           runs=_FORWARD, tolerance="rtol 0, atol 1e-6"),
    # The maps of typed labels alone: vit.ask(checkpoint, image, labels).explain(label, name) draws them.
    Method("grad_eclip", "Grad-ECLIP", ("label",), "a CLIP (its CLS token)", "words",
           module="vit.explain.language.prompts",
           paper="Zhao et al. 2024", code="the authors' generate_emap",
           test="tests/test_prompts.py::test_grad_eclip_equals_generate_emap",
           question="Which patches make the image match a typed label?",
           runs="a forward of the image and the label, and a backward", tolerance="rtol 1e-4, atol 1e-6"),
    Method("sclip", "SCLIP", ("label",), _DENSE_APPLIES, "words", module="vit.explain.methods.dense_clip",
           paper="Wang et al. 2024", code="the authors' SCLIP segmentor",
           test="tests/test_dense_clip.py::test_sclip_is_the_authors_segmentor",
           question=_DENSE_QUESTION,
           runs=_DENSE_RUNS, tolerance="rtol 1e-5, atol 1e-5"),
    Method("naclip", "NACLIP", ("label",), _DENSE_APPLIES, "words", module="vit.explain.methods.dense_clip",
           paper="Hajimiri et al. 2025", code="the authors' NACLIP segmentor",
           test="tests/test_dense_clip.py::test_naclip_is_the_authors_segmentor",
           question=_DENSE_QUESTION,
           runs=_DENSE_RUNS, tolerance="rtol 1e-5, atol 1e-5"),
    Method("clearclip", "ClearCLIP", ("label",), _DENSE_APPLIES, "words", module="vit.explain.methods.dense_clip",
           paper="Lan et al. 2024", code="the authors' ClearCLIP segmentor",
           test="tests/test_dense_clip.py::test_clearclip_is_the_authors_segmentor",
           question=_DENSE_QUESTION,
           runs=_DENSE_RUNS, tolerance="rtol 1e-5, atol 1e-5"),
    Method("maskclip", "MaskCLIP", ("label",), _DENSE_APPLIES, "words", module="vit.explain.methods.dense_clip",
           paper="Zhou et al. 2022", code="the authors' MaskCLIP backbone and head (mmseg fork)",
           test="tests/test_dense_clip.py::test_maskclip_is_the_authors_backbone_and_head",
           question=_DENSE_QUESTION,
           runs=_DENSE_RUNS, tolerance="rtol 1e-5, atol 1e-5"),
    Method("clipsurgery", "CLIP Surgery", ("label",), "a CLIP with a CLS token and six blocks or more", "words",
           module="vit.explain.methods.dense_clip", paper="Li et al. 2023",
           code="the authors' demo (clip_surgery_model)",
           test="tests/test_dense_clip.py::test_clip_surgery_is_the_authors_demo",
           question="Which patches match a typed label, the redundant features all labels share removed?",
           runs="one forward with its surgery path", tolerance="rtol 1e-5, atol 1e-5"),
    Method("dinotxt", "dino.txt patch-text map", ("label",), "a DINOv3 with its dino.txt head", "words",
           module="vit.explain.language.prompts", paper="Jose et al. 2025 (DINOv2 Meets Text); Siméoni et al. 2025",
           code="DINOv3's zero-shot segmentation notebook (dinotxt_segmentation_inference.ipynb, predict_whole) on "
           "its dino.txt modules",
           test="tests/test_dinotxt.py::test_each_labels_map_is_the_authors_predict_whole_on_a_non_square_grid",
           question="Which patches match a typed label, as dino.txt segments an image?",
           runs="one forward of the backbone", tolerance="rtol 1e-5, atol 1e-5"),
)

_EVERY_MAP = "every map"
_NO_CLASSIFIER = "attention, rollout, norms, flow, EigenCAM; no classifier for the class-specific maps"
_STAGES = ("each layer on its own grid: attention, rollout, norms, the class map, LeGrad, AttnLRP and the CAMs; "
           "Chefer's LRP and its baselines, flow and the probe refused (one grid)")
_TOWER = ("attention, rollout, norms, flow; the class-specific maps of a word (vit.explain_word); Chefer's LRP "
          "refused (no classifier)")
_CLIP = ("the maps are per frame: attention, rollout, norms, the class map, LeGrad, AttnLRP, Grad-CAM, LayerCAM, "
         "EigenCAM; Chefer's LRP, its baselines and flow refused")

# The built-in families, in the README's order (its family table).
BUILTIN_FAMILIES: tuple[Family, ...] = (
    Family("ours", "This program's ViT", "image", "a .pt written by vit.train or vit.convert; a vit.train run folder",
           "vit.checkpoint", (), _EVERY_MAP),
    Family("vit", "ViT", "image", "HF vit folders", "vit.sources.ports.families.hf", ("vit",), _EVERY_MAP),
    Family("timm", "ViT, DeiT, DINOv2 from timm", "image", "timm vit_* / deit_* weights and folders",
           "vit.sources.ports.libraries.import_timm", (),
           "every map; Chefer's LRP where its rules reach (no layer scale)"),
    Family("torchvision", "torchvision ViT", "image", "torchvision vit_* state dicts",
           "vit.sources.ports.libraries.import_torchvision",
           (), _EVERY_MAP),
    Family("deit", "DeiT (distilled)", "image", "HF deit folders", "vit.sources.ports.families.hf", ("deit",),
           "every map; Chefer's LRP refused for the distillation head"),
    Family("dinov2", "DINOv2 (+ registers)", "image", "HF dinov2 / dinov2_with_registers folders",
           "vit.sources.ports.families.hf",
           ("dinov2", "dinov2_with_registers"), "every map; Chefer's LRP refused (layer scale)"),
    Family("mae", "MAE", "image", "HF vit_mae folders", "vit.sources.ports.families.hf", ("vit_mae",),
           "every map; Chefer's LRP refused (average pooling)"),
    Family("dinov3", "DINOv3 (RoPE, storage tokens)", "image",
           "HF dinov3_vit folders, timm vit_*_dinov3* weights, facebookresearch/dinov3 backbones",
           "vit.sources.ports.families.import_dinov3", ("dinov3_vit",),
           "every map; Chefer's LRP refused (layer scale, RoPE)"),
    Family("clip", "CLIP, MetaCLIP 2", "image", "open_clip folders and state dicts, OpenAI's layout, HF clip / "
           "clip_vision_model / metaclip_2", "vit.sources.ports.families.import_clip",
           ("clip", "clip_vision_model", "metaclip_2"),
           "every map; the typed labels' maps through vit.ask (Grad-ECLIP, SCLIP, NACLIP, ClearCLIP, MaskCLIP, "
           "CLIP Surgery)"),
    Family("dinotxt", "DINOv3 with dino.txt (its vision head and text tower)", "image",
           "facebookresearch/dinov3's dino.txt head and text .pth beside its backbone .pth, or a folder of the two",
           "vit.sources.ports.families.import_dinotxt", (),
           "every map of its backbone; the typed labels' maps through vit.ask (dino.txt's patch-text map, AttnLRP); "
           "Chefer's LRP refused (layer scale, RoPE)"),
    Family("siglip", "SigLIP (attention pooling)", "image", "HF siglip / siglip_vision_model folders",
           "vit.sources.ports.families.import_siglip", ("siglip", "siglip_vision_model"),
           "the probe's maps first; every map but Chefer's LRP (pooling); labels' maps through vit.ask"),
    Family("siglip2", "SigLIP 2 NaFlex", "image", "HF siglip2 / siglip2_vision_model folders",
           "vit.sources.ports.families.import_siglip", ("siglip2", "siglip2_vision_model"),
           "each image on its own grid: the probe's maps, attention, rollout, norms, flow; class maps of words"),
    Family("naflexvit", "timm NaFlex ViT", "image", "timm naflexvit_* weights",
           "vit.sources.ports.families.import_naflex",
           (),
           "every map; Chefer's LRP refused (layer scale)"),
    Family("eva02", "EVA-02 (RoPE, SwiGLU)", "image", "timm eva02_* weights", "vit.sources.ports.families.import_eva",
           (),
           "every map; Chefer's LRP refused (average pooling, RoPE, SwiGLU)"),
    Family("beit", "BEiT, BEiT v2, Data2Vec-vision", "image", "HF beit / data2vec-vision folders, timm beit_*",
           "vit.sources.ports.families.import_beit", ("beit", "data2vec-vision"),
           "every map; Chefer's LRP refused (layer scale)"),
    Family("sam", "SAM and SAM-HQ image encoder", "windowed / hierarchical",
           "HF sam / sam_vision_model / sam_hq / sam_hq_vision_model folders, timm samvit_*",
           "vit.sources.ports.families.import_sam", ("sam", "sam_vision_model", "sam_hq", "sam_hq_vision_model"),
           f"a windowed layer's attention is the query's window; {_NO_CLASSIFIER}"),
    Family("qwen2-vl", "Qwen2-VL's vision tower", "vlm tower", "HF qwen2_vl folders (the tower only)",
           "vit.sources.vlm.import_qwen", ("qwen2_vl",), _TOWER),
    Family("qwen2.5-vl", "Qwen2.5-VL's vision tower", "vlm tower", "HF qwen2_5_vl folders (the tower only)",
           "vit.sources.vlm.import_qwen", ("qwen2_5_vl",), _TOWER),
    Family("qwen3-vl", "Qwen3-VL's and Qwen3-VL-MoE's vision tower", "vlm tower",
           "HF qwen3_vl / qwen3_vl_moe folders (the tower only)", "vit.sources.vlm.import_qwen",
           ("qwen3_vl", "qwen3_vl_moe"), _TOWER),
    Family("hiera", "Hiera (mask units, query pooling)", "windowed / hierarchical", "HF hiera folders, timm hiera_*",
           "vit.sources.ports.families.import_hiera", ("hiera",), _STAGES),
    Family("sam2", "SAM 2's Hiera image encoder", "windowed / hierarchical",
           "HF sam2 / sam2_vision_model / sam2_hiera_det_model folders, timm sam2_hiera*",
           "vit.sources.ports.families.import_hiera",
           ("sam2", "sam2_vision_model", "sam2_hiera_det_model"), f"as Hiera's; {_NO_CLASSIFIER}"),
    Family("aimv2", "AIMv2 (RMSNorm, SwiGLU)", "image", "HF aimv2 / aimv2_vision_model folders, timm aimv2_*",
           "vit.sources.ports.families.import_aimv2", ("aimv2", "aimv2_vision_model"),
           "every map; Chefer's LRP refused (pooling, RMSNorm)"),
    Family("pe", "Perception Encoder", "image", "timm vit_pe_* weights", "vit.sources.ports.families.import_pe", (),
           "every map (core: the probe's 8 heads); Chefer's LRP refused (pooling, RoPE)"),
    Family("swin", "Swin", "windowed / hierarchical", "HF swin folders, timm swin_*",
           "vit.sources.ports.families.import_swin",
           ("swin",), _STAGES),
    Family("swinv2", "Swin V2", "windowed / hierarchical", "HF swinv2 folders, timm swinv2_* (not swinv2_cr)",
           "vit.sources.ports.families.import_swin", ("swinv2",), _STAGES),
    Family("llava", "A VLM's vision tower: LLaVA 1.5 / NeXT / NeXT-Video / OneVision, PaliGemma, Gemma 3", "vlm tower",
           "HF llava / llava_next / llava_next_video / llava_onevision / paligemma / gemma3 folders (the tower and "
           "projector only)",
           "vit.sources.vlm.import_vlm", ("llava", "llava_next", "llava_next_video", "llava_onevision", "paligemma",
                                           "gemma3"), _TOWER),
    Family("videomae", "VideoMAE", "video", "HF videomae folders",
           "vit.sources.ports.families.video_ports.import_videomae", ("videomae",), _CLIP),
    Family("vivit", "ViViT", "video", "HF vivit folders", "vit.sources.ports.families.video_ports.import_vivit",
           ("vivit",), _CLIP),
    Family("timesformer", "TimeSformer", "video", "HF timesformer folders",
           "vit.sources.ports.families.video_ports.import_timesformer",
           ("timesformer",), "attention (spatial and temporal), norms, AttnLRP; rollout and the class maps refused "
                             "(two attentions per block)"),
    Family("vjepa2", "V-JEPA 2", "video", "HF vjepa2 folders", "vit.sources.ports.families.video_ports.import_vjepa2",
           ("vjepa2",),
           "attention, rollout, norms per frame; AttnLRP through the classifier's pooler; the rest refused"),
    Family("internvl", "InternVL 2.5 / 3 / 3.5's vision tower", "vlm tower", "HF internvl (-hf) folders",
           "vit.sources.vlm.import_internvl", ("internvl",), _TOWER),
    Family("scratch", "The tutorials' from-scratch ViTs", "image",
           "tintn's experiments, the MNIST tutorial's and the CIFAR-10 notebook's state dicts",
           "vit.sources.ports.libraries.import_scratch", (), _EVERY_MAP),
    Family("vit-pytorch", "vit-pytorch's ViT, SimpleViT and ViT for small datasets", "image", "vit-pytorch state dicts",
           "vit.sources.ports.libraries.import_vit_pytorch", (), _EVERY_MAP),
    Family("mapped", "Any layout, by a mapping file", "image", "any state dict with a mapping (vit.convert --map)",
           "vit.sources.ports.libraries.mapping", (), _EVERY_MAP),
    # The library road (issue 91): the library's own model, its attention recorded; taken where no port reads it
    Family("transformers-library", "Any transformers vision model without a port: I-JEPA, ViT-MSN, Pixio, C-RADIO, "
           "MetaCLIP 2, MLCD and SmolVLM towers, ViTPose (whole, or its backbone), TIPSv2 (whole: its image tower), "
           "Pixtral's and Molmo 2's vision models, GIT's tower, EoMT, YOLOS, DPT, Depth Anything, "
           "SAM 3's vision encoder and SAM 3 tracker (its prompts through vit.segment)",
           "image",
           "HF folders whose model_type no port reads and whose attention runs through transformers' attention "
           "interface, its tokens a prefix then the patches (EoMT's object queries before them in its last blocks, "
           "YOLOS's detection tokens after them, SAM 3's ViTDet windows placed on the grid) (vit.load)",
           "vit.sources.library_road.transformers_models", (), _LIBRARY_MAPS, road="library"),
    Family("timm-library", "timm architectures without a port: FlexiViT, the RoPE ViTs, InternViT-300M, relpos ViT",
           "image", "timm folders and weights the ports refuse whose blocks use timm's attention (vit.load)",
           "vit.sources.library_road.timm_models", (), _LIBRARY_MAPS, road="library"),
    Family("pe-video", "PE video (Perception Encoder's video encoder)", "video",
           "HF pe_video_encoder folders (PeVideoEncoder), pe_video's video encoder (vit.load)",
           "vit.sources.library_road.pe_video", (),
           "a clip's attention and rollout within each frame (its timm PE-Core trunk), each frame's pooling probe and "
           "the attention over the frames (its temporal encoder), any layer and head, through vit.explain; the other "
           "maps refused in one line (issue 91)", road="library"),
    Family("open_clip-timm", "open_clip towers with a timm trunk: SigLIP 2, PE-Core", "image",
           "open_clip folders whose vision_cfg names a timm_model_name (vit.load)",
           "vit.sources.library_road.timm_models", (),
           _LIBRARY_MAPS, road="library"),
    Family("open_clip-recorded", "open_clip towers the port does not read: CoCa, the ResNets (RN50 ...)", "image",
           "open_clip folders whose vision_cfg the port does not express (CoCa's attentional pooler, a ResNet's "
           "layers), built as open_clip builds them (vit.load)",
           "vit.sources.library_road.open_clip_towers", (),
           "attention (any layer, head, query) and rollout under the recorder (CoCa's pooler named as learnt queries, "
           "not a layer); labels' scores and maps through vit.ask and Ask in words: the CAMs, captum's attributions "
           "and RISE (nn.MultiheadAttention's weights take no gradient, so no class map or LeGrad); the other maps "
           "refused in one line", road="library"),
)


# -- the plugins ------------------------------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: tuple[tuple[Method, ...], tuple[Family, ...], tuple[str, ...]] | None = None


def _problem(item: Method | Family, taken: set[str], taken_types: set[str]) -> str | None:
    """Why a plugin's ``item`` cannot be registered, in words; None when it can."""
    if not isinstance(item.name, str) or not NAME.fullmatch(item.name):
        return f"its name {item.name!r} is not a short lower-case word (letters, digits, _ . + -)"
    if item.name in taken:
        return f"the name {item.name!r} is taken"
    if isinstance(item, Method):
        if not callable(item.draw):
            return "a plugin method needs a draw callable"
        if item.group not in GROUPS or item.group == "words":
            return f"its group {item.group!r} is not one of {', '.join(g for g in GROUPS if g != 'words')}"
        if not isinstance(item.reads, tuple) or not set(item.reads) <= set(PLUGIN_READS):
            return f"its reads {item.reads!r} are not a tuple of {', '.join(PLUGIN_READS)}"
        if item.class_specific != ("class" in item.reads):
            return "a class-specific method reads 'class', and only such a method does"
        if item.cost not in (None, "forward", "gradient"):
            return f"its cost {item.cost!r} is not 'forward' or 'gradient'"
        return None
    if not callable(item.open):
        return "a plugin family needs an open callable"
    if item.kind not in FAMILY_KINDS:
        return f"its kind {item.kind!r} is not one of {', '.join(FAMILY_KINDS)}"
    types = item.hf_model_types
    if not isinstance(types, tuple) or not types or not all(isinstance(t, str) and t for t in types):
        return "its hf_model_types must be a non-empty tuple of config.json model_types"
    clash = [t for t in types if t in taken_types]
    return f"its model_type {clash[0]!r} is opened already" if clash else None


def _read_group(group: str, kind: type, taken: set[str], taken_types: set[str], skipped: list[str]) -> list:
    """The valid ``kind`` objects the entry points of ``group`` give, each marked with its distribution."""
    found = []
    for point in sorted(importlib.metadata.entry_points(group=group), key=lambda p: p.name):
        dist = getattr(point.dist, "name", None) or point.value
        where = f"plugin {point.name!r} ({group} = {point.value}, from {dist})"
        try:
            loaded = point.load()
            items = loaded() if callable(loaded) and not isinstance(loaded, (Method, Family)) else loaded
            items = [items] if isinstance(items, (Method, Family)) else list(items)
            for item in items:
                if not isinstance(item, kind):
                    raise TypeError(f"it gives a {type(item).__name__}, not a vit.registry.{kind.__name__}")
        except Exception as e:  # third-party code: whatever it raises, one line naming it, and the rest still load
            skipped.append(f"vit: skipped {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        for item in items:
            problem = _problem(item, taken, taken_types)
            if problem:
                skipped.append(f"vit: skipped {where}: {problem}")
                continue
            taken.add(item.name)
            if isinstance(item, Family):
                taken_types.update(item.hf_model_types)
            # a plugin's method is drawn in a pass of its own (its draw runs the model), as model_method_map's are
            found.append(replace(item, plugin=dist, **({"own_pass": True} if isinstance(item, Method) else {})))
    return found


def _plugins() -> tuple[tuple[Method, ...], tuple[Family, ...], tuple[str, ...]]:
    """The plugins' methods and families and the lines of those skipped, read once (on first use)."""
    global _loaded
    with _lock:
        if _loaded is None:
            skipped: list[str] = []
            methods = _read_group(METHOD_GROUP, Method, {m.name for m in BUILTIN_METHODS}, set(), skipped)
            families = _read_group(FAMILY_GROUP, Family, {f.name for f in BUILTIN_FAMILIES},
                                   {t for f in BUILTIN_FAMILIES for t in f.hf_model_types}, skipped)
            for line in skipped:
                print(line, file=sys.stderr)
            _loaded = (tuple(methods), tuple(families), tuple(skipped))
        return _loaded


def reload_plugins() -> None:
    """Forget the plugins read, so that the next use reads the entry points again (after an install, in tests)."""
    global _loaded
    with _lock:
        _loaded = None


def skipped_plugins() -> tuple[str, ...]:
    """One line for each plugin that was skipped, naming it and why."""
    return _plugins()[2]


# -- what the rest of the program reads ---------------------------------------------------------------------------

def methods(group: str | None = None) -> tuple[Method, ...]:
    """Every method, in the explorer's order (the built-ins, then the plugins'); with ``group`` those of it."""
    every = BUILTIN_METHODS + _plugins()[0]
    return every if group is None else tuple(m for m in every if m.group == group)


def find_method(name: str) -> Method | None:
    """The method ``name`` (a built-in or a plugin's), None when there is none."""
    return next((m for m in BUILTIN_METHODS if m.name == name), None) or next(
        (m for m in _plugins()[0] if m.name == name), None)


def plugin_methods() -> tuple[Method, ...]:
    """The plugins' methods."""
    return _plugins()[0]


def families(kind: str | None = None) -> tuple[Family, ...]:
    """Every family, in the README's order (the built-ins, then the plugins'); with ``kind`` those of it."""
    every = BUILTIN_FAMILIES + _plugins()[1]
    return every if kind is None else tuple(f for f in every if f.kind == kind)


def plugin_family(model_type: object) -> Family | None:
    """The plugin family that opens config.json's ``model_type``, None when no plugin does (the built-ins are
    ``vit.sources.open``'s)."""
    return next((f for f in _plugins()[1] if model_type in f.hf_model_types), None)


def hf_model_types() -> tuple[str, ...]:
    """Every config.json model_type that opens, the plugins' included."""
    return tuple(t for f in families() for t in f.hf_model_types)


def table(what: str) -> list[dict[str, str]]:
    """The rows of the docs' table of ``what`` ("methods" or "families"), in the explorer's order: one dict per
    method or family, its fields as text (no callables), ``reference`` in place of ``paper`` and ``code``."""
    if what not in ("methods", "families"):
        raise ValueError(f"table({what!r}): choose 'methods' or 'families'")
    rows = []
    for item in methods() if what == "methods" else families():
        row = {}
        for f in fields(item):
            value = getattr(item, f.name)
            if f.name in ("draw", "open", "paper", "code"):
                continue
            row[f.name] = ", ".join(value) if isinstance(value, tuple) else "" if value is None else str(value)
        if isinstance(item, Method):
            row["reference"] = item.reference
        rows.append(row)
    return rows


# The vision-language models that answer questions (``vit.ask_vlm``): model_type -> the architecture asked, a
# generating model (a bare ...Model has no language-model head).
VLM_ARCHITECTURES = {
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "llava_next_video": "LlavaNextVideoForConditionalGeneration",
    "llava_onevision": "LlavaOnevisionForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    "paligemma": "PaliGemmaForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
    "internvl": "InternVLForConditionalGeneration",
    "glm4v": "Glm4vForConditionalGeneration",
    "glm4v_moe": "Glm4vMoeForConditionalGeneration",
    "glm46v": "Glm46VForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "llama4": "Llama4ForConditionalGeneration",
    "mllama": "MllamaForConditionalGeneration",
    "florence2": "Florence2ForConditionalGeneration",
    "molmo2": "Molmo2ForConditionalGeneration",
    "gemma3n": "Gemma3nForConditionalGeneration",
}


def vlm_architecture(model_type: str) -> str | None:
    """The generating class a ``model_type`` answers questions with (``vit.ask_vlm``): the named families'
    (``VLM_ARCHITECTURES``), else that of transformers' image-text-to-text auto-mapping
    (``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``, what ``AutoModelForImageTextToText`` opens: issue 113, any VLM by
    what it is); None for neither."""
    if model_type in VLM_ARCHITECTURES:
        return VLM_ARCHITECTURES[model_type]
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
