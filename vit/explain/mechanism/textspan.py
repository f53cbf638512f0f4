"""TextSpan (Gandelsman, Efros & Steinhardt, ICLR 2024): a CLIP's late attention heads described by the texts
whose embeddings span what each head writes into the image embedding, and each head's map of the image.

As yossigandelsman/clip_text_span (tests/reference/clip_text_span, compared in tests/test_textspan.py):

- The decomposition (``prs_hook.py``, run by ``compute_prs.py``): with the final LayerNorm's mean and scale frozen
  at each image's own CLS residual, the image embedding is a sum of terms, one per head, layer and key token
  (``P[h, CLS, t] * v[h, t] @ W_O[h]``, plus the out-projection's bias split evenly over tokens and heads), one for
  the embedding after ``ln_pre`` and one per MLP. The norm's centring and offset are shared evenly among those
  ``2L + 1`` components (a layer's share again evenly over its tokens and heads), then the projection, then the
  division by the embedding's norm. ``head_outputs`` gives each head's term summed over the tokens (what the
  search reads), ``token_contributions`` one image's terms per token (the head's map).
- The search (``compute_complete_text_set.py``'s ``replace_with_iterative_removal``): the text embeddings are
  projected on the span of the head's top ``rank`` right singular vectors over the images; then ``texts_per_head``
  times, the text whose projection varies most over the images is taken, and its direction removed from the
  head's centred outputs and from every text. ``variance_explained`` is the share of the head's variance over the
  images that the chosen texts' directions hold (``1 - |residual|^2 / |centred|^2``), after each text.

A SigLIP (SigLIP 2, any model read by an attention-pooling probe) reads its embedding through the probe, which
mixes every layer's tokens again: its late layers' heads have no direct share. As the authors' ``compute_siglip.py``,
the probe's own heads are described instead (``probe_head_outputs``: each head's output through its columns of the
probe's out-projection, summed over the tokens, no norm to freeze), searched over the full span (their ``rank`` is
the width) unless a rank is given.

Shapes: images ``(B, C, H, W)``; ``T = prefix + gh * gw``; ``H`` heads; ``E`` the embedding's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from vit.explain.mechanism.components import MechanismError, check_budget
from vit.model import ViT

DEFAULT_TEXTS = Path(__file__).with_name("textspan_texts.txt")  # the authors' image_descriptions_general.txt
TEXTS_PER_HEAD = 10  # compute_complete_text_set.py's --texts_per_head
LAST_LAYERS = 8  # its --num_of_last_layers: the layers whose heads are described
RANK = 80  # its --w_ov_rank: the rank of the span the texts are projected on
MAX_TEXTS = 100_000  # a text bank past this is a corpus, not a description set (the authors' has 3,498)
# A text tower reads 77 tokens (CLIP; SigLIP 64) and CLIP's BPE vocabulary's longest token is 32 characters (28 bytes
# and its '</w>'): a longer line cannot be read whole. open_clip's Python BPE grows faster than the line (a
# 32,000-character line took 124 s), so longer lines are refused before any is tokenized, not cut: a cut changes
# what a line says where its words are spread by whitespace, and a refusal says which line to shorten.
CONTEXT_TOKENS, LONGEST_TOKEN_CHARS = 77, 32
MAX_TEXT_CHARS = CONTEXT_TOKENS * LONGEST_TOKEN_CHARS  # 2,464
MAX_BANK_BYTES = 8 * 2**20  # MAX_TEXTS texts of 80 bytes on average (the authors' average 25); checked before reading
TEXT_BATCH = 256  # texts encoded at once: a whole bank at once holds GBs of the text tower's activations


def check_supported(model: nn.Module) -> None:
    """``MechanismError`` in one line unless the decomposition applies: an image tower read at its CLS token
    through a final LayerNorm and a linear projection (a CLIP's), with pre-norm blocks and one grid."""
    if not isinstance(model, ViT):
        raise MechanismError(f"TextSpan needs this project's ViT, got {type(model).__name__}")
    c = model.config
    if model.head is not None:
        raise MechanismError("TextSpan describes the heads of a CLIP's image tower by texts; this model is a "
                             "classifier (open a CLIP)")
    if c.pooling == "map":
        return  # the probe's heads (compute_siglip.py)
    if c.pooling != "cls" or c.stage_depths or c.post_norm or c.res_post_norm or model.fc_norm is not None \
            or not isinstance(model.norm, nn.LayerNorm):
        raise MechanismError("TextSpan splits an embedding read at CLS through one final LayerNorm (a CLIP's); "
                             "this model pools, normalises or stages otherwise")


def reads_probe(model: ViT) -> bool:
    """Whether TextSpan describes ``model``'s attention-pooling probe's heads (a SigLIP's) rather than its late
    layers' (a CLIP's)."""
    return model.config.pooling == "map"


def _heads_and_residual(model: ViT, images: Tensor, layers: Sequence[int], names: Sequence[str]
                        ) -> tuple[dict[str, Tensor], Tensor]:
    cache: dict[str, Tensor] = {}

    def keep(x: Tensor, hook) -> None:
        cache[hook.name] = x

    L = len(model.blocks)
    wanted = [f"blocks.{layer}.{name}" for layer in layers for name in names] + [f"blocks.{L - 1}.hook_resid_post"]
    with torch.no_grad():
        encoding = model.run_with_hooks(images, [(name, keep) for name in wanted])
    return cache, encoding.embedding


def _readout(model: ViT, final: Tensor, embedding: Tensor, shares: int) -> Callable[[Tensor], Tensor]:
    """``prs_hook.PRSLogger``'s ``_normalize_*``: a term ``(..., B, D)`` that is one of ``shares`` equal shares of
    its layer -> ``(..., B, E)``, with ``final`` the last CLS residual ``(B, D)``."""
    L = len(model.blocks)
    count = (2 * L + 1) * shares  # every term the final residual is split into
    norm = model.norm
    mean = final.mean(dim=-1, keepdim=True)  # (B, 1): their ln_post.mean
    std = torch.sqrt((final ** 2).mean(dim=-1, keepdim=True) - mean ** 2 + norm.eps)  # their ln_post.sqrt_var
    length = embedding.norm(dim=-1, keepdim=True)  # (B, 1)
    weight = model.projection.weight if model.projection is not None else None

    def readout(term: Tensor) -> Tensor:
        x = norm.weight * (term - mean / count) / std + norm.bias / count
        x = x if weight is None else x @ weight.T
        return x / length

    return readout


def _per_head(model: ViT, layer: int, values: Tensor) -> Tensor:
    """Each head's context ``(..., H, hd)`` through its columns of the out-projection: ``(..., H, D)``."""
    attn = model.blocks[layer].attn
    D = attn.proj.weight.shape[0]
    w = attn.proj.weight.view(D, attn.num_heads, attn.head_dim)  # columns grouped by head
    out = torch.einsum("...he,dhe->...hd", values, w)
    ls1 = model.blocks[layer].ls1
    return out if ls1 is None else out * ls1


def _proj_bias(model: ViT, layer: int) -> Tensor:
    block = model.blocks[layer]
    bias = block.attn.proj.bias
    bias = torch.zeros_like(block.attn.proj.weight[:, 0]) if bias is None else bias
    return bias if block.ls1 is None else bias * block.ls1


@torch.no_grad()
def head_outputs(model: ViT, images: Tensor, layers: Sequence[int]) -> Tensor:
    """Each head's direct share of each image's embedding, summed over the tokens, as ``compute_prs.py`` saves it
    (divided by the embedding's norm): ``(B, len(layers), H, E)``."""
    check_supported(model)
    if reads_probe(model):
        raise MechanismError("this model reads its embedding through an attention-pooling probe: its layers' heads "
                             "have no direct share; describe the probe's (probe_head_outputs)")
    cache, embedding = _heads_and_residual(model, images, layers, ["attn.hook_z"])
    final = cache[f"blocks.{len(model.blocks) - 1}.hook_resid_post"][:, 0]  # (B, D)
    out = []
    for layer in layers:
        H = model.blocks[layer].attn.num_heads
        readout = _readout(model, final, embedding, H)
        heads = _per_head(model, layer, cache[f"blocks.{layer}.attn.hook_z"][:, 0])  # (B, H, D): CLS's context
        heads = heads + _proj_bias(model, layer) / H  # their bias / (T * H), summed over the T tokens
        out.append(readout(heads.transpose(0, 1)).transpose(0, 1))  # (B, H, E)
    return torch.stack(out, dim=1)


@torch.no_grad()
def token_contributions(model: ViT, images: Tensor, layer: int) -> Tensor:
    """Layer ``layer``'s terms per head and key token (``prs_hook.py``'s spatial ones): ``(B, H, T, E)``; their
    sum over ``T`` is ``head_outputs``'."""
    check_supported(model)
    if reads_probe(model):
        raise MechanismError("this model reads its embedding through an attention-pooling probe: its layers' heads "
                             "have no direct share; describe the probe's (probe_head_outputs)")
    cache, embedding = _heads_and_residual(model, images, [layer], ["attn.hook_pattern", "attn.hook_v"])
    final = cache[f"blocks.{len(model.blocks) - 1}.hook_resid_post"][:, 0]
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, :, 0]  # (B, H, T): CLS's row
    values = cache[f"blocks.{layer}.attn.hook_v"]  # (B, H, T, hd)
    H, T = pattern.shape[1:]
    terms = _per_head(model, layer, (pattern[..., None] * values).transpose(1, 2))  # (B, T, H, D)
    terms = terms + _proj_bias(model, layer) / (T * H)
    readout = _readout(model, final, embedding, T * H)
    return readout(terms.permute(1, 2, 0, 3)).permute(2, 1, 0, 3)  # (B, H, T, E)


@torch.no_grad()
def probe_token_contributions(model: ViT, images: Tensor) -> Tensor:
    """The attention-pooling probe's terms per head and key token, ``P[h, t] * v[h, t] @ W_O[h]``: ``(B, H, T, D)``
    (``probe_head_outputs`` is their sum over ``T``)."""
    check_supported(model)
    if not reads_probe(model):
        raise MechanismError("this model reads its embedding at CLS, not through an attention-pooling probe")
    cache: dict[str, Tensor] = {}

    def keep(x: Tensor, hook) -> None:
        cache[hook.name] = x

    with torch.no_grad():
        model.run_with_hooks(images, [("attn_pool.hook_pattern", keep), ("attn_pool.hook_v", keep)])
        pool = model.attn_pool
        pattern = cache["attn_pool.hook_pattern"][:, :, 0]  # (B, H, T)
        values = cache["attn_pool.hook_v"]  # (B, H, T, hd)
        D = pool.proj.weight.shape[0]
        w = pool.proj.weight.view(D, pool.num_heads, pool.head_dim)
        return torch.einsum("bht,bhte,dhe->bhtd", pattern, values, w)


@torch.no_grad()
def probe_head_outputs(model: ViT, images: Tensor) -> Tensor:
    """Each of the attention-pooling probe's heads' output, summed over the tokens (``compute_siglip.py``'s
    ``pooling_head.attention.out.post``, collapsed): ``(B, 1, H, D)``."""
    return probe_token_contributions(model, images).sum(dim=2)[:, None]


@dataclass
class HeadSpan:
    """One head's texts, best first, and the share of its variance over the images they explain after each.
    ``layer``: the block, or with ``probe`` the number of blocks (the attention-pooling probe after them)."""

    layer: int
    head: int
    texts: list[str]
    variance_explained: list[float]  # cumulative, one per text
    probe: bool = False

    @property
    def label(self) -> str:
        """``layer.head`` from 1 as the explorer shows them, ``probe.head`` for the pooling probe's."""
        return f"{'probe' if self.probe else self.layer + 1}.{self.head + 1}"


def text_span(outputs: Tensor, text_features: Tensor, texts_per_head: int = TEXTS_PER_HEAD, rank: int = RANK
              ) -> tuple[list[int], list[float]]:
    """The greedy search of one head (``replace_with_iterative_removal``) over ``outputs (N, E)`` (a head's output
    per image) and ``text_features (M, E)``: the indices of the chosen texts and the cumulative variance
    explained after each. In float64 (theirs runs in float32: the choices are the same)."""
    data = outputs.double()
    _, _, vh = torch.linalg.svd(data, full_matrices=False)
    vh = vh[:rank]  # (r, E)
    text = (vh.T @ torch.linalg.inv(vh @ vh.T) @ vh @ text_features.double().T).T  # on the span of the outputs
    data = data - data.mean(dim=0, keepdim=True)
    total = data.pow(2).sum()
    chosen, explained = [], []
    for _ in range(texts_per_head):
        top = int((data @ text.T).std(dim=0).argmax())
        chosen.append(top)
        t = text[top]
        norm = t @ t
        data = data - (data @ t / norm)[:, None] * t[None, :]
        text = text - (text @ t / norm)[:, None] * t[None, :]
        explained.append(float(1 - data.pow(2).sum() / total) if total > 0 else 0.0)
    return chosen, explained


def check_request(images: int, texts: int, texts_per_head: int, rank: int) -> None:
    """``MechanismError`` in one line, before any work, for a search that cannot run as asked."""
    if images < 2:
        raise MechanismError("TextSpan reads how a head's output varies over images; give at least 2 (the authors "
                             "use ImageNet's 50,000 validation images)")
    if not 1 <= texts_per_head <= texts:
        raise MechanismError(f"texts_per_head must be 1 to the {texts} texts of the bank, got {texts_per_head}")
    if rank < 1:
        raise MechanismError(f"rank must be at least 1, got {rank}")


def describe_heads(outputs: Tensor, layers: Sequence[int], text_features: Tensor, texts: Sequence[str],
                   texts_per_head: int = TEXTS_PER_HEAD, rank: int = RANK, probe: bool = False) -> list[HeadSpan]:
    """``text_span`` for every head of ``outputs (N, len(layers), H, E)`` (``head_outputs``, or with ``probe``
    ``probe_head_outputs``)."""
    check_request(outputs.shape[0], len(texts), texts_per_head, rank)
    spans = []
    for i, layer in enumerate(layers):
        for head in range(outputs.shape[2]):
            chosen, explained = text_span(outputs[:, i, head], text_features, texts_per_head, rank)
            spans.append(HeadSpan(layer, head, [texts[j] for j in chosen], explained, probe))
    return spans


def late_layers(model: ViT, count: int = LAST_LAYERS) -> list[int]:
    """The last ``count`` layers (all of them in a shallower model)."""
    L = len(model.blocks)
    if count < 1:
        raise MechanismError(f"the number of late layers must be at least 1, got {count}")
    return list(range(max(0, L - count), L))


def check_outputs_fit(model: ViT, images: int, layers: Sequence[int]) -> None:
    """Refuse, before any forward, a set whose head outputs (``images x layers x H x E`` floats) pass the bound."""
    H = model.attn_pool.num_heads if reads_probe(model) else max(model.blocks[layer].attn.num_heads
                                                                 for layer in layers)
    E = model.config.projection_dim or model.config.hidden_size
    check_budget(images * len(layers) * H * E, f"keeping {len(layers)} layers' head outputs for {images} images")


def check_texts(texts: Sequence[str], origin: str = "the text bank") -> None:
    """``MechanismError`` in one line, before any text is tokenized, for a bank past the bounds: no texts, more than
    ``MAX_TEXTS``, or a text longer than ``MAX_TEXT_CHARS`` (more than a text tower reads)."""
    if not texts:
        raise MechanismError(f"{origin} has no texts; give one description a line")
    if len(texts) > MAX_TEXTS:
        raise MechanismError(f"{origin} has {len(texts):,} texts, over {MAX_TEXTS:,}; give a smaller one")
    long = next((i for i, text in enumerate(texts) if len(text) > MAX_TEXT_CHARS), None)
    if long is not None:
        raise MechanismError(f"text {long + 1} of {origin} is {len(texts[long]):,} characters long, over the "
                             f"{MAX_TEXT_CHARS:,} a text tower can read ({CONTEXT_TOKENS} tokens); shorten it")


def _check_bank_size(size: int, origin: str) -> None:
    if size > MAX_BANK_BYTES:
        raise MechanismError(f"{origin} is {size / 2**20:.1f} MB, over the {MAX_BANK_BYTES // 2**20} MB a text bank "
                             f"may have ({MAX_TEXTS:,} texts); give a smaller one")


def texts_from_bytes(data: bytes, origin: str = "the text bank") -> list[str]:
    """A text bank's bytes (UTF-8, one description a line, blank lines skipped) as its texts, checked
    (``check_texts``); its size is checked before it is decoded."""
    _check_bank_size(len(data), origin)
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise MechanismError(f"cannot read {origin} ({e}); give a UTF-8 file with one text a line") from None
    texts = [line.strip() for line in lines if line.strip()]
    check_texts(texts, origin)
    return texts


def read_texts(path: str | Path | None = None) -> list[str]:
    """A text bank: one description a line (blank lines skipped), the authors' general one by default. A regular
    file of at most ``MAX_BANK_BYTES``, checked before it is read (a FIFO or a device is never opened)."""
    path = DEFAULT_TEXTS if path is None else Path(path)
    origin = f"the text bank {path}"
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise MechanismError(f"{origin} is not a regular file; give a text file with one description a line")
        _check_bank_size(size, origin)
        with open(path, "rb") as f:
            data = f.read(MAX_BANK_BYTES + 1)  # a file that grew since its size was read is still bounded
    except OSError as e:
        raise MechanismError(f"cannot read {origin} ({e}); give a UTF-8 file with one text a line") from None
    return texts_from_bytes(data, origin)


def encode_texts(encode: Callable[..., Tensor], texts: Sequence[str],
                 progress: Callable[[int, int], None] | None = None) -> Tensor:
    """``(M, E)`` L2-normalised embeddings of ``texts`` by a text tower's ``encode(texts, between)``
    (``TextTower.encode``), ``TEXT_BATCH`` at a time. ``progress`` follows each batch and is asked again (the texts
    done so far) after each text is tokenized, so that a stop reaches inside a batch."""
    parts = []
    for start in range(0, len(texts), TEXT_BATCH):
        between = None if progress is None else (lambda done=start: progress(done, len(texts)))
        parts.append(encode(list(texts[start:start + TEXT_BATCH]), between).float())
        if progress is not None:
            progress(min(start + TEXT_BATCH, len(texts)), len(texts))
    features = torch.cat(parts)
    return features / features.norm(dim=-1, keepdim=True)
