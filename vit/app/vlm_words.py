"""The explorer's words for a vision-language model's tower, without Streamlit: the visual logit lens of typed words
and a word's gradient maps as main-map kinds (the page draws the notebook API's own, ``vit.visual_logit_lens`` and
``vit.explain_word``), and what their captions say (what is scored, the one language-model tensor read and how much).

Typed words are data: they reach the tokenizer as typed and every caption escapes them (Markdown).
"""

from __future__ import annotations

from dataclasses import dataclass

from vit.checkpoint import Checkpoint
from vit.core.text import escape_markdown, file_name_part

# The main map's kinds for a word, as the sidebar names them; a link's ``map=`` takes these keys.
KINDS = {
    "word_lens": "Visual logit lens: where the image tokens point at the word",
    "word_legrad": "LeGrad of the word's lens score",
    "word_class": "Gradient rollout of the word's lens score",
    "word_attnlrp": "AttnLRP of the word's lens score (signed)",
}
# What each is called in a caption, the map's heading and its download's name
TITLES = {"word_lens": "Visual logit lens", "word_legrad": "LeGrad", "word_class": "Gradient rollout",
          "word_attnlrp": "AttnLRP"}
METHODS = {"word_legrad": "legrad", "word_class": "class", "word_attnlrp": "attnlrp"}  # vit.explain_word's methods
SIGNED = ("word_attnlrp",)  # relevance for and against the word: a diverging colour map around 0
CHOICE = "words"  # the sidebar's one "Map" choice for all of KINDS (a second picker names which)
CHOICE_LABEL = "A word: visual logit lens, LeGrad, gradient rollout, AttnLRP"
TARGETS = {"all": "every image token, summed", "patch": "the clicked patch's image token"}


def has_words(model) -> bool:
    """Whether the model is a VLM's tower with its projector: the lens and a word's maps apply (its folder's
    tokenizer and word embeddings are checked when a word is asked)."""
    return getattr(model, "projector", None) is not None


def no_prediction(checkpoint: Checkpoint) -> str | None:
    """The prediction box's text for a VLM's tower, which has no classifier: where its words are asked instead (the
    word lens, with its projector); None for a model that is no VLM's tower (``metadata["tower"]`` says it is)."""
    if not has_words(checkpoint.model):
        return ("No prediction: a vision-language model's tower has no classifier, and its projector is left out "
                "here (its language model reads several layers), so no word lens either. Its attention maps are "
                "shown all the same.") if checkpoint.metadata.get("tower") else None
    return ("No prediction: a vision-language model's tower has no classifier; its language model reads the projected "
            "image tokens. To ask what they say, type words under “Ask in words” below the image and pick “A word” as "
            "the sidebar's map: where the image tokens point at each word (the visual logit lens), or a gradient map "
            "of that score. The attention maps are shown all the same.")


def controls(kind: str, target: str) -> tuple[str, ...]:
    """The sidebar controls word map ``kind`` reads: the word, the target of the gradient maps (gradient rollout
    draws one token's row: always the clicked patch's), and the query patch where the target is one token."""
    if kind == "word_lens":
        return ("word",)
    if kind == "word_class":
        return ("word", "query")
    return ("word", "target", "query") if target == "patch" else ("word", "target")


def split_words(text: str, space: bool = False) -> list[str]:
    """'dog, cat; red sky' -> ['dog', 'cat', 'red sky'] (commas, semicolons or line breaks; checked as the CLIP
    labels are), each after a space with ``space`` (a BPE tokenizer reads " dog", the word inside a sentence,
    as another token than "dog")."""
    from vit.sources.vlm.text_tower import split_labels

    return [" " + w if space else w for w in split_labels(text)]


def patch_target(query: int, num_prefix_tokens: int) -> int:
    """The patch (row-major) of query token ``query``; ValueError (one line) for a prefix token, which the projector
    does not read."""
    if query < num_prefix_tokens:
        raise ValueError("the target is the clicked patch's image token, and the query is a prefix token (CLS), which "
                         "the projector leaves out: click a patch, or take every image token as the target")
    return query - num_prefix_tokens


@dataclass(frozen=True)
class Embedding:
    """The language model's input embedding as its shard's header gives it (nothing of it read)."""

    name: str
    shard: str
    rows: int
    width: int
    dtype: str
    itemsize: int

    @property
    def what(self) -> str:
        """'model.language_model.embed_tokens.weight (151,936 × 3,584 bfloat16, 1,039.0 MiB, in
        model-00002.safetensors)', as Markdown."""
        total = self.rows * self.width * self.itemsize
        return (f"{escape_markdown(self.name)} ({self.rows:,} × {self.width:,} {self.dtype}, {_bytes(total)}, in "
                f"{escape_markdown(self.shard)})")

    def note(self, rows_read: int) -> str:
        """``what``, then ', of which 2 rows were read (14.0 KiB)'."""
        read = rows_read * self.width * self.itemsize
        return (f"{self.what}, of which {rows_read} row{'s' if rows_read != 1 else ''} "
                f"{'were' if rows_read != 1 else 'was'} read ({_bytes(read)})")


def _bytes(n: int) -> str:
    return f"{n:,} bytes" if n < 2**10 else f"{n / 2**10:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def embedding(checkpoint: Checkpoint) -> Embedding:
    """Where the lens reads its one LM tensor, from the folder's index and the shard's header; ValueError or
    CheckpointError (one line): not a VLM's folder, no embedding, its shard missing."""
    from vit.sources.vlm import word_embeddings

    folder, _ = word_embeddings.vlm_folder(checkpoint)
    table = word_embeddings.embedding_table(folder)
    return Embedding(table.name, table.shard.name, table.rows, table.width, str(table.dtype).split(".")[-1],
                     table.dtype.itemsize)


def unit_phrase(checkpoint: Checkpoint) -> str:
    """What one image token covers: 'one patch', 'the 2×2 patches of its merge unit' (Qwen-VL), 'the 4×4 patches its
    average pool reads' (Gemma 3)."""
    from vit.sources.vlm.word_embeddings import projector_unit

    unit = projector_unit(checkpoint)
    if unit == 1:
        return "one patch"
    return (f"the {unit}×{unit} patches of its merge unit" if checkpoint.model.projector.unit
            else f"the {unit}×{unit} patches its average pool reads")


def _tokens(word_map) -> str:
    tokens = ", ".join(f"“{escape_markdown(t)}” ({i})" for t, i in zip(word_map.tokens, word_map.token_ids,
                                                                       strict=True))
    return f"token {tokens}" if len(word_map.token_ids) == 1 else f"tokens {tokens}, their embeddings averaged"


def describe(kind: str, word_map, table: Embedding, checkpoint: Checkpoint, target: str | None = None,
             patch_label: str | None = None, tokens: int = 0) -> str:
    """The main map's caption for word map ``kind`` of ``word_map`` (``vit.visual_logit_lens``'s), as Markdown (the
    word and its tokens escaped): what is scored, the LM tensor read and how much of it. ``target`` "patch" (with
    ``patch_label``, e.g. 'patch row 2, col 3') or "all" (``tokens`` image tokens) for the gradient maps."""
    word = escape_markdown(word_map.word)
    covers = unit_phrase(checkpoint)
    scored = (f"the dot product of the projected image token (the projector's output: the vector the language model "
              f"reads for that part of the image, each covering {covers}) with the word's input embedding ("
              f"{_tokens(word_map)}): the logit the word gets from that token through a head tied to the input "
              "embedding, before any layer of the language model")
    read = f"The one language-model tensor read: {table.note(len(set(word_map.token_ids)))}."
    if kind == "word_lens":
        return f"**{TITLES[kind]} of “{word}”**: each patch holds {scored}. {read}"
    where = (f"at the image token over the {patch_label} (outlined; it covers {covers}; click another patch on the "
             "image, or pick it as the Query token in the sidebar, to explain the score there)" if target == "patch"
             or kind == "word_class" else f"summed over all {tokens:,} image tokens")
    how = {
        "word_legrad": "LeGrad: the score's gradient with respect to each layer's attention, positive parts averaged "
                       "over heads and queries, summed over the layers (Bousselham et al., 2024)",
        "word_class": "gradient rollout: each layer's attention weighted by the score's gradient, positive parts "
                      "averaged over heads, rolled out from the identity (Chefer et al., 2021b); the row of the "
                      "target token",
        "word_attnlrp": "AttnLRP relevance of the score, summed per patch (Achtibat et al., 2024): red for, blue "
                        "against",
    }[kind]
    return (f"**{TITLES[kind]} of “{word}”'s lens score**, {where}: {how}. The tower is read as a classifier whose "
            f"one logit is that score: {scored}. {read}")


def file_name(stem: str, kind: str, word: str, patch: int | None) -> str:
    """'photo-word_lens-dog-overlay.png', '…-word_legrad-dog-p7-overlay.png': the download names the word."""
    parts = [stem, kind, file_name_part(word) or "word"] + ([f"p{patch}"] if patch is not None else [])
    return "-".join([*parts, "overlay.png"])
