"""Words and vision-language models: a CLIP's or SigLIP's zero-shot answer and its maps (``vit.ask``), a VLM's
visual logit lens and the gradient maps of a word's lens score, a VLM's answer to a question (``vit.ask_vlm``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.api.arguments import ImageLike, checked_index, input_size, pil_image, save_as
from vit.api.maps import Explanation, explain_image
from vit.checkpoint import Checkpoint
from vit.core.inference import InputSize, input_box, seen_region
from vit.core.text import plain_text
from vit.costs import fits
from vit.explain.language import words
from vit.explain.language.vlm_answer import VLMAnswer

# -- CLIP and SigLIP: typed labels ------------------------------------------------------------------------------------

@dataclass
class Answer:
    """A CLIP's, SigLIP's or dino.txt's answer for typed labels: ``scores`` (label -> probability: a softmax over
    the labels for CLIP and dino.txt, each label's own sigmoid for SigLIP) and ``explain(label, method)`` for its
    map."""

    checkpoint: Checkpoint
    image: Image.Image
    size: InputSize
    answer: words.Answer

    @property
    def scores(self) -> dict[str, float]:
        """Label -> probability, most probable first."""
        return dict(self.answer.ranked())

    def explain(self, label: str | int, method: str = "legrad") -> Explanation:
        """The map of ``label`` (typed text or its index) by ``method`` (``rollout``, ``legrad``, ``attnlrp``,
        ``grad_eclip``, ``sclip``, ``naclip``, ``clearclip``, ``maskclip``, ``clipsurgery``; a dino.txt's
        ``dinotxt``; of a tower opened on the library road, the road's class maps of the label's logit: ``class``,
        ``legrad``, the CAMs, captum's, ``rise``; where each applies: ``vit.ask_methods(checkpoint)``)."""
        labels = self.answer.labels
        index = label if isinstance(label, int) else labels.index(label) if label in labels else -1
        if not 0 <= index < len(labels):
            raise ValueError(f"{label!r} is not one of the labels asked: {', '.join(labels)}")
        map2d = words.word_map(self.checkpoint, self.answer, self.image, index, method, self.size)
        model = self.checkpoint.model
        p = self.checkpoint.preprocessing
        grid = (map2d.shape[0], map2d.shape[1])
        return Explanation(method, map2d, self.image, seen_region(self.image, p, self.size),
                           input_box(self.image.size, p, self.size), grid, model.num_prefix_tokens, None,
                           labels[index],
                           description=plain_text(words.describe_method(method, labels[index],
                                                                        kind=self.answer.prompts.kind)))

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(f"<tr><td>{escape(label)}</td><td>{p:.1%}</td></tr>" for label, p in self.scores.items())
        return f"<table>{rows}</table>"


def ask(checkpoint: Checkpoint, image: ImageLike, labels: Sequence[str] | str, template: str | None = None,
        *, size: int | InputSize | None = None) -> Answer:
    """Ask a CLIP, SigLIP or DINOv3 with dino.txt which of ``labels`` (a list, or one string separated by commas,
    semicolons or line breaks) ``image`` shows: each label filled into ``template`` (default "a photo of a {}.";
    "{}" uses the labels as typed; "imagenet" averages open_clip's 80 ImageNet templates). The text side comes from
    the model's own library (its tokenizer and text transformer, beside the weights; dino.txt's from open_clip's,
    built to its shape). An open_clip tower opened on the library road (SigLIP 2's and PE-Core's timm trunks, CoCa)
    is asked through its own image embedding, as open_clip's ``encode_image`` gives it."""
    from vit.explain.language.prompts import DEFAULT_TEMPLATE
    from vit.sources.vlm.text_tower import check_labels, open_text_tower, split_labels

    labels = split_labels(labels) if isinstance(labels, str) else check_labels(list(labels))
    ensemble = template is not None and template.strip().lower() == words.ENSEMBLE
    templates = words.templates_for(template or DEFAULT_TEMPLATE, ensemble)
    image, size = pil_image(image), input_size(size)
    return Answer(checkpoint, image, size, words.answer(checkpoint, open_text_tower(checkpoint), image, labels,
                                                        templates, size))


def ask_methods(checkpoint: Checkpoint) -> dict[str, str]:
    """The map methods ``Answer.explain`` offers for this CLIP / SigLIP / dino.txt."""
    return words.methods(checkpoint.model)


# -- vision-language models: the visual logit lens ----------------------------------------------------------------

@dataclass
class WordMap(Explanation):
    """The visual logit lens of one word: ``map (rows, cols)`` on the patch grid, each patch holding the score of
    the projected token whose unit covers it (Qwen-VL's and InternVL's 2 x 2, Gemma 3's 4 x 4 patches share one);
    ``units`` the scores on the projector's own grid, one per image token the language model reads."""

    word: str = ""
    tokens: tuple[str, ...] = ()  # the word's tokens as the tokenizer writes them
    token_ids: tuple[int, ...] = ()
    units: np.ndarray | None = field(default=None, repr=False)  # (rows / unit, cols / unit)
    embedding: str = ""  # which LM tensor was read, and its size

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the overlay; ``.npz``: ``map``, ``units``, ``word``, ``token_ids``."""
        return save_as(path, self.overlay(), {"map": self.map, "units": self.units, "word": np.str_(self.word),
                                              "token_ids": np.array(self.token_ids, dtype=np.int64)})


LENS_TARGET_METHODS = ("legrad", "class", "attnlrp")  # the gradient maps a word's lens score is a target of


def _lens_words(checkpoint: Checkpoint, image: ImageLike, words: str | Sequence[str], size: int | InputSize | None):
    """What the lens needs of a VLM folder, in order of cost: the embedding's place and size (its shard's header),
    the words' tokens, the input's grid checked against the memory bound, then the words' rows read."""
    from vit.core.inference import input_shape
    from vit.sources.vlm import word_embeddings

    folder, _ = word_embeddings.vlm_folder(checkpoint)
    table = word_embeddings.embedding_table(folder)  # from the shard's header: its size known before a row is read
    model = checkpoint.model
    if table.width != model.config.projector_dim:
        raise word_embeddings.WordEmbeddingError(
            f"{table.name} is {table.width} wide and the projector gives {model.config.projector_dim}; the folder's "
            "language model is not the one its projector feeds")
    encoded = word_embeddings.encode_words(folder, words, table.rows)
    image, size = pil_image(image), input_size(size)
    shape = input_shape(image, checkpoint.preprocessing, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    # the lens is one forward without a graph, within the analysis's path in chunks (its states every k-th layer)
    fits.check_input_fits(checkpoint, grid, f"A {shape[1]}×{shape[0]} px input", chunks=True)
    rows = word_embeddings.read_rows(table, [i for w in encoded for i in w.ids])  # (tokens, E)
    vectors = torch.stack([r.mean(0) for r in rows.split([len(w.ids) for w in encoded])])  # (W, E)
    return image, size, grid, table, encoded, vectors


def visual_logit_lens(checkpoint: Checkpoint, image: ImageLike, words: str | Sequence[str],
                      size: int | InputSize | None = None) -> list[WordMap]:
    """Where in ``image`` a vision-language model's image tokens point at each of ``words``, without running its
    language model: each projected token's (``ViT.project``, HF ``get_image_features``) dot product with the word's
    input embedding, a row of the LM's ``embed_tokens.weight``, the one LM tensor read (only the words' rows; its
    size is in ``.embedding``). A word is tokenised as typed by the folder's own tokenizer, without special tokens
    (BPE tokenizers read ``" dog"`` and ``"dog"`` apart); a word of several tokens scores by the mean of their
    embeddings, which is the mean of their maps. ``checkpoint`` is a LLaVA, PaliGemma, Gemma 3, InternVL, Qwen2.5-VL
    or Qwen3-VL folder opened by ``vit.load``. One ``WordMap`` per word, in order; ValueError or CheckpointError in one
    line (not a VLM, a word the tokenizer cannot encode, a folder without its tokenizer or embedding)."""
    from vit.core.inference import preprocess
    from vit.explain.methods.visual_lens import leading_rows, lens_maps
    from vit.sources.vlm import word_embeddings

    image, size, grid, table, encoded, vectors = _lens_words(checkpoint, image, words, size)
    model, p = checkpoint.model, checkpoint.preprocessing
    device = next(model.parameters()).device
    x = preprocess([image], p, size, model.config.patch_size).to(device)  # (1, C, H, W)
    unit, lead = word_embeddings.projector_unit(checkpoint), leading_rows(model)
    with torch.inference_mode():
        projected = model.project(model.tokens(x)[0], grid)[0].float()  # (lead + N, E), units row-major
        maps = lens_maps(projected, vectors.to(device), grid, unit, lead).cpu().numpy()  # (W, gh, gw)
    seen, box = seen_region(image, p, size), input_box(image.size, p, size)
    # LLaVA's "full" strategy: the CLS's projection is an image token too, though no patch's
    kept = "; the CLS's image token, which the language model reads too, covers no patch" if lead else ""
    results = []
    for word, map2d in zip(encoded, maps, strict=True):
        how = f"the mean of its {len(word.ids)} tokens' embeddings" if len(word.ids) > 1 else "its embedding"
        results.append(WordMap(
            "visual_lens", map2d.astype(np.float32), image, seen, box, grid, model.num_prefix_tokens,
            target=word.text, query=-1,
            description=(f"visual logit lens of {word.text!r} ({' '.join(word.tokens)}): each image token's dot "
                         f"product with {how}{kept}"),
            settings={"method": "visual_lens", "word": word.text}, word=word.text, tokens=word.tokens,
            token_ids=word.ids, units=map2d[::unit, ::unit].copy(), embedding=table.note))
    return results


def explain_word(checkpoint: Checkpoint, image: ImageLike, word: str, method: str = "legrad", *,
                 patch: int | None = None, size: int | InputSize | None = None) -> Explanation:
    """A gradient map of a VLM's tower whose target is ``word``'s visual logit lens score (``visual_logit_lens``):
    at the projected token that covers patch ``patch`` (row-major on the patch grid; the merge unit under it in
    Qwen-VL, InternVL and Gemma 3), or summed over every projected token (None). ``method``: ``legrad``, ``class``
    (gradient rollout: the row of ``patch``'s token) or ``attnlrp``, each run as for a classifier whose one logit is
    that score (through Qwen2.5-VL's windows, each placed by its window index). ValueError or CheckpointError in
    one line."""
    from vit.explain.methods.visual_lens import leading_rows
    from vit.explain.methods.vlm_targets import lens_model, unit_of_patch
    from vit.sources.vlm import word_embeddings

    if method not in LENS_TARGET_METHODS:
        raise ValueError(f"a word's lens score is a target of {', '.join(LENS_TARGET_METHODS)}, not {method!r}")
    if not isinstance(word, str):
        raise ValueError(f"give one word (a string), got a {type(word).__name__}; vit.visual_logit_lens maps several")
    if method == "class" and patch is None:
        raise ValueError("gradient rollout draws one token's row: give the patch whose image token is the target "
                         "(patch=...), or use legrad or attnlrp for every token")
    image, size, grid, _, [encoded], vectors = _lens_words(checkpoint, image, [word], size)
    unit = word_embeddings.projector_unit(checkpoint)
    units = None
    if patch is not None:  # its unit's row, after the prefix tokens the projector keeps (LLaVA "full": the CLS)
        count = grid[0] * grid[1]
        units = torch.tensor([unit_of_patch(checked_index(patch, count, "patch", f"this input has {count} patches"),
                                            grid, unit) + leading_rows(checkpoint.model)])
    wrapped = replace(checkpoint, model=lens_model(checkpoint.model, vectors, grid, units), class_names=[word],
                      training_state=None)
    query = None if method != "class" else patch % (grid[0] * grid[1]) + checkpoint.model.num_prefix_tokens
    shown = explain_image(wrapped, image, method, target=0, query=query, size=size)  # a tower sees images
    spans = f" ({unit}x{unit} patches)" if unit > 1 else ""
    where = ("summed over every image token" if units is None
             else f"at the image token over patch {patch % (grid[0] * grid[1])}{spans}")
    shown.description = f"{shown.description} Target: the visual logit lens score of {word!r} {where}."
    shown.target, shown.prediction = word, None
    return shown


def open_vlm(model: str | os.PathLike | Checkpoint, device: str | torch.device | None = None, *,
             pan_and_scan: bool = False, device_map: str | dict | None = None, max_memory: dict | None = None,
             offload_folder: str | os.PathLike | None = None, dtype: str = "auto"):
    """A vision-language model opened whole from its folder, its Hub id (``org/name[@revision]``: the HF cache's
    snapshot, downloaded whole when it is not there, its size checked first) or ``vit.load``'s checkpoint of its
    tower opened from a folder, to ask it questions (``ask_vlm``): transformers' own model class and processor, no
    remote code. Open it once and
    ask it many times; VLMError (one line) for a folder that cannot be. ``pan_and_scan``: Gemma 3's processor cuts
    a long image into crops, each its own image beside the whole one (its maps on the crops' canvas, the whole as
    the overview); VLMError for another family. ``device_map`` ("auto" or a dict of module names to devices, "cpu"
    or "disk"), ``max_memory``, ``offload_folder``: a model too large for one device, placed by accelerate across
    the GPUs present and offloaded to CPU or disk, each layer run where it lives (the maps are the same as in one
    place); ``dtype``: "auto" (the weights' own), "float32", "bfloat16" or "float16"."""
    from vit.sources.vlm.whole_vlm import open_whole_vlm

    return open_whole_vlm(model, device, pan_and_scan, device_map=device_map, max_memory=max_memory,
                          offload_folder=offload_folder, dtype=dtype)


def ask_vlm(model, image: ImageLike | None = None, question: str | None = None, *, prompt: str | None = None,
            max_new_tokens: int = 32, on_token=None, video=None, frames: int = 8,
            fps: float | None = None) -> VLMAnswer:
    """A vision-language model's greedy answer to ``question`` about ``image`` (through its processor's chat
    template; ``prompt=`` instead: raw text with the model's image placeholder, the template bypassed), token for
    token transformers' ``generate``. ``model``: ``open_vlm``'s model, or a folder / ``vit.load`` checkpoint opened
    for this call. Returns a ``VLMAnswer``: ``.tokens``, ``.text``, ``.pieces`` and ``.attention(i, layer,
    head=None)``, answer token ``i``'s attention to the image tokens on the tower's patch grid (heads averaged when
    ``head`` is None) from the query that predicted it, computed from the KV cache when asked. What it holds is
    counted first and refused in one line over the memory bound (VIT_ANALYSIS_MEMORY_MB). ``on_token(tokens, text)``:
    given the answer so far (its ids and text) as each token is chosen, to stream it. ``image`` a list: a question
    about several images in order (each read in one view, or Qwen-VL's and GLM's grids), each answer token's map on
    each (``attention(i, layer, image=k)``, ``image_share(i, layer, image=k)``). ``video``: a question about a clip
    instead (a video file, a GIF, a folder of frames or a list of PIL images; ``frames`` sampled uniformly, as the
    explorer's clips are, a shorter clip's frames each once, never repeated; a video file's frames keep their times,
    which the processor writes into the prompt), for the families ``vlm_layouts.CLIP_FAMILIES`` names (Qwen2-VL to
    Qwen3.5, GLM-4.1V, LLaVA-NeXT-Video and OneVision, InternVL, SmolVLM, Molmo 2): each temporal slice's map
    (``attention(i, layer, image=k)``, Qwen's and GLM's slices two frames deep). ``fps``: the frames per second of a
    clip whose file does not say (a folder, a zip or a list of frames), so its frames keep their times too; a video
    file's own rate is not overridden. What the processor makes of the frames is counted before it runs
    (``vit.costs.processors``)."""
    from vit.core.clips import at_rate, check_fps, read_clip
    from vit.explain.language.vlm_answer import MAX_CLIP_FRAMES, MAX_IMAGES, answer

    if video is not None:
        if image is not None:
            raise ValueError("ask about an image or a video, not both")
        if isinstance(frames, bool) or not isinstance(frames, int) or not 1 <= frames <= MAX_CLIP_FRAMES:
            raise ValueError(f"frames must be a whole number from 1 to {MAX_CLIP_FRAMES}, got {frames!r}")
        if fps is not None:
            check_fps(fps)  # before the clip is read
        # with a video's times, which the model's prompt may write; a shorter clip's frames each once, never repeated
        clip = at_rate(read_clip(video, frames, once=True), fps)  # the explorer's clip upload takes the same path
        return answer(open_vlm(model), None, question, prompt=prompt, max_new_tokens=max_new_tokens,
                      on_token=on_token, clip=clip)
    if fps is not None:
        raise ValueError("fps= is the rate of a clip: ask about one with video=")
    if image is None:
        raise ValueError("give an image (or several) or video= to ask about")
    if isinstance(image, (list, tuple)) and not 1 <= len(image) <= MAX_IMAGES:  # before any is read
        raise ValueError(f"ask about 1 to {MAX_IMAGES} images at once, got {len(image)}")
    images = [pil_image(one) for one in image] if isinstance(image, (list, tuple)) else pil_image(image)
    return answer(open_vlm(model), images, question, prompt=prompt, max_new_tokens=max_new_tokens,
                  on_token=on_token)
