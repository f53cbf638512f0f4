"""What the explorer page needs beside the engine (``vit.explain.views.image_analysis``, ``attention_maps``,
``method_maps``, ``mechanism_views``): image digests and files, sample labels, the map picker's choice, the tokens
offered, inverted digits, head labels, a query kept across patch grids. How it is drawn is ``vit.app.drawing``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageOps

from vit.checkpoint import Preprocessing
from vit.core.images import ImageError, to_mode, to_uint8
from vit.core.runfiles import NotARegularFile, lies_inside, open_regular


def image_digest(data: bytes) -> str:
    """A short content hash: the cache key of an uploaded or sample image."""
    return hashlib.sha256(data).hexdigest()[:20]


def read_image_file(path: str | os.PathLike, folder: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of an image file another page names (the Analyse page's mistakes, from an ``analysis.json`` that
    may be written elsewhere): ImageError (one line) unless it is a regular file inside ``folder``, links resolved,
    of at most ``max_bytes`` (the uploads' bound); a device, a FIFO or a file elsewhere is never read."""
    name = Path(path).name
    if not lies_inside(path, folder):
        raise ImageError(f"{name} is not inside the analysed folder")
    try:
        file = open_regular(os.path.realpath(path))  # a FIFO does not block
    except NotARegularFile:
        raise ImageError(f"{name} is not a regular file") from None
    except OSError as e:
        raise ImageError(f"cannot read {name}: {e.strerror or e}") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        if size > max_bytes:
            raise ImageError(f"{name} is {size / 2**20:.1f} MB, over the {max_bytes / 2**20:.0f} MB uploads may "
                             "have")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while read
        raise ImageError(f"{name} is over the {max_bytes / 2**20:.0f} MB uploads may have")
    return data


def sample_label(path: Path) -> str:
    """'cat_1.png' -> 'cat 1'."""
    return Path(path).stem.replace("_", " ")


def map_choice(chosen: str | None, previous_default: str | None, choices: list[str], model_changed: bool) -> str:
    """The map to show of ``choices`` (the model's default first): the one ``chosen`` while it fits; after a model
    change, the new model's default when ``chosen`` was only the previous model's default (a session starts on
    the default checkpoint's CLS attention; SigLIP then opens on its pooling probe, not on a patch's attention)."""
    if chosen not in choices or model_changed and chosen == previous_default:
        return choices[0]
    return chosen


def patch_of(token: int, num_prefix_tokens: int = 1) -> int | None:
    """The row-major patch index of a token, None for a prefix (CLS) token."""
    return token - num_prefix_tokens if token >= num_prefix_tokens else None


def centre_token(grid: tuple[int, int], num_prefix_tokens: int = 1) -> int:
    """The token of the patch at the grid's centre, row ``gh // 2`` and column ``gw // 2`` (counted from 0: on an even
    grid the lower right of the middle four)."""
    gh, gw = grid
    return num_prefix_tokens + gh // 2 * gw + gw // 2


def query_key(kind: str, model_key: str, readout: bool = False) -> str:
    """The session key of the query token map ``kind`` reads, which a click on a patch sets: the class maps' and a
    word's gradient maps' are their own (a class map reads from CLS until a query is picked for it; a word's target
    is a patch, never a prefix token), and so is rollout's where it starts from a mean-pooling model's readout
    (``readout``: ``attention_maps.default_query``; the attention map's centre patch is not what it reads); the other
    maps share one."""
    from vit.app.vlm_words import KINDS as WORD_KINDS
    from vit.explain.views.attention_maps import is_class_map

    if is_class_map(kind):
        return f"class-query-{model_key}"
    if readout:
        return f"query-{kind}-{model_key}"
    return f"word-query-{model_key}" if kind in WORD_KINDS else f"query-{model_key}"


def visible_tokens(num_tokens: int, num_prefix_tokens: int, hide_registers: bool) -> list[int]:
    """Token indices to offer and draw: all, or without the prefix tokens after CLS (registers, distillation)."""
    if not hide_registers:
        return list(range(num_tokens))
    return [0] + list(range(num_prefix_tokens, num_tokens))


def invert_image(image: Image.Image) -> Image.Image:
    """The greyscale image with black and white swapped (for digits written dark on light)."""
    return ImageOps.invert(to_mode(image, 1))


def looks_inverted(image: Image.Image, preprocessing: Preprocessing) -> bool:
    """Whether a 1-channel model's input is nearer the training data's mean brightness once inverted.

    Only meaningful when the training mean is far from mid-grey (MNIST's is 0.13); otherwise False.
    """
    if preprocessing.num_channels != 1 or abs(preprocessing.mean[0] - 0.5) < 0.15:
        return False
    brightness = float(to_uint8(image, preprocessing.image_size, 1).float().mean()) / 255.0
    mean = preprocessing.mean[0]
    return abs((1.0 - brightness) - mean) < abs(brightness - mean)


MORE_METHODS = "methods"  # the page's one "Map" choice for all of METHOD_MAP_KINDS (a second picker names which)
MORE_METHODS_LABEL = "More: LeGrad, LRP, AttnLRP, flow, CAMs"


def parse_head_labels(labels: Sequence[str]) -> list[tuple[int, int]]:
    """``["2.3", ...]`` (layer.head from 1, as the page lists them) -> ``[(1, 2), ...]`` from 0."""
    return [(int(a) - 1, int(b) - 1) for a, _, b in (label.partition(".") for label in labels)]


def remap_query(token: int, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int) -> int:
    """The query token at the same place in the image when the patch grid changes (another input size or the
    aspect kept): a patch goes to the patch of the new grid that holds its centre; prefix tokens stay."""
    if token < num_prefix_tokens or tuple(old_grid) == tuple(new_grid):
        return token
    (gh, gw), (nh, nw) = old_grid, new_grid
    row, col = divmod(token - num_prefix_tokens, gw)
    if row >= gh:  # not a patch of the old grid: start again from CLS
        return 0
    new_row = min(nh - 1, int((row + 0.5) * nh / gh))
    new_col = min(nw - 1, int((col + 0.5) * nw / gw))
    return num_prefix_tokens + new_row * nw + new_col
