"""Comparing runs and checkpoints: the settings that differ between runs, and the difference of two maps.

The Train page shows ``config_diff`` of the selected runs; the explorer's compare mode draws two
checkpoints' maps of one image side by side and ``difference_overlay`` of the two, in a diverging
colour map centred on zero (red: the first attends more, blue: the second).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from vit.core.sizes import describe_size
from vit.explain.views.overlay import overlay, upsample

# Settings that name the run rather than what it trains; they differ between any two runs.
NOT_COMPARED = ("out", "resume")
DIVERGING_COLORMAP = "RdBu_r"  # red above zero, white at zero, blue below
ABSENT = "—"  # a setting one run does not have (e.g. added to the trainer after that run)


def flatten(settings: Mapping, prefix: str = "") -> dict[str, object]:
    """Nested dicts as one level with dotted keys: ``{"model": {"num_layers": 6}}`` -> ``{"model.num_layers": 6}``."""
    flat: dict[str, object] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def format_setting(value: object) -> str:
    """A setting as table text: '' for unset (never 'None'), numbers as Python writes them, lists as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def config_diff(settings: Mapping[str, Mapping], ignore: Sequence[str] = NOT_COMPARED) -> list[dict[str, str]]:
    """Rows ``{"Parameter": name, <run>: value, …}`` for each setting whose value is not the same in every run.

    ``settings`` maps a run name to its settings (config.json's ``args``; nested dicts are compared
    key by key). Values are table text (``format_setting``); a run without the setting shows ``—``.
    Rows are sorted by parameter name; with fewer than two runs nothing differs.
    """
    if len(settings) < 2:
        return []
    flat = {run: flatten(values) for run, values in settings.items()}
    names = sorted(set().union(*(f.keys() for f in flat.values())) - set(ignore))
    rows = []
    for name in names:
        values = [f[name] if name in f else ABSENT for f in flat.values()]
        if all(_same(v, values[0]) for v in values[1:]):
            continue
        row = {"Parameter": name}
        row.update({run: (ABSENT if v is ABSENT else format_setting(v)) for run, v in zip(flat, values, strict=True)})
        rows.append(row)
    return rows


def _same(a: object, b: object) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool | str):
        return not isinstance(b, bool) and float(a) == float(b)  # 2 and 2.0 are the same setting
    return a == b


def difference(map_a, map_b, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """``a - b`` of two ``(gh, gw)`` maps upsampled to ``size = (height, width)``: float32 ``(H, W)``.

    Upsampling first lets models with different patch grids be compared on the same image.
    """
    return upsample(map_a, size, mode) - upsample(map_b, size, mode)


def symmetric_limit(values: np.ndarray) -> float:
    """The colour scale's half-width: the largest absolute value (1e-12 for an all-zero map)."""
    finite = np.abs(np.asarray(values, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return max(float(finite.max()) if finite.size else 0.0, 1e-12)


def difference_overlay(image: Image.Image, map_a, map_b, opacity: float = 0.6, mode: str = "bilinear",
                       colormap: str = DIVERGING_COLORMAP) -> Image.Image:
    """``map_a - map_b`` over ``image`` at its own size in a diverging colour map with zero at its centre; RGB."""
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be in [0, 1], got {opacity}")
    diff = difference(map_a, map_b, (image.height, image.width), mode)  # (H, W)
    limit = symmetric_limit(diff)
    # Already at the image's size, so overlay's nearest upsampling leaves it as it is.
    return overlay(image, diff, opacity, colormap, "nearest", vmin=-limit, vmax=limit)


def describe_difference(map_a, map_b, size: tuple[int, int], mode: str = "bilinear") -> str:
    """One line for under the difference map: its range and where each side attends more."""
    diff = difference(map_a, map_b, size, mode)
    return (f"Difference A − B from {float(diff.min()):.4g} (blue: B attends more) to {float(diff.max()):.4g} "
            f"(red: A attends more); mean |A − B| {float(np.abs(diff).mean()):.4g}.")


def same_depth(layer: int, num_layers_a: int, num_layers_b: int) -> int:
    """B's layer (0-based) at the relative depth of A's ``layer``: the one whose end, as a share of B's depth,
    is nearest A's (layer 4 of 6 -> 8 of 12; the last layer -> the last; 1 of 12 -> 1 of 6)."""
    return min(num_layers_b - 1, max(0, round((layer + 1) * num_layers_b / num_layers_a) - 1))


def depth_note(settings_a, settings_b, num_layers_a: int, num_layers_b: int) -> str:
    """'A's layer 4 of 6 is compared with B's layer 8 of 12 (the same relative depth).', or '' for equal depths."""
    if num_layers_a == num_layers_b:
        return ""
    a = (settings_a.layer if settings_a.kind == "attention" else settings_a.end_layer) % num_layers_a
    b = settings_b.layer if settings_a.kind == "attention" else settings_b.end_layer
    return (f"A's layer {a + 1} of {num_layers_a} is compared with B's layer {b + 1} of {num_layers_b} "
            "(the same relative depth).")


def settings_for_other(settings, analysis_a, analysis_b, class_names_a: Sequence[str],
                       class_names_b: Sequence[str]):
    """The explorer's ``MapSettings`` of checkpoint A made to mean the same in checkpoint B.

    Layers (and the rollout's last layer) are matched by relative depth, as models of different
    depths are compared (``same_depth``): layer 4 of 6 is layer 8 of 12, and the last layer is the
    last; a head must exist in B; a patch query needs B's token layout to be A's (the CLS query
    always compares); a chosen class is found in B by its name. Raises ValueError saying why when B
    cannot show the same map.
    """
    from dataclasses import replace

    s = settings
    L_a, L_b = analysis_a.num_layers, analysis_b.num_layers
    layer, end = same_depth(s.layer % L_a, L_a, L_b), same_depth(s.end_layer % L_a, L_a, L_b)
    if s.kind == "attention" and s.head is not None and s.head >= analysis_b.num_heads:
        raise ValueError(f"B has {analysis_b.num_heads} heads, so it has no head {s.head + 1}")
    same_tokens = (analysis_a.grid, analysis_a.num_prefix_tokens) == (analysis_b.grid, analysis_b.num_prefix_tokens)
    if s.query != 0 and not same_tokens:
        height, width = analysis_b.input_size
        raise ValueError(f"B's tokens differ from A's ({describe_size(width, height, analysis_b.grid)}, "
                         f"{analysis_b.num_prefix_tokens} prefix); only the CLS query (token 0) compares")
    class_index = s.class_index
    if class_index is not None:  # any map that explains a chosen class: "class", LeGrad, LRP, AttnLRP
        name = class_names_a[class_index]
        if name not in class_names_b:
            raise ValueError(f"B has no class named {name!r}; compare the predicted classes instead")
        class_index = list(class_names_b).index(name)
    return replace(s, layer=layer, end_layer=end, class_index=class_index)
