"""Library-road maps of a class's gradients (``vit.explain.views.library.road_maps``' wing), over the library's own
forward and backward, each computed by the port's own functions, so the two roads draw the same map of the same
numbers:

- ``class``: Chefer, Gur & Wolf's gradient rollout ("Generic attention-model explainability", 2021) from each
  layer's post-softmax attention and the class logit's gradient with respect to it
  (``LibraryModel.class_gradients``; ``positive_gradient_attention``, ``relevance_rollout_row``);
- the CAMs (Grad-CAM, Grad-CAM++, XGrad-CAM, EigenCAM, LayerCAM, Score-CAM, as pytorch-grad-cam defines them:
  ``vit.explain.methods.cam``) of the tokens a layer's attention reads, a pre-norm block's first norm's output
  (pytorch-grad-cam's ViT tutorial's ``norm1``; ``LibraryModel.attention_inputs``), the prefix tokens dropped and
  the patches row-major on the grid;
- ``legrad``: LeGrad (Bousselham et al. 2024) of a classifier, the model's own head reading each layer's output from
  the explained one on (the blocks after it pass their input on: ``LibraryModel.legrad_gradients``), aggregated by
  the port's ``legrad_from_gradients``;
- ``attnlrp``: AttnLRP (Achtibat et al. 2024) of a transformers model, the efficient rules of lxt put on the
  library's own modules by type, as a VLM's answer takes them (``vlm_attnlrp.put_rules``: the norms' identity rule,
  the activations', the gated MLPs' uniform rule, the attention's at the recording attention function its attention
  already runs through), input x gradient of the class logit summed over the channels and each patch."""

from __future__ import annotations

import numpy as np
import torch

from vit.explain.methods import cam
from vit.explain.methods.attention import pooled_readout, positive_gradient_attention, relevance_rollout_vector
from vit.explain.views.library.road_maps import (
    LibraryMap,
    LibraryMethod,
    attention_gradient_problem,
    default_query,
    describe_query,
    gradient_problem,
    prediction_of,
)


def _class_map(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    """Row ``query`` of the gradient rollout up to ``layer`` for class ``class_index`` (None: the predicted one);
    ``query`` None: ``default_query``'s (CLS, or the mean of the patches' rows)."""
    model = checkpoint.model
    grid, prefix = model.input_grid(pixels), model.layout.num_prefix_tokens
    logits, attentions, gradients = model.class_gradients(pixels, class_index, range(layer + 1))
    terms = [positive_gradient_attention(attentions[i], gradients[i]) for i in range(layer + 1)]  # (1, T, T) each
    T, query = terms[0].shape[-1], default_query("class", query, grid, prefix)
    start = pooled_readout(T, prefix, grid[0] * grid[1]) if query is None else torch.eye(T)[query][None]  # (1, T)
    row = relevance_rollout_vector(terms, start)[0][prefix:prefix + grid[0] * grid[1]]  # (gh * gw,): the patches
    explained = int(logits[0].argmax()) if class_index is None else class_index
    return LibraryMap(row.reshape(grid).float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                      prediction_of(checkpoint, logits), checkpoint.class_names[explained])


def _cam(method: str):
    def draw(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
        """The ``method`` CAM of layer ``layer``'s attention input for class ``class_index`` (None: the predicted
        one; EigenCAM reads no class)."""
        model = checkpoint.model
        grid, prefix = model.input_grid(pixels), model.layout.num_prefix_tokens
        gradients = method not in cam.GRADIENT_FREE
        tokens, grads, logits = model.attention_inputs(pixels, layer, class_index, gradients)
        end = prefix + grid[0] * grid[1]  # the tokens after the patches (YOLOS's detection tokens) left out
        tokens, grads = tokens[:, :end], None if grads is None else grads[:, :end]
        acts = cam._on_grid(tokens, grid)  # (1, D, gh, gw)
        if method == "eigencam":
            result = cam.eigen_projection(acts)
        elif method == "layercam":
            result = (cam._on_grid(grads, grid).clamp(min=0) * acts).sum(dim=1)
        else:
            if method == "scorecam":
                if logits is None:
                    raise ValueError("Score-CAM scores a class; this model has no classifier")
                from vit.costs import plan

                plan.decide(plan.attribution_passes(model.cost_shape(), grid, "Score-CAM", acts.shape[1]))
                index = logits.argmax(-1) if class_index is None else torch.tensor([class_index])
                weights = cam.score_weights(lambda images: (model(images),), pixels, acts, index)
            else:
                weights = cam.cam_weights(method, acts, cam._on_grid(grads, grid))
            result = (weights[:, :, None, None] * acts).sum(dim=1)  # (1, gh, gw)
        explained = None
        if method != "eigencam" and logits is not None:
            explained = checkpoint.class_names[int(logits[0].argmax()) if class_index is None else class_index]
        return LibraryMap(result.clamp(min=0)[0].float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                          prediction_of(checkpoint, logits), explained)
    return draw


def _cam_caption(method: str):
    title = cam.CAM_METHODS[method]
    if method == "eigencam":
        return lambda layer, head, query, target: f"{title} of the tokens layer {layer + 1}'s attention reads."
    return lambda layer, head, query, target: (f"{title} of {target!r} on the tokens layer {layer + 1}'s attention "
                                               "reads.")


def _legrad(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    """LeGrad of class ``class_index`` (None: the predicted one) over the layers from ``layer`` to the last: at each,
    the model's own head reading that layer's output, ``relu(dS/dA)`` averaged over the heads and the queries, summed
    over the layers (``relevance.legrad_from_gradients``), on the patch keys."""
    from vit.explain.methods.relevance import legrad_from_gradients

    model = checkpoint.model
    grid, prefix = model.input_grid(pixels), model.layout.num_prefix_tokens
    logits, gradients = model.legrad_gradients(pixels, class_index, range(layer, model.num_layers))
    value = legrad_from_gradients(list(gradients.values()), grid, prefix)[0]
    explained = int(logits[0].argmax()) if class_index is None else class_index
    return LibraryMap(value.float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                      prediction_of(checkpoint, logits), checkpoint.class_names[explained])


def attnlrp_problem(model) -> str | None:
    """Why AttnLRP's rules do not reach ``model`` (a library-road model), or None."""
    from transformers import PreTrainedModel

    from vit.explain.language.vlm_attnlrp import unruled_norms

    if (unreached := gradient_problem(model)):
        return unreached
    if not isinstance(model.model, PreTrainedModel):
        return ("AttnLRP on the library road puts lxt's rules on transformers' modules; timm's own are not ruled "
                "yet (a timm family with a port draws it there)")
    unruled = unruled_norms(model.model)
    if unruled:
        return f"AttnLRP has no rule for {', '.join(unruled[:3])} (lxt's rules reach LayerNorm and RMSNorm)"
    return None


def _attnlrp(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    """AttnLRP of class ``class_index`` (None: the predicted one) to the pixels, signed, on the patch grid."""
    from vit.explain.language.vlm_attnlrp import put_rules, rules_current
    from vit.explain.methods.relevance import AttnLRPRules

    model = checkpoint.model
    problem = attnlrp_problem(model)
    if problem:
        raise ValueError(problem)
    grid, prefix = model.input_grid(pixels), model.layout.num_prefix_tokens
    from vit.costs import plan

    plan.decide(plan.library_gradient(model.cost_shape(), grid, "AttnLRP"))
    put_rules(model.model)
    with torch.inference_mode(False), torch.enable_grad(), rules_current(AttnLRPRules()):
        x = pixels.detach().clone().requires_grad_(True)
        logits = model.logits(x)
        explained = int(logits[0].argmax()) if class_index is None else class_index
        [grad] = torch.autograd.grad(logits[0, explained], x)
    relevance = (x.detach() * grad).sum(1)[0]  # (H, W)
    H, W = relevance.shape
    sums = relevance.reshape(grid[0], H // grid[0], grid[1], W // grid[1]).sum((1, 3))
    return LibraryMap(sums.float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                      prediction_of(checkpoint, logits.detach()), checkpoint.class_names[explained])


METHODS = (
    LibraryMethod("class", ("target", "layer", "query"), True, _class_map,
                  lambda layer, head, query, target: f"Class-specific map of {target!r} (gradient rollout up to layer "
                                                     f"{layer + 1}): what {describe_query(query)} draws on for that "
                                                     "class.", attention_gradient_problem),
    LibraryMethod("legrad", ("target", "layer"), True, _legrad,
                  lambda layer, head, query, target: f"LeGrad of {target!r} from layer {layer + 1} on: where the "
                                                     "head's reading of each layer is most sensitive to its "
                                                     "attention.", attention_gradient_problem, default_layer=-2),
    LibraryMethod("attnlrp", ("target",), True, _attnlrp,
                  lambda layer, head, query, target: f"AttnLRP of {target!r}: each patch's signed share of the class "
                                                     "logit (lxt's rules on the library's own modules).",
                  attnlrp_problem),
) + tuple(LibraryMethod(name, ("layer",) if name == "eigencam" else ("target", "layer"), name != "eigencam",
                        _cam(name), _cam_caption(name)) for name in cam.CAM_METHODS)
