"""A clip's view you can send (issue 76, item 8): the link's clip settings (map, frame, query patch) through the
codec, bounded by the clip once it is read, and the clip view as one offline HTML file (frames and maps, a player)."""

import hashlib
import re

import numpy as np
from PIL import Image
from plotly.offline import get_plotlyjs
from test_export import figures, prediction_of

from vit.app import share
from vit.app.export import ClipView, clip_html
from vit.explain.views.overlay import overlay
from vit.explain.views.video import CLIP_KIND_LABELS

DIGEST = hashlib.sha256(b"a clip").hexdigest()


def test_a_clips_view_survives_the_round_trip_through_the_url():
    params = {"model": "videomae", "upload": DIGEST, "map": "temporal", "class": "1", "layer": "3",
              "head": "2", "opacity": "0.45", "ablate": "1.2", "frame": "5", "patch": "5.8.11"}
    values, notes = share.decode(params, {"videomae": "/srv/videomae"}, may_open=True)
    assert notes == [], notes
    assert values["patch"] == (5, 8, 11) and values["frame"] == 5 and values["map"] == "temporal"
    assert share.encode(values) == params


def test_every_clip_map_can_be_named_by_a_link():
    for kind in CLIP_KIND_LABELS:
        assert share.decode({"map": kind}, {}, may_open=False) == ({"map": kind}, [])


def test_a_malformed_query_patch_is_dropped_with_one_line():
    values, [note] = share.decode({"patch": "5.8"}, {}, may_open=False)
    assert values == {} and note == "The link's patch=5.8 was not used: give a clip's query patch as FRAME.ROW.COL " \
                                    "(from 1)."


def test_a_frame_or_patch_past_the_clip_is_dropped_when_the_clip_is_read():
    values, notes = share.fit({"frame": 9, "patch": (2, 15, 1), "class": 1}, layers=2, heads=2, tokens=0, classes=3,
                              clip=(8, 14, 14))
    assert values == {"class": 1}
    assert notes == ["The link's frame=9 was not used: this clip has 8 sampled frames.",
                     "The link's patch=2.15.1 was not used: this clip has 8 frames of 14 x 14 patches."]
    assert share.fit({"frame": 8, "patch": (8, 14, 14)}, layers=2, heads=2, tokens=0, classes=3,
                     clip=(8, 14, 14)) == ({"frame": 8, "patch": (8, 14, 14)}, [])


def test_the_exported_settings_name_the_clips_map_and_query_patch():
    described = share.describe({"map": "temporal", "patch": (5, 8, 11), "frame": 5}, size_label="112",
                               grid=(14, 14), num_prefix_tokens=0, prefix_names=[], class_names=[])
    assert described == {"Map": CLIP_KIND_LABELS["temporal"], "Frame": "5", "Query patch": "frame 5, row 8, col 11"}


def clip_view(frames: int = 4, **changes) -> ClipView:
    rng = np.random.default_rng(0)
    maps = rng.random((frames, 2, 3)).astype(np.float32)
    seen = [Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)) for _ in range(frames)]
    overlays = [overlay(f, m, 0.5, vmin=float(maps.min()), vmax=float(maps.max()))
                for f, m in zip(seen, maps, strict=True)]
    values = dict(title="clip.gif — videomae", overlays=overlays, maps=maps,
                  labels=[f"{i + 1} · frame {2 * i}" for i in range(frames)], caption="Attention of one layer.",
                  shown=2, vmin=float(maps.min()), vmax=float(maps.max()))
    return ClipView(**{**values, **changes})


def test_the_clip_page_holds_every_frame_with_its_map_and_fetches_nothing():
    view = clip_view()
    page = clip_html(view)
    assert get_plotlyjs() in page
    ours = page.replace(get_plotlyjs(), "")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", ours), "a resource the browser would fetch"
    assert "<link" not in ours and not re.search(r"<script[^>]*\ssrc=", ours)
    assert len(re.findall(r'<img[^>]* src="data:image/png;base64,', ours)) == 1 + 4  # the player, the strip's 4
    assert ours.count("data:image/png;base64,") >= 1 + 4 + 4  # and the player's 4 frames to step through
    assert 'id="play"' in ours and 'type="range"' in ours and 'max="3"' in ours and 'value="2"' in ours


def test_the_shown_frame_hovers_its_own_values():
    view = clip_view()
    page = clip_html(view)
    points = figures(page)["map"][0]
    values = points["customdata"]
    if isinstance(values, dict):  # plotly's typed array
        import base64
        values = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    np.testing.assert_allclose(values, view.maps[2].reshape(-1), rtol=1e-6)
    assert points["text"][4] == f"frame 3, row 2, col 2: {view.maps[2, 1, 1]:.4g}"


def test_names_and_captions_with_markup_show_as_written():
    page = clip_html(clip_view(title="<script>alert(1)</script>", caption="<b>x</b> *y*",
                               labels=["</script><script>alert(2)</script>", "b", "c", "d"],
                               prediction=prediction_of([("<img src=x onerror=alert(3)>", 1.0)]),
                               settings={"Clip": "<svg onload=alert(4)>.gif"}))
    for bad in ("<script>alert(1)", "<b>x</b>", "<script>alert(2)", "<img src=x", "<svg onload"):
        assert bad not in page, bad
    assert "&lt;b&gt;x&lt;/b&gt; *y*" in page and "&lt;svg onload=alert(4)&gt;.gif" in page
