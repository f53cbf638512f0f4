"""A vision-language model's word embeddings, the one language-model tensor the visual logit lens reads.

The lens (``vit.visual_logit_lens``) scores each projected image token against a word's input embedding: the rows
of the language model's ``embed_tokens.weight`` for the word's tokens, as the folder's own tokenizer
(``transformers.AutoTokenizer`` from its ``tokenizer.json`` & co.) splits it. Only those rows are read
(``safe_open(...).get_slice``), from the one shard the index lists for the tensor, so a 7B model's 600 MB
embedding costs a few kilobytes; its size is known from the shard's header before anything is read
(``EmbeddingTable.note``). The rest of the language model is never opened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, CheckpointError, safetensors_shapes
from vit.sources.vlm import import_internvl, import_vlm

# Where the input embedding lives: transformers 5's layout first, then the Hub's older ones (LLaVA, PaliGemma,
# Gemma 3 under language_model.model., Qwen2.5-VL's checkpoints under model.).
EMBEDDING_NAMES = ("model.language_model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                   "language_model.embed_tokens.weight", "model.embed_tokens.weight")
VLM_TYPES = (*import_vlm.ARCHITECTURES, *import_internvl.ARCHITECTURES, "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
             "qwen3_vl_moe")
MAX_WORDS = 64  # as vit.ask's labels: more is a vocabulary scan, not a question about an image
MAX_WORD_TOKENS = 16  # a word or a short phrase; each token is one row read
MAX_WORD_CHARS = 200


class WordEmbeddingError(CheckpointError):
    """A folder whose word embeddings or tokenizer cannot be read; the message says why and what to do."""


@dataclass(frozen=True)
class EmbeddingTable:
    """Where a VLM's input embedding is and how large it is, from its shard's header alone."""

    name: str  # the tensor's name as stored
    shard: Path  # the safetensors file that holds it
    rows: int  # the vocabulary
    width: int  # the language model's width
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.rows * self.width * self.dtype.itemsize

    @property
    def note(self) -> str:
        """What the tensor is, said before any of it is read."""
        return (f"{self.name} in {self.shard.name}: {self.rows:,} x {self.width:,} {str(self.dtype).split('.')[-1]} "
                f"({self.nbytes / 2**20:,.1f} MiB); only the words' rows are read")


def vlm_folder(checkpoint: Checkpoint) -> tuple[Path, dict]:
    """The VLM folder ``checkpoint`` was opened from and its config.json; ValueError (one line) for a model that is
    not a VLM's tower, or one no longer beside its language model (our ``.pt`` of it)."""
    from vit.sources.open import read_json

    if checkpoint.model.projector is None:
        raise ValueError("the visual logit lens reads a vision-language model's projected image tokens, and this model "
                         "has no projector; open a LLaVA, PaliGemma, Gemma 3, InternVL, Qwen2.5-VL or Qwen3-VL folder")
    folder = Path(checkpoint.path) if checkpoint.path is not None else None
    config = folder / "config.json" if folder is not None else None
    if config is None or not folder.is_dir() or not config.is_file():
        raise ValueError(f"the visual logit lens reads the language model's word embeddings from the VLM's own folder, "
                         f"and this tower was opened from {folder}; open the VLM's folder (vit.load(folder))")
    config_json = read_json(config)
    if config_json.get("model_type") not in VLM_TYPES:
        raise ValueError(f"{folder} is a {str(config_json.get('model_type'))[:40]!r} model, not one of the "
                         f"vision-language models the lens reads ({', '.join(VLM_TYPES)})")
    return folder, config_json


def _embedding_entry(folder: Path) -> tuple[str, str]:
    """``(tensor name, shard file)`` of the VLM's input embedding (``EMBEDDING_NAMES``) in ``folder``, from its index
    (or its one safetensors file's header). WordEmbeddingError (one line) when there is none."""
    from vit.sources.files import SourceError
    from vit.sources.weights_files import shard_index

    try:
        index = shard_index(folder)  # its shards are file names beside it, never a path out of the folder
    except SourceError as e:
        raise WordEmbeddingError(str(e)) from None
    if index is not None and index[0].name == "model.safetensors.index.json":
        names: Mapping[str, str] = index[1]
    elif (folder / "model.safetensors").is_file():
        names = dict.fromkeys(safetensors_shapes(folder / "model.safetensors"), "model.safetensors")
    else:
        raise WordEmbeddingError(f"{folder} holds no model.safetensors or model.safetensors.index.json; the word "
                                 "embeddings are read from safetensors files only")
    name = next((n for n in EMBEDDING_NAMES if n in names), None)
    if name is None:
        raise WordEmbeddingError(f"{folder}'s weights hold no language-model embedding (looked for "
                                 f"{', '.join(EMBEDDING_NAMES)})")
    return name, names[name]


def missing_embedding_shard(folder: Path) -> str | None:
    """The shard holding the VLM's input embedding when ``folder`` lacks it (a Hub download for the tower alone
    leaves it on the Hub with the rest of the language model), else None (there, or nothing to say where)."""
    try:
        _, shard = _embedding_entry(folder)
    except (WordEmbeddingError, CheckpointError, OSError, ValueError):
        return None  # embedding_table says why
    return None if (folder / shard).is_file() else shard


def embedding_table(folder: Path) -> EmbeddingTable:
    """The input embedding of the VLM in ``folder`` (``EMBEDDING_NAMES``): its shard from the index, its shape and
    dtype from that shard's header. WordEmbeddingError (one line) when it is not there."""
    name, shard = _embedding_entry(folder)
    path = folder / shard
    if not path.is_file():  # a Hub download brings the tower's shards only
        raise WordEmbeddingError(f"{folder} lacks {shard}, the shard that holds {name}; download that file of the "
                                 "model's repository into the folder")
    meta = safetensors_shapes(path)[name]
    if meta.dim() != 2 or not meta.is_floating_point():
        raise WordEmbeddingError(f"{path.name}'s {name} is a {meta.dim()}-d {meta.dtype} tensor, not a table of "
                                 "word vectors")
    return EmbeddingTable(name, path, int(meta.shape[0]), int(meta.shape[1]), meta.dtype)


def read_rows(table: EmbeddingTable, ids: Sequence[int]) -> torch.Tensor:
    """Rows ``ids`` of the embedding, ``(len(ids), width)`` float32: each read alone from its shard, the table's
    other rows never."""
    from safetensors import safe_open

    rows = {}
    with safe_open(str(table.shard), framework="pt", device="cpu") as f:
        part = f.get_slice(table.name)
        for i in dict.fromkeys(ids):
            rows[i] = part[i:i + 1].float()
    return torch.cat([rows[i] for i in ids])


def tokenizer(folder: Path):
    """The folder's own tokenizer (transformers' ``AutoTokenizer``, offline; files bounded as the text towers')."""
    from vit.sources.vlm.text_tower import TOKENIZER_FILES, _load_tokenizer, _one_line, _tokenizer_version

    if not any(all((folder / name).is_file() for name in names) for names in TOKENIZER_FILES):
        raise WordEmbeddingError(f"{folder} has no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json "
                                 "and merges.txt); copy them from the model's Hub repository into the folder")
    try:
        return _load_tokenizer("transformers", str(folder), _tokenizer_version(folder))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - the libraries raise many types for a missing or broken file
        raise WordEmbeddingError(f"{folder}'s tokenizer cannot be read: {_one_line(e)}") from None


@dataclass(frozen=True)
class Word:
    """A typed word as the language model reads it."""

    text: str
    ids: tuple[int, ...]  # its tokens, without special tokens
    tokens: tuple[str, ...]  # each token as the tokenizer writes it


def encode_words(folder: Path, words: Sequence[str], vocabulary: int) -> list[Word]:
    """``words`` through the folder's tokenizer, without special tokens (a BPE tokenizer reads ``" dog"``, with its
    space, as another token than ``"dog"``: each word is taken exactly as typed). ValueError (one line) for a word
    it gives no token, the unknown token, more than ``MAX_WORD_TOKENS`` tokens or a token outside the table's
    ``vocabulary`` rows."""
    if isinstance(words, str):
        words = [words]
    words = list(words)
    if not words or len(words) > MAX_WORDS:
        raise ValueError(f"give 1 to {MAX_WORDS} words, got {len(words)}")
    from vit.sources.vlm.text_tower import tokenizer_panics_as

    known = tokenizer(folder)
    unknown = getattr(known, "unk_token_id", None)
    encoded = []
    for text in words:
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_WORD_CHARS:
            raise ValueError(f"a word must be text of 1 to {MAX_WORD_CHARS} characters, got {str(text)[:40]!r}")
        with tokenizer_panics_as(WordEmbeddingError, f"the tokenizer of {folder} on {text[:40]!r}"):
            ids = tuple(int(i) for i in known(text, add_special_tokens=False)["input_ids"])
        if not ids or (unknown is not None and unknown in ids):
            raise ValueError(f"the model's tokenizer cannot encode {text[:40]!r} (it gives "
                             f"{'no token' if not ids else 'the unknown token'}); type a word of its vocabulary")
        if len(ids) > MAX_WORD_TOKENS:
            raise ValueError(f"{text[:40]!r} is {len(ids)} tokens, over the {MAX_WORD_TOKENS} a word may have; "
                             "give a word or a short phrase")
        if max(ids) >= vocabulary:
            raise ValueError(f"the tokenizer gives {text[:40]!r} token {max(ids)}, past the {vocabulary:,} rows of "
                             "the word embeddings; the folder's tokenizer is not its language model's")
        encoded.append(Word(text, ids, tuple(known.convert_ids_to_tokens(list(ids)))))
    return encoded


def projector_unit(checkpoint: Checkpoint) -> int:
    """How many patches each projected token spans along each side: 1 (LLaVA, PaliGemma), Gemma 3's pool (4),
    Qwen-VL's merge unit (2), InternVL's pixel-shuffle unit (2)."""
    projector = checkpoint.model.projector
    if projector is None:  # left out (LLaVA reading a list of layers): each patch its own token
        return 1
    return max(1, projector.pool or 0, projector.unit or 0)

