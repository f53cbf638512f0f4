"""TextSpan over a set of images, for the explorer's Mechanism section, ``vit.textspan`` and ``vit.describe_heads``:
a CLIP's late heads described by the texts of a bank (``vit.explain.mechanism.textspan``), and one head's map of an
image in a text's direction. Plain functions; the page caches them. The texts are embedded by ``encode``, the model's
own text tower's (``vit.sources.vlm.text_tower.open_text_tower(checkpoint).encode``), which the caller opens."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, preprocess
from vit.core.progress import in_parts
from vit.explain.mechanism import textspan

BATCH = 16  # images per forward


def check_model(checkpoint: Checkpoint) -> None:
    """``MechanismError`` in one line unless TextSpan applies (a CLIP, or a SigLIP's probe); its text tower is the
    caller's to open (``TextTowerError`` there)."""
    textspan.check_supported(checkpoint.model)


def head_outputs(checkpoint: Checkpoint, images: Iterable[Image.Image], layers: Sequence[int], count: int,
                 progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """``(N, len(layers), H, E)``: each head's direct share of each image's embedding (``count`` images, each at the
    model's own size), ``BATCH`` at a time; the bound is checked before the first forward."""
    model = checkpoint.model
    textspan.check_outputs_fit(model, count, layers)
    device = next(model.parameters()).device
    parts, batch, done = [], [], 0

    def run() -> None:
        nonlocal done
        x = preprocess(batch, checkpoint.preprocessing, TRAINING_SIZE, model.config.patch_size).to(device)
        outputs = textspan.probe_head_outputs(model, x) if textspan.reads_probe(model) else \
            textspan.head_outputs(model, x, layers)
        parts.append(outputs.float().cpu())
        done += len(batch)
        batch.clear()
        if progress is not None:
            progress(done, count)

    for image in images:
        batch.append(image)
        if len(batch) == BATCH:
            run()
    if batch:
        run()
    if not parts:
        raise textspan.MechanismError("TextSpan needs images to describe the heads over; none were given")
    return torch.cat(parts)


def text_features(encode: Callable, texts: Sequence[str],
                  progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """``(M, E)`` the bank's L2-normalised embeddings by ``encode``, the checkpoint's own text tower's
    (``TextTower.encode``, which asks ``progress`` again after each text it tokenizes)."""
    return textspan.encode_texts(encode, texts, progress)


def describe(outputs: torch.Tensor, layers: Sequence[int], features: torch.Tensor, texts: Sequence[str],
             texts_per_head: int = textspan.TEXTS_PER_HEAD, rank: int = textspan.RANK, probe: bool = False
             ) -> list[textspan.HeadSpan]:
    """Every head's texts and variance explained (``vit.explain.mechanism.textspan.describe_heads``)."""
    return textspan.describe_heads(outputs, layers, features, texts, texts_per_head, rank, probe)


def head_map(checkpoint: Checkpoint, image: Image.Image, layer: int, head: int, direction: torch.Tensor,
             size: InputSize = TRAINING_SIZE) -> np.ndarray:
    """``(gh, gw)``: what head ``head`` of layer ``layer`` writes into ``image``'s embedding from each patch, along
    ``direction`` (a text's embedding, ``(E,)``): the paper's per-head image map."""
    model = checkpoint.model
    device = next(model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing, size, model.config.patch_size).to(device)
    if textspan.reads_probe(model):
        terms = textspan.probe_token_contributions(model, x)[0, head]  # (T, D)
    else:
        terms = textspan.token_contributions(model, x, layer)[0, head]  # (T, E)
    grid = model.patch_grid(x.shape[2], x.shape[3])
    values = terms[model.num_prefix_tokens:] @ direction.to(terms)  # (gh*gw,)
    return values.reshape(grid).float().cpu().numpy()


def run(checkpoint: Checkpoint, encode: Callable, images: Iterable[Image.Image], count: int, texts: Sequence[str],
        layers: int, texts_per_head: int, rank: int | None = None, progress: Callable[[int, int], None] | None = None
        ) -> tuple[list[textspan.HeadSpan], dict[str, torch.Tensor]]:
    """The whole of TextSpan, every request checked first: the last ``layers`` layers' heads (a SigLIP's: its
    pooling probe's) described over the ``count`` ``images`` by ``texts``, and the chosen texts' embeddings (for
    ``head_map``). ``rank`` None: the authors' (80 for a CLIP; the width for a probe, as compute_siglip.py).
    ``progress`` counts the images run, then the texts encoded (asked again after each text is tokenized)."""
    check_model(checkpoint)
    model = checkpoint.model
    probe = textspan.reads_probe(model)
    if rank is None:
        rank = model.config.hidden_size if probe else textspan.RANK
    textspan.check_texts(texts)  # before any text reaches the tokenizer: a list given to vit.textspan too
    textspan.check_request(count, len(texts), texts_per_head, rank)
    chosen = [len(model.blocks)] if probe else textspan.late_layers(model, layers)
    textspan.check_outputs_fit(model, count, [len(model.blocks) - 1] if probe else chosen)
    on_images, on_texts = in_parts(progress, [count, len(texts)])
    outputs = head_outputs(checkpoint, images, chosen, count, on_images)
    features = text_features(encode, texts, on_texts)
    spans = describe(outputs, chosen, features, texts, texts_per_head, rank, probe)
    index = {t: i for i, t in enumerate(texts)}
    return spans, {t: features[index[t]] for s in spans for t in s.texts}
