"""The maps files ``python -m vit.predict --save-maps`` writes for an image model: each image's ``.npz`` (every
layer's attention, streamed a chunk at a time; a staged model's windows; the logits), its CLS and rollout overlays,
and each asked label's maps. A line on stderr (``prog``'s) says how large the ``.npz`` will be before it is written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from vit.checkpoint import Checkpoint
    from vit.core.inference import FileResult, InputSize


def maps_bytes(num_layers: int, num_heads: int, tokens: int, dtype: str) -> int:
    """Bytes of the ``layer_i`` arrays of one image's ``.npz``: ``L x H x T²`` values of ``dtype``."""
    from vit.explain.views.overlay import npz_array_bytes

    return num_layers * npz_array_bytes((num_heads, tokens, tokens), dtype)


def save_prompt_maps(result: FileResult, checkpoint: Checkpoint, prompts, folder: Path, stem: str,
                     size: InputSize) -> tuple[dict[str, np.ndarray], list[dict[str, str]]]:
    """Every label's map of ``result``'s image by each method that applies, drawn into ``folder``: the arrays
    for the ``.npz`` (``prompt_<method>``: (labels, rows, cols)) and the PNG paths per label. ``checkpoint`` is
    the image tower's own (not the one ``prompt_checkpoint`` made)."""
    from vit.core.inference import preprocess, seen_region
    from vit.explain.language.prompts import methods_for, prompt_maps
    from vit.explain.views.overlay import overlay, write_png

    model = checkpoint.model
    x = preprocess([result.image], checkpoint.preprocessing, size, model.config.patch_size)
    x = x.to(next(model.parameters()).device)  # (1, C, H, W)
    seen = seen_region(result.image, checkpoint.preprocessing, size)
    arrays, files = {}, [{"label": label} for label in prompts.labels]
    for method in methods_for(model):
        maps = prompt_maps(model, x, prompts, method).float().cpu()  # (n, gh, gw)
        arrays[f"prompt_{method}"] = maps.numpy()
        for i, map2d in enumerate(maps):
            path = folder / f"{stem}_{method}_{i}.png"
            write_png(path, overlay(seen, map2d.numpy()))
            files[i][method] = str(path)
    return arrays, files


def save_maps(result: FileResult, checkpoint: Checkpoint, folder: Path, stem: str,
              size: InputSize | None = None, prompts=None, tower: Checkpoint | None = None,
              dtype: str = "float32", prog: str = "vit.predict") -> dict:
    """Write ``result``'s attention arrays and its CLS and rollout overlays (and with ``prompts`` each label's
    maps, computed on ``tower``, the image tower ``checkpoint`` was asked through); returns the files by kind.

    For our ``ViT`` the arrays are computed layer by layer in chunks from the layer inputs of one more forward
    pass, and the rollout overlay is the rollout's CLS row by row vector (``vit.explain.methods.chunked``): memory
    stays bounded at any size. A model that is not our ``ViT`` gives its attentions whole. ``size`` None is the
    checkpoint's own input size."""
    import numpy as np
    import torch

    from vit.core.inference import TRAINING_SIZE, input_box, input_shape, preprocess, seen_region
    from vit.explain.methods.attention import fuse_heads, rollout
    from vit.explain.methods.chunked import LayerInputs, attention_chunks
    from vit.explain.methods.hidden import forward_with_hidden_states, layout_problem
    from vit.explain.views.overlay import overlay, write_npz_streamed, write_png
    from vit.model import ViT

    size = TRAINING_SIZE if size is None else size
    prediction, model = result.prediction, checkpoint.model
    shape = input_shape(result.image, checkpoint.preprocessing, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    prefix = model.num_prefix_tokens
    if isinstance(model, ViT) and model.config.stage_depths:
        return save_stage_maps(result, checkpoint, folder, stem, size, dtype, prog)
    if isinstance(model, ViT):
        x = preprocess([result.image], checkpoint.preprocessing, size, model.config.patch_size)
        with torch.inference_mode():
            _, hidden = forward_with_hidden_states(model, x.to(next(model.parameters()).device))  # (1, L+1, T, D)
        inputs = LayerInputs(model, hidden.float(), grid)
        cls_row = inputs.fused(-1, 0)[0]  # (T,)
        rollout_row = inputs.rollout_row(0, num_prefix_tokens=prefix)[0]  # (T,)
        L, H, T = inputs.num_layers, inputs.num_heads, inputs.num_tokens

        def pieces(layer: int):  # (H, T, T) in C order: head by head, a chunk of queries at a time
            if layout_problem(model):  # windows or a bias (SAM, BEiT): the exact layer's rows, placed on the grid
                for h in range(H):
                    for _, _, probs in inputs.chunks(layer, heads=[h]):
                        yield probs[0, 0].cpu().numpy()
                return
            q, k = inputs.queries_and_keys(layer)
            for h in range(H):
                for _, _, probs in attention_chunks(q, k, heads=[h]):
                    yield probs[0, 0].cpu().numpy()
    else:
        layers = [torch.from_numpy(a)[None] for a in prediction.attentions]  # each (1, heads, T, T)
        cls_row = fuse_heads(layers[-1], "mean")[0, 0]
        rollout_row = rollout(layers, "mean", num_prefix_tokens=prefix)[0, 0]
        L, (H, T, _) = len(layers), prediction.attentions[0].shape

        def pieces(layer: int):
            yield prediction.attentions[layer]
    files = {"npz": folder / f"{stem}.npz", "cls": folder / f"{stem}_cls.png",
             "rollout": folder / f"{stem}_rollout.png"}
    print(f"{prog}: writing {files['npz']}: {maps_bytes(L, H, T, dtype) / 2**20:,.1f} MB "
          f"({L} layers x {H} heads x {T:,}² {dtype})", file=sys.stderr, flush=True)
    extra = {}
    if checkpoint.class_names:  # a model without a head has no logits to keep
        extra = dict(probabilities=prediction.probabilities, logits=prediction.logits,
                     class_names=np.array(checkpoint.class_names))
    listed = {}
    if prompts is not None:
        prompt_arrays, listed["prompts"] = save_prompt_maps(result, tower, prompts, folder, stem, size)
        extra.update(prompt_arrays, probability_kind=np.array(prompts.kind),
                     templates=np.array(prompts.templates))
    box = input_box(result.image.size, checkpoint.preprocessing, size)  # what the model saw (a crop, for some)
    write_npz_streamed(files["npz"], ((f"layer_{i}", (H, T, T), dtype, pieces(i)) for i in range(L)), **extra,
                       grid=np.array(grid), patch_size=np.array(model.config.patch_size),
                       prefix_tokens=np.array(prefix), input_size=np.array(shape),
                       input_box=np.array(box, dtype=np.float64))
    seen = seen_region(result.image, checkpoint.preprocessing, size)  # maps go over exactly those pixels
    write_png(files["cls"], overlay(seen, cls_row[prefix:].reshape(grid).float().numpy()))
    write_png(files["rollout"], overlay(seen, rollout_row[prefix:].reshape(grid).float().numpy()))
    return {**{kind: str(path) for kind, path in files.items()}, **listed}


def save_stage_maps(result: FileResult, checkpoint: Checkpoint, folder: Path, stem: str, size, dtype: str,
                    prog: str = "vit.predict") -> dict:
    """``save_maps`` for a model with stages (Swin, Hiera): ``layer_i`` is each layer's windows as the layer forms
    them, ``(windows, heads, queries, keys)``, with ``layer_i_grid`` / ``_window`` / ``_shift`` / ``_stride`` to place
    them (``vit.model.LayerLayout``, ``vit.explain.methods.attention.layer_on_grid``: a pooled-query layer's keys lie on
    the grid ``stride`` times finer); the logits as for every classifier; the overlay is the rollout of what the average
    pooling reads, through every merge, on the image's patches (no CLS)."""
    import numpy as np
    import torch

    from vit.core.inference import input_box, input_shape, preprocess, seen_region
    from vit.explain.methods.stage_maps import rollout_row
    from vit.explain.views.overlay import overlay, write_npz_streamed, write_png

    model, prediction = checkpoint.model, result.prediction
    shape = input_shape(result.image, checkpoint.preprocessing, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    layouts = model.layer_layouts(grid)
    x = preprocess([result.image], checkpoint.preprocessing, size, model.config.patch_size)
    with torch.inference_mode():
        attentions = [a.float().cpu() for a in model.encode(x.to(next(model.parameters()).device),
                                                            output_attentions=True).attentions]
    files = {"npz": folder / f"{stem}.npz", "rollout": folder / f"{stem}_rollout.png"}
    mb = sum(a.numel() for a in attentions) * np.dtype(dtype).itemsize / 2**20
    print(f"{prog}: writing {files['npz']}: {mb:,.1f} MB ({len(attentions)} layers' windows, {dtype})",
          file=sys.stderr, flush=True)
    extra = {}
    if checkpoint.class_names:
        extra = dict(probabilities=prediction.probabilities, logits=prediction.logits,
                     class_names=np.array(checkpoint.class_names))
    for i, lay in enumerate(layouts):
        extra.update({f"layer_{i}_grid": np.array(lay.grid), f"layer_{i}_window": np.array(lay.window),
                      f"layer_{i}_shift": np.array(lay.shift), f"layer_{i}_stride": np.array(lay.stride)})
    write_npz_streamed(files["npz"], ((f"layer_{i}", tuple(a.shape), dtype, [a.numpy().astype(dtype)])
                                      for i, a in enumerate(attentions)), **extra,
                       grid=np.array(grid), patch_size=np.array(model.config.patch_size), prefix_tokens=np.array(0),
                       input_size=np.array(shape),
                       input_box=np.array(input_box(result.image.size, checkpoint.preprocessing, size),
                                          dtype=np.float64))
    seen = seen_region(result.image, checkpoint.preprocessing, size)
    write_png(files["rollout"], overlay(seen, rollout_row(attentions, layouts, -1, None)[0].numpy()))
    return {kind: str(path) for kind, path in files.items()}
