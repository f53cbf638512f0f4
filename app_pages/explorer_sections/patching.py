"""Mechanism's Patching tab: the clean image's activations patched into a corrupted one, per head and, when asked,
per layer and token (activation patching; issue 24). Drawn inside the Mechanism fragment, whose ``KEPT`` names its
widgets' keys."""

from pathlib import Path

import streamlit as st
from PIL import Image

from app_pages.explorer_sections.caches import UPLOAD_TYPES, decode_image
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.state import Shown
from app_pages.explorer_sections.uploader import file_upload
from vit.app import drawing
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError, open_image
from vit.core.inference import InputSize
from vit.core.text import escape_markdown
from vit.explain.views import figures, mechanism_views


def patching(fingerprint: tuple, digest: str, corrupted: str, size: InputSize, residual: bool,
             checkpoint: Checkpoint, image: Image.Image, corrupted_image: Image.Image):
    """The clean image's activations patched into the corrupted one (long work: None while it runs)."""
    return long_work(("patching", fingerprint, digest, corrupted, size, residual),
                     "Patching the clean image's activations into the corrupted one",
                     lambda progress: mechanism_views.patching_view(checkpoint, image, corrupted_image, size, residual,
                                                                    progress), "patching")


def patching_tab(view: Shown, samples: list[Path] | None, sample: Path | None, invert: bool) -> None:
    """The tab: a corrupted image (uploaded, or another sample image), then the share of the logit difference each
    head, and with the toggle each layer's token, restores. ``invert``: the page's colour inversion of uploads."""
    checkpoint, fingerprint, image, image_key, size = (view.checkpoint, view.fingerprint, view.image, view.image_key,
                                                       view.size)
    class_names, model_key, analysis = view.class_names, view.model_key, view.analysis
    grid, prefix, names = analysis.grid, analysis.num_prefix_tokens, analysis.prefix_names
    L, T = analysis.num_layers, analysis.num_tokens
    others = [p for p in (samples or []) if p != sample]
    corrupted_upload = None
    if class_names:
        corrupted_upload = file_upload(st, "Corrupted image (this image is the clean one): upload one",
                                       "corrupted_upload", type=UPLOAD_TYPES,
                                       help="Any image; it is seen at the same input size as this one.")
    if not class_names or not (others or corrupted_upload):
        st.info("Patching needs a classifier and a second image: upload one above"
                + (", or pick one of the checkpoint's other sample images." if class_names and others
                   else "." if class_names else "."))
    else:
        corrupted_path = None
        if corrupted_upload is None:
            corrupted_path = st.selectbox("…or one of the sample images", others,
                                          format_func=explorer.sample_label, key=f"corrupted-{model_key}")
        every_position = st.toggle(f"Every layer and token too ({L} × {T} passes)", key="patch_positions")
        try:
            if corrupted_upload is not None:
                data_b = corrupted_upload.getvalue()
                corrupted_key = f"upload-{explorer.image_digest(data_b)}"
                corrupted_image = decode_image(corrupted_key, corrupted_upload.name, invert, data_b)
            else:
                corrupted_key = str(corrupted_path)
                corrupted_image = open_image(Path(corrupted_path).read_bytes(), name=Path(corrupted_path).name)
            patched = patching(fingerprint, image_key, corrupted_key, size, every_position, checkpoint, image,
                               corrupted_image)
        except (ValueError, ImageError, OSError) as e:
            patched = None
            st.warning(escape_markdown(e))
        if patched is not None:
            a, b = class_names[patched.clean_class], class_names[patched.corrupted_class]
            if patched.clean_class == patched.corrupted_class:  # logit[a] - logit[a] is 0 on both: every share 0/0
                st.info(f"Both images are predicted as “{escape_markdown(a)}”, so the logit difference patching "
                        "restores is 0 on each and every share below is undefined (blank). Choose a corrupted "
                        "image the model classifies as something else.")
            st.plotly_chart(figures.layer_head_figure(patched.heads, "Recovered by patching one head",
                                                      "recovered"), theme=None, key="patch_heads")
            if patched.residual is not None and patched.residual_grids:  # stages: each layer's input grid
                cells = drawing.small_multiples(view.small, patched.residual_maps(), view.opacity, view.colormap,
                                                view.mode, scale="shared")
                st.image(drawing.heads_grid_image(cells, columns=min(len(cells), 7),
                                                  labels=[f"layer {i + 1} input" for i in range(L)]),
                         output_format="PNG")
                st.caption("Each layer's input patched one token at a time, on the grid that input is on (the "
                           "previous stage's before a merge or pooling), each cell over the patches it covers.")
            elif patched.residual is not None:
                labels = [drawing.short_token_label(t, grid, prefix, names) for t in range(T)]
                st.plotly_chart(figures.layer_token_figure(patched.residual, labels, "Recovered by patching one "
                                                           "token of one layer's input", "recovered"),
                                theme=None, key="patch_residual")
            st.caption(f"Logit difference {escape_markdown(a)} − {escape_markdown(b)}: "
                       f"{patched.clean_difference:.3g} on this image, {patched.corrupted_difference:.3g}"
                       " on the corrupted one. Each cell: the share of that difference restored when "
                       "this image's activation replaces the corrupted image's there (1 = all of it).")
