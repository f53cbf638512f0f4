"""The text side of CLIP, SigLIP and dino.txt: the model's own tokenizer and text transformer, from its own library
(dino.txt's, whose library is not installable, from open_clip's ``TextTransformer`` built to its shape).

The image tower is ours (``vit.sources.ports.families.import_clip`` / ``import_siglip``), so every map walks our
modules; a text embedding is a constant for the image side's gradients, so it is computed exactly
by the library that defines it: ``transformers`` for HF ``CLIPModel`` / ``SiglipModel`` folders
(``get_text_features`` after the folder's own tokenizer), ``open_clip`` for open_clip weights
(``encode_text`` after its bundled BPE tokenizer, or the one ``open_clip_config.json`` names).
Nothing is downloaded: tokenizer files come from the model's folder or the library's bundled
vocabulary, and a folder without them gets one line saying what is missing.

How a label's score is read, after both embeddings are L2-normalised (``cos`` below):

- CLIP (``kind="softmax"``): ``logit = exp(logit_scale) * cos``, probabilities a softmax over the labels;
- SigLIP (``kind="sigmoid"``): ``logit = exp(logit_scale) * cos + logit_bias``, each label's probability its
  own sigmoid (SigLIP was trained with a per-pair sigmoid loss, so the labels do not compete).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from vit.checkpoint import Checkpoint, CheckpointError
from vit.sources.files import BPE_VOCABULARY, auxiliary_problem, library_error_line, quiet_transformers, read_bounded

MAX_LABELS = 64  # a prompt list beyond this is a dataset: use vit.evaluate --zero-shot
MAX_LABEL_CHARS = 200  # as class names; CLIP reads 77 tokens, SigLIP 64: longer text is truncated anyway
MAX_DATASET_CLASSES = 21843  # vit.evaluate --zero-shot: ImageNet-21k's classes at most
MAX_TEXT_PARAMETERS = 2_000_000_000  # the largest published text towers (ViT-bigG's, SigLIP 2 g's) hold ~0.7-1.1 B
CACHE_ENTRIES = 4096  # text embeddings kept per tower (a ViT-L embedding is 3 kB)


class TextTowerError(CheckpointError):
    """A model whose text side cannot be opened; the message says why and what to do."""


@dataclass
class TextTower:
    """A model's text encoder and the scale (and bias) its image-text logits use."""

    kind: str  # "softmax" (CLIP) or "sigmoid" (SigLIP)
    logit_scale: float  # exp(logit_scale) of the model: the factor on the cosine
    logit_bias: float  # SigLIP's bias; 0 for CLIP
    library: str  # "transformers" or "open_clip": who computes the embedding
    # (texts, between) -> (n, E) unnormalised features; between() after each text is tokenized (see encode)
    encode_batch: Callable[[list[str], Callable[[], None] | None], Tensor]
    _cache: dict[str, Tensor] = field(default_factory=dict, repr=False)
    # dino.txt: the embedding's last this many channels are aligned with the patch tokens, its first with CLS
    patch_channels: int = 0

    def encode(self, texts: Sequence[str], between: Callable[[], None] | None = None) -> Tensor:
        """``(n, E)`` float32 L2-normalised text embeddings, one per text; cached per text. ``between()`` is called
        after each text is tokenized: a long computation's stop check (it may raise), which so reaches inside a
        batch (open_clip's Python tokenizer takes its time over a long text)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            with torch.inference_mode():
                features = self.encode_batch(missing, between).float()
            features = features / features.norm(dim=-1, keepdim=True)
            if len(self._cache) + len(missing) > CACHE_ENTRIES:
                self._cache.clear()
            self._cache.update(zip(missing, features.unbind(0), strict=True))
        return torch.stack([self._cache[t] for t in texts]) if texts else torch.zeros(0)


# -- transformers ---------------------------------------------------------------------------------------------------

# transformers 5 builds a tokenizer with an empty vocabulary from config.json alone: require the files.
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("spiece.model",), ("tokenizer.model",))
_HF_TEXT = {"hf:CLIPModel": ("CLIPModel", "softmax"), "hf:MetaClip2Model": ("MetaClip2Model", "softmax"),
            "hf:SiglipModel": ("SiglipModel", "sigmoid"),
            "hf:Siglip2Model": ("Siglip2Model", "sigmoid")}


def _offline():
    """Nothing is downloaded while a tower opens: the libraries may only read local files (a request is refused in
    this thread alone; ``hub_network.local_only`` says why not ``HF_HUB_OFFLINE``)."""
    from vit.sources.hub_network import local_only

    return local_only("opening a text tower")


def _one_line(error: BaseException) -> str:
    """The error on one line, with its reason: torch's 'Error(s) in loading state_dict for CLIP:' says why only
    on the lines after it."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = " ".join(lines) if lines and lines[0].endswith(":") else lines[0] if lines else type(error).__name__
    return text if len(text) <= 400 else text[:400] + "…"


def is_rust_panic(error: BaseException) -> bool:
    """Whether ``error`` is a Rust library's panic (pyo3's ``PanicException``, which ``tokenizers`` raises for a
    ``tokenizer.json`` whose pre-tokenizer regex backtracks past Oniguruma's retry limit): a ``BaseException``, so
    ``except Exception`` lets it through."""
    return type(error).__name__ == "PanicException" and type(error).__module__ == "pyo3_runtime"


@contextlib.contextmanager
def tokenizer_panics_as(error: Callable[[str], Exception], what: str):
    """A Rust panic inside the block (``is_rust_panic``) raised as ``error`` in one line, ``what`` saying whose
    tokenizer failed on what; any other exception passes as it is."""
    try:
        yield
    except BaseException as e:
        if not is_rust_panic(e):
            raise
        raise error(f"{what} failed ({_one_line(e)}): its tokenizer.json is damaged or not the model's (a "
                    "pre-tokenizer pattern that backtracks); copy it again from the model's Hub repository") from None


def _tokenize_each(tokenize: Callable[[str], object], texts: Sequence[str], between: Callable[[], None] | None,
                   folder: str) -> list:
    """``tokenize(text)`` for each text, ``between()`` after each (a stop check), a Rust panic as TextTowerError."""
    out = []
    for text in texts:
        with tokenizer_panics_as(TextTowerError, f"the tokenizer of {folder} on {text[:40]!r}"):
            out.append(tokenize(text))
        if between is not None:
            between()
    return out


def check_declared_layers(config: Mapping, origin: str) -> None:
    """TextTowerError (one line) when a config (config.json, open_clip's ``model_cfg``) declares more layers in all
    than any model this program opens (``hub.MAX_CONFIG_LAYERS``): even on the meta device, building a declared
    model takes ~3.5 ms a layer (CLIP's text model, measured over 5,000: a million would hold a core ~1 hour), so
    they are counted first (issue 95)."""
    from vit.sources.hub import MAX_CONFIG_LAYERS, _layer_count

    layers = _layer_count(config)
    if layers > MAX_CONFIG_LAYERS:
        raise TextTowerError(f"{origin} declares {layers:,} layers in all, more than any model this program opens "
                             f"({MAX_CONFIG_LAYERS:,}); its config is not that of a published model")


def check_declared_model(skeleton: torch.nn.Module, state: Mapping[str, Tensor], vision_prefix: str,
                         origin: str) -> None:
    """Refuse a model before any memory is allocated for it: ``skeleton`` is the model its config declares, built on
    the meta device, ``state`` the weights file's tensors (shapes are enough). TextTowerError (one line) when the
    declared text side (every tensor not under ``vision_prefix``) is over ``MAX_TEXT_PARAMETERS``, or a declared
    tensor is not in the file at the same shape: building it would allocate what the file does not hold."""
    declared = skeleton.state_dict()
    text = sum(t.numel() for name, t in declared.items() if not name.startswith(vision_prefix))
    if text > MAX_TEXT_PARAMETERS:
        raise TextTowerError(f"{origin} declares a text tower of {text:,} parameters, over the {MAX_TEXT_PARAMETERS:,} "
                             "this program opens; its config is not that of a published model")
    wrong = [name for name, t in declared.items() if name not in state or state[name].shape != t.shape]
    if wrong:
        name = wrong[0]
        held = f"holds {tuple(state[name].shape)}" if name in state else "does not hold it"
        raise TextTowerError(f"{origin} declares {name} of shape {tuple(declared[name].shape)} but the weights file "
                             f"{held} ({len(wrong)} tensor(s) differ): the config does not describe these weights")


TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def _tokenizer_version(folder: Path) -> tuple:
    """The folder's tokenizer files as (name, size, mtime), each within its bound (``files.AUXILIARY_FILES``:
    ``MAX_TOKENIZER_BYTES`` for the tokenizer's own). A tokenizer is read once per version of them."""
    names = tuple(sorted({name for names in TOKENIZER_FILES for name in names} | set(TOKENIZER_SIDE_FILES)))
    wrong = auxiliary_problem(folder, names)
    if wrong:
        raise TextTowerError(f"{folder} is refused: {wrong}")
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name in names if (folder / name).is_file()
                 for stat in [(folder / name).stat()])


@functools.lru_cache(maxsize=4)
def _load_tokenizer(library: str, folder: str, version: tuple):
    """The model's own tokenizer from ``folder``, once per model (its files' ``version``), not each time a tower
    opens: the explorer opens one per model and page cache, the commands one per run."""
    with _offline(), tokenizer_panics_as(TextTowerError, f"reading the tokenizer of {folder}"):
        if library == "transformers":
            import transformers

            return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
        import open_clip

        return open_clip.get_tokenizer(f"local-dir:{folder}")


def _open_hf(folder: Path, architecture: str) -> TextTower:
    import transformers

    from vit.sources.open import HF_WEIGHTS, read_weights

    class_name, kind = _HF_TEXT[architecture]
    if not any(all((folder / name).is_file() for name in names) for names in TOKENIZER_FILES):
        raise TextTowerError(f"{folder} has no usable tokenizer files (tokenizer.json, or vocab.json and merges.txt "
                             "for CLIP, spiece.model for SigLIP); copy them from the model's Hub repository into "
                             "the folder")
    version = _tokenizer_version(folder)
    weights = next((folder / name for name in HF_WEIGHTS if (folder / name).is_file()), None)
    if weights is None:
        raise TextTowerError(f"{folder} has no {' or '.join(HF_WEIGHTS)}")
    model_class = getattr(transformers, class_name)
    with _offline(), quiet_transformers():
        from vit.sources.files import read_json

        check_declared_layers(read_json(folder / "config.json"), str(folder / "config.json"))
        try:  # the declared model on the meta device, compared with the file before from_pretrained allocates it
            config = model_class.config_class.from_pretrained(str(folder), local_files_only=True)
            with torch.device("meta"):
                skeleton = model_class(config)
        except Exception as e:  # noqa: BLE001
            raise TextTowerError(f"{folder}: transformers cannot read its config ({library_error_line(e)})") from None
        check_declared_model(skeleton, read_weights(weights, "meta"), "vision_model.", str(folder / "config.json"))
        del skeleton
        try:
            tokenizer = _load_tokenizer("transformers", str(folder), version)
        except TextTowerError:
            raise
        except Exception as e:  # noqa: BLE001 - the libraries raise many types for a missing or broken file
            raise TextTowerError(f"{folder} has no usable tokenizer files (tokenizer.json, or vocab.json and "
                                 f"merges.txt for CLIP, spiece.model for SigLIP): {_one_line(e)}; copy them from "
                                 "the model's Hub repository into the folder") from None
        try:
            model = model_class.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # noqa: BLE001
            raise TextTowerError(f"{folder}: transformers cannot open its text tower ({library_error_line(e)})") \
                from None
    model.vision_model = None  # the image side is ours; free its memory
    model.eval()
    max_length = int(model.config.text_config.max_position_embeddings)
    # SigLIP was trained on texts padded to the full length (its model card and processor say so).
    padding = "max_length" if kind == "sigmoid" else True

    def encode_batch(texts: list[str], between: Callable[[], None] | None = None) -> Tensor:
        # one text at a time (a stop check between), padded together as one call of the tokenizer would pad them
        each = _tokenize_each(lambda text: tokenizer(text, truncation=True, max_length=max_length), texts, between,
                              str(folder))
        tokens = tokenizer.pad(each, padding=padding, max_length=max_length if padding == "max_length" else None,
                               return_tensors="pt")
        return model.get_text_features(**tokens).pooler_output

    bias = float(model.logit_bias.item()) if getattr(model, "logit_bias", None) is not None else 0.0
    return TextTower(kind, float(model.logit_scale.exp().item()), bias, "transformers", encode_batch)


# -- open_clip -------------------------------------------------------------------------------------------------------

def _open_open_clip(weights: Path, state: dict[str, Tensor]) -> TextTower:
    import open_clip

    if "token_embedding.weight" not in state and "text.token_embedding.weight" not in state:
        raise TextTowerError(f"{weights} holds only an image tower (no token_embedding): there is no text side "
                             "to ask in words; use the file with the whole model")
    config_path = weights.parent / "open_clip_config.json"
    with _offline():
        if config_path.is_file():
            from vit.sources.open import read_json

            model_cfg = read_json(config_path).get("model_cfg")
            if not isinstance(model_cfg, dict):
                raise TextTowerError(f"{config_path} has no model_cfg")
            text_cfg = model_cfg.get("text_cfg") if isinstance(model_cfg.get("text_cfg"), dict) else {}
            if text_cfg.get("hf_model_name"):
                raise TextTowerError(f"{weights}: its text tower is a Hugging Face model open_clip would download "
                                     "(hf_model_name); only open_clip's own text transformer is supported")
            options = text_cfg.get("tokenizer_kwargs")
            if isinstance(options, dict) and "bpe_path" in options:  # a path on the server, inflated whole
                raise TextTowerError(f"{config_path} names a vocabulary file (text_cfg.tokenizer_kwargs.bpe_path), "
                                     "which open_clip would read whole from anywhere; remove it (its own CLIP "
                                     "vocabulary is read)")
            cfg = {k: v for k, v in model_cfg.items() if k != "custom_text"}
            # the class open_clip's factory builds for this config: CoCa's (a captioning decoder beside the towers),
            # a custom text tower's (its own transformer under text.), else CLIP's
            built = (open_clip.CoCa if "multimodal_cfg" in cfg else
                     open_clip.model.CustomTextCLIP if model_cfg.get("custom_text") else open_clip.model.CLIP)
            check_declared_layers(cfg, str(config_path))
            try:  # the declared model on the meta device first: its size is checked before it is allocated
                with torch.device("meta"):
                    skeleton = built(**cfg)
            except Exception as e:  # noqa: BLE001
                raise TextTowerError(f"{config_path}: open_clip cannot build this model ({_one_line(e)})") from None
            check_declared_model(skeleton, state, "visual.", str(config_path))
            del skeleton
            version = _tokenizer_version(weights.parent)
            try:
                model = built(**cfg)
                tokenizer = _load_tokenizer("open_clip", str(weights.parent), version)
            except TextTowerError:
                raise
            except Exception as e:  # noqa: BLE001
                raise TextTowerError(f"{config_path}: open_clip cannot build this model ({_one_line(e)})") from None
        else:  # OpenAI's flat layout: open_clip's own reader, QuickGELU, the bundled BPE vocabulary
            # The reader takes the sizes from the tensors' shapes (the width from ln_final, the depth from the
            # block names): a 2.8 MB file declared a 4096-wide, 64-layer tower. It runs on the meta device first,
            # where its strict load compares every declared tensor with the file's, then for real.
            try:
                with torch.device("meta"):
                    skeleton = open_clip.model.build_model_from_openai_state_dict(
                        {k: v.to("meta") for k, v in state.items()})
                check_declared_model(skeleton, state, "visual.", str(weights))
                del skeleton
                model = open_clip.model.build_model_from_openai_state_dict(dict(state))
            except TextTowerError:
                raise
            except Exception as e:  # noqa: BLE001
                raise TextTowerError(f"{weights}: open_clip cannot read it as OpenAI CLIP weights "
                                     f"({_one_line(e)}); put its open_clip_config.json beside it") from None
            tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=model.context_length)
    if config_path.is_file():
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise TextTowerError(f"{weights} does not match its open_clip_config.json ({_one_line(e)})") from None
    model.visual = None  # the image side is ours; free its memory
    if hasattr(model, "text_decoder"):
        model.text_decoder = None  # CoCa's captioner: encode_text reads its text tower alone
    model.eval()
    bias = getattr(model, "logit_bias", None)
    kind = "sigmoid" if bias is not None else "softmax"

    def encode_batch(texts: list[str], between: Callable[[], None] | None = None) -> Tensor:
        # one text at a time (a stop check between): each is padded to the context alone, as in one call
        return model.encode_text(torch.cat(_tokenize_each(lambda text: tokenizer([text]), texts, between,
                                                          str(weights.parent))))

    return TextTower(kind, float(model.logit_scale.exp().item()), float(bias.item()) if bias is not None else 0.0,
                     "open_clip", encode_batch)


# -- dino.txt ----------------------------------------------------------------------------------------------------

def _open_dinotxt(weights: Path) -> TextTower:
    """dino.txt's text tower (``import_dinotxt``) as open_clip's ``TextTransformer`` builds it, and the authors'
    tokenizer (CLIP's BPE: a ``bpe_simple_vocab_16e6.txt.gz`` beside the weights, else open_clip's copy of it)."""
    import open_clip

    from vit.sources.open import read_weights
    from vit.sources.ports.families import import_dinotxt

    state = read_weights(weights)
    try:
        config = import_dinotxt.text_config(state)
        ours = import_dinotxt.text_state_dict(state, config)
        scale = import_dinotxt.logit_scale(state)
    except (ValueError, KeyError) as e:
        raise TextTowerError(f"{weights} (dino.txt): {_one_line(e)}") from None
    with torch.device("meta"):  # its size checked before any memory is allocated for it
        skeleton = open_clip.transformer.TextTransformer(**config.arguments())
    check_declared_model(skeleton, ours, "visual.", str(weights))
    model = open_clip.transformer.TextTransformer(**config.arguments())
    model.load_state_dict(ours, strict=True)
    model.eval()
    with _offline():
        tokenizer = open_clip.tokenizer.SimpleTokenizer(**_vocabulary(weights.parent),
                                                        context_length=import_dinotxt.CONTEXT_LENGTH)

    def encode_batch(texts: list[str], between: Callable[[], None] | None = None) -> Tensor:
        return model(torch.cat(_tokenize_each(lambda text: tokenizer([text]), texts, between, str(weights.parent))))

    return TextTower("softmax", scale, 0.0, "open_clip", encode_batch, patch_channels=config.output_dim // 2)


def _vocabulary(folder: Path) -> dict:
    """``SimpleTokenizer``'s ``bpe_path`` for the vocabulary beside the weights, or none for open_clip's own: the
    file read once, within ``files.MAX_VOCABULARY_BYTES`` inflated (``read_bounded``; ``SimpleTokenizer`` inflates
    a path whole, and a 0.5 MB .gz inflated to 3 GB), handed over as those bytes (``gzip.open`` takes a file)."""
    path = folder / BPE_VOCABULARY
    if not path.exists():
        return {}
    try:
        text = read_bounded(path)
    except CheckpointError as e:
        raise TextTowerError(str(e)) from None
    return {"bpe_path": io.BytesIO(gzip.compress(text, compresslevel=1))}


def has_text_tower(checkpoint: Checkpoint) -> bool:
    """Whether ``checkpoint`` came from a source that can hold a text side (opening it may still fail)."""
    source = checkpoint.metadata.get("source") or {}
    return source.get("architecture") in _HF_TEXT or source.get("kind") in ("open_clip", "dinotxt")


def open_text_tower(checkpoint: Checkpoint) -> TextTower:
    """The text side of the model ``checkpoint`` was opened from; ``TextTowerError`` (one line) when it has none."""
    source = checkpoint.metadata.get("source") or {}
    path, architecture = Path(str(source.get("path", ""))), source.get("architecture")
    if architecture in _HF_TEXT:
        return _open_hf(path, architecture)
    if source.get("kind") == "open_clip":
        from vit.sources.open import read_weights

        return _open_open_clip(path, read_weights(path))
    if source.get("kind") == "dinotxt":
        return _open_dinotxt(path)
    raise TextTowerError(f"{checkpoint.path or 'this model'} has no text tower: asking in words needs a CLIP, "
                         "SigLIP or dino.txt model with its text weights (an HF CLIPModel / SiglipModel folder, "
                         "open_clip weights, dino.txt's head and text file)")


def check_labels(labels: Sequence[str], limit: int = MAX_LABELS) -> list[str]:
    """The labels as typed, stripped, empty ones dropped; ValueError (one line) past the bounds (``limit``
    labels: ``MAX_LABELS`` typed, ``MAX_DATASET_CLASSES`` from a dataset's folders)."""
    cleaned = [str(label).strip() for label in labels]
    cleaned = [label for label in cleaned if label]
    if not cleaned:
        raise ValueError("type at least one label, e.g. 'a dog, a cat'")
    if len(cleaned) > limit:
        hint = " (for a dataset use vit.evaluate --zero-shot)" if limit == MAX_LABELS else ""
        raise ValueError(f"{len(cleaned)} labels given; at most {limit} at once{hint}")
    long = next((label for label in cleaned if len(label) > MAX_LABEL_CHARS), None)
    if long is not None:
        raise ValueError(f"a label of {len(long)} characters; at most {MAX_LABEL_CHARS} (the text tower reads "
                         "only its first 64-77 tokens)")
    if len(set(cleaned)) != len(cleaned):
        raise ValueError("a label is given twice; give each label once")
    return cleaned


def split_labels(text: str) -> list[str]:
    """'a dog, a cat;a ball' -> ['a dog', 'a cat', 'a ball'] (commas, semicolons or line breaks), checked."""
    if len(text) > MAX_LABELS * (MAX_LABEL_CHARS + 2):
        raise ValueError(f"the labels text is {len(text)} characters long; at most {MAX_LABELS} labels of "
                         f"{MAX_LABEL_CHARS} characters")
    for separator in (";", "\n"):
        text = text.replace(separator, ",")
    return check_labels(text.split(","))
