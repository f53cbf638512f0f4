"""The cost model (``vit.costs``) against what the work holds: for a tiny model of every family and each view, at
three input sizes, the estimate bounds the measured peak and is within a factor of 1.5 of it (issue 67, item 2).

The peak is the resident set's high-water mark over the resident set just before the view (tests/peak_memory.py),
in a fresh process per family and view (forked from one measuring process that imported everything once:
``peak_memory.run_measured``) that loaded the model first and ran the view once at a small size (``warm``).

A resident set is not a count of tensors: pages, allocator headers, arenas and what a BLAS keeps move it by up to
``ALLOCATOR_SLACK`` from one process or machine to the next (measured: bench/bench_memory_noise.py). The bound
allows that much once, and every compared cell is sized so its estimate is at least ``DOMINATES`` times it: there
the view's tensors, not the machine, decide the answer (an estimate equal to a 16-MB peak to the shown digit once
failed on another machine).
"""

from __future__ import annotations

import json

import pytest
from peak_memory import ALLOCATOR_SLACK, MEMORY_GROUP, ROOT, can_reset_the_peak, run_measured

from vit.costs import plan
from vit.model import ViT

# px in 4-px patches, per view: three sizes at which every family's estimate is at least DOMINATES x the slack
# (tests/test_costs.py::test_every_compared_cell_is_sized_so_the_view_dominates_the_slack), no larger: a view's time
# grows with the square of its tokens. The analysis's first two sizes keep every layer's rollout factor (in float16,
# past 1,024 tokens), the third reads attention in chunks: for the 2-layer ViTs the path changes past 6,476 tokens,
# where their two factors pass half the layer cache (``memory.LAYER_CACHE_BYTES``); 328 px is the first 8-px step past
# it (6,725 tokens: 29 MB counted for the ViT, seven slacks). At 320, 352 and 384 px (the factors at the cache's edge,
# then chunks twice) the ViTs' analyses took 13.6 s of CPU each and BEiT's 26.8; at 192, 256 and 328, 7.4 and 11.0
# (measured, both paths still measured; issue 112). The factors' two from 160 px (1,601 tokens, past float16's edge:
# 25.3 MB counted for the ViT, 23.4 measured, six slacks) and 224, not 192 and 256 (0.56 and 1.26 s of CPU each; the
# cells before and after: bench/results/cpu-2026-11-29g/memory-group-*.txt). Breaking the count (the rollout's running
# T² left out) fails the ViT's 160 and 224 px cells (15.5 and 45.9 MB counted against 23.4 and 80.7 measured). The
# class map runs in chunks at all three for the 2-layer ViTs (``LIMIT_OF``: their whole path holds 601 MB at 224 px),
# whole for the staged families. AttnLRP's paths from 224 px, where the checkpointed one's estimate is first over five
# slacks (21.4 MB for the ViT, 23.0 for DINOv2 with registers; 15.8 and 16.9 at 192), in 32-px steps: at 256, 320 and
# 384 px its two cells took 14 s of CPU each (issue 112). The forward and LeGrad from 352 px, not 384: 20.3 MB counted
# for the plain ViTs there (5.1 slacks), 18.5 measured for their forwards (the count 1.10 x it), 17.2 for the ViT's
# LeGrad (1.18 x); the counts' streams halved (``memory.BLOCK_COPIES`` 4) fail the ViT's forward at all three
# (12.8-17.8 MB against 18.5-25.9). The staged families' there: 24.7-28.5 MB counted, 1.31-1.39 x the peak.
SIDES = {"forward": (352, 384, 416), "analysis": (160, 224, 328), "class": (256, 288, 320),
         "legrad": (352, 384, 416), "attnlrp": (224, 256, 288), "attnlrp-checkpointed": (224, 256, 288)}
# Where a family's view dominates the slack at smaller sizes, or needs larger ones: (family, view) -> its sides.
# BEiT's and SAM's forwards (and BEiT's LeGrad) form their position biases a query chunk at a time past 2,896 tokens
# (``memory.bias_chunk_bytes``: two heads' rows of 64 MB), 75-139 MB counted from 224 px (3,137 tokens) on, so 224-256
# px, on that path as 256-320 were (measured 134.5-136.6 MB for BEiT's forward, the count 1.01-1.02 x it; SAM's
# 71.4-73.2, 1.05-1.08; BEiT's LeGrad 135.0-136.8, 1.08-1.11: the slack a 33rd to an 18th of it); at 448-576 px they
# took 48 of the memory tests' 490 s (idle). The bias's heads counted at half fails BEiT's and SAM's forwards at all
# three (BEiT's at 104-107 MB, SAM's at 43-47, against the peaks above). Their analyses, and Qwen2.5-VL's (its
# windows), at 192, not 160 px: their counts there are 1.51-1.66 x the peak (safe, past the factor), at 192 1.21-1.28;
# 192 px keeps the bias whole (2,305 tokens), 224 in query chunks, both paths measured as 192 and 256 did.
# Qwen2.5-VL's forward from 288 px (26.3 MB counted, 20.1 measured), not 384 (47 MB). BEiT's class map keeps 384 px,
# which it refuses (the refusal's line is checked). Hiera's forward counts 20 MB at 384 px, too near the bound.
# DINOv2's LeGrad (its registers and layer scale) counts 23 MB from 256 px, where the ViT's counts 24 MB only at 384
# (issue 112). The staged families' analyses keep their windows, not rollout factors: 19 MB at 256 px for Swin, under
# five slacks, so they keep 320-384 px. The 2-layer ViTs' class maps from 224 px, in chunks under ``LIMIT_OF``'s bound
# (29 MB counted there, 1.35 x its peak; 22.9 at 192 px, where the count is 1.46 x the peak, too near the factor): the
# sizes measured at 256, 288 and 320 px took 3.3, 4.6 and 7.0 s of CPU, at 224 px 2.0 (issue 112).
SIDES_OF = {("beit", "forward"): (224, 240, 256), ("beit", "legrad"): (224, 240, 256),
            ("sam", "forward"): (224, 240, 256), ("beit", "class"): (256, 320, 384),
            ("qwen2.5-vl", "forward"): (288, 320, 352), ("beit", "analysis"): (192, 224, 328),
            ("sam", "analysis"): (192, 224, 328), ("qwen2.5-vl", "analysis"): (192, 224, 328),
            ("hiera", "forward"): (416, 448, 480), ("dinov2-registers", "legrad"): (256, 288, 320),
            ("swin", "analysis"): (320, 352, 384), ("swinv2", "analysis"): (320, 352, 384),
            ("hiera", "analysis"): (320, 352, 384),
            ("vit", "class"): (224, 240, 256), ("dinov2-registers", "class"): (224, 240, 256)}
# The memory bound (VIT_ANALYSIS_MEMORY_MB) a cell is measured under, where not the default 1,024 MB: the 2-layer
# ViTs' class maps under 256 MB, so that ``decide`` takes the path in chunks from 224 px (its whole path, 601 MB
# there, is over it), the path they take past 4,096 tokens under the default bound. The count in chunks does not
# read the bound (``plan.chunked_gradient``): the same count and path, at a quarter of the tokens squared.
LIMIT_OF = {("vit", "class"): 256, ("dinov2-registers", "class"): 256}


def sides(family: str, view: str) -> tuple[int, ...]:
    """The sizes ``view`` of ``family`` is measured at (px)."""
    return SIDES_OF.get((family, view), SIDES[view])


def cell_env(family: str, view: str) -> dict[str, str]:
    """The environment ``view`` of ``family`` is measured (and its cells sized) under: the token gate raised, and
    ``LIMIT_OF``'s memory bound where it has one."""
    limit = LIMIT_OF.get((family, view))
    return {"VIT_MAX_TOKENS": "2000000", **({"VIT_ANALYSIS_MEMORY_MB": str(limit)} if limit else {})}


WARM = 64  # px: each view runs once at this size before the measures (256 patches)
DOMINATES = 5  # every compared cell's estimate is at least this many slacks: the slack is at most a fifth of it
VIEWS = ("forward", "analysis", "class", "legrad")
D = 64  # wide enough that a view's tensors, not the allocator's pages, are what is measured

# Each family as its importer reads a config.json (vit.sources), 4-px patches.
FAMILIES = {
    "vit": ("hf", dict(image_size=32, patch_size=4, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2,
                       num_attention_heads=2, num_labels=3), "ViTForImageClassification"),
    "dinov2-registers": ("hf", dict(image_size=32, patch_size=4, hidden_size=D, mlp_ratio=2, num_hidden_layers=2,
                                    num_attention_heads=2, num_register_tokens=4, num_labels=3),
                         "Dinov2WithRegistersForImageClassification"),
    "swin": ("swin", {"model_type": "swin", "image_size": 64, "patch_size": 4, "embed_dim": 32, "depths": [2, 2],
                      "num_heads": [2, 4], "window_size": 8, "architectures": ["SwinForImageClassification"],
                      "num_labels": 3}, None),
    "swinv2": ("swin", {"model_type": "swinv2", "image_size": 64, "patch_size": 4, "embed_dim": 32,
                        "depths": [2, 2], "num_heads": [2, 4], "window_size": 8,
                        "architectures": ["Swinv2ForImageClassification"], "num_labels": 3}, None),
    "beit": ("beit", {"image_size": 32, "patch_size": 4, "hidden_size": D, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "intermediate_size": 2 * D, "use_relative_position_bias": True,
                      "num_labels": 3, "architectures": ["BeitForImageClassification"]}, None),
    "sam": ("sam", {"image_size": 64, "patch_size": 4, "hidden_size": D, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "mlp_dim": 2 * D, "window_size": 8, "global_attn_indexes": [1]}, None),
    "hiera": ("hiera", {"image_size": [64, 64], "embed_dim": 32, "depths": [1, 2], "num_heads": [1, 2],
                        "num_query_pool": 1, "masked_unit_size": [8, 8], "masked_unit_attention": [True, False],
                        "num_labels": 3, "architectures": ["HieraForImageClassification"]}, None),
    "siglip2-naflex": ("siglip", {"model_type": "siglip2", "vision_config": dict(
        hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2, num_attention_heads=2, patch_size=4,
        num_patches=64)}, None),
    "qwen2.5-vl": ("qwen", {"model_type": "qwen2_5_vl", "vision_config": dict(
        depth=3, hidden_size=D, intermediate_size=2 * D, num_heads=2, out_hidden_size=24, patch_size=4,
        spatial_merge_size=2, window_size=32, fullatt_block_indexes=[1])}, None),
}


def build(family: str) -> ViT:
    """The family's tiny model (random weights) from its config.json, as ``vit.sources`` reads it."""
    import torch

    from vit.sources.ports.families import hf, import_beit, import_hiera, import_sam, import_siglip, import_swin
    from vit.sources.vlm import import_qwen

    kind, config, architecture = FAMILIES[family]
    read = {"hf": lambda c: hf.config_from_hf(c, architecture), "swin": import_swin.config_from_hf,
            "hiera": import_hiera.config_from_hf, "sam": import_sam.config_from_hf,
            "beit": import_beit.config_from_hf, "siglip": import_siglip.config_from_hf,
            "qwen": import_qwen.config_from_hf}[kind]
    torch.manual_seed(0)
    return ViT(read(config)).eval()


def estimate(model, view: str, grid: tuple[int, int]) -> int:
    """The cost model's bytes for ``view``: the path ``decide`` picks (the class map's and AttnLRP's whole or chunked
    one); ``attnlrp-checkpointed``: AttnLRP's checkpointed path, whatever ``decide`` picks."""
    cost = {"forward": plan.forward, "analysis": plan.analysis, "class": plan.class_map,
            "legrad": lambda m, g: plan.legrad(m, g, -1), "attnlrp": plan.attnlrp,
            "attnlrp-checkpointed": plan.attnlrp}[view](model, grid)
    if view == "attnlrp-checkpointed":
        return cost.chunked
    return cost.memory if plan.decide(cost) == "run" else cost.chunked


WORKER = r'''
import json, sys
from unittest import mock
sys.path.insert(0, sys.argv[2])
import torch
from PIL import Image
from peak_memory import peak, start
from test_costs import WARM, build, estimate, sides
from vit.checkpoint import Checkpoint, Preprocessing
from vit.costs import plan
from vit.explain.views import attention_maps, image_analysis, method_maps
from vit.explain.methods.stage_maps import relevance_rollout_row
from vit.core.inference import InputSize, preprocess

model = build(sys.argv[1])
c = model.config
checkpoint = Checkpoint(model, [f"class {i}" for i in range(c.num_classes)],
                        Preprocessing(c.image_size, 3, (0.5,) * 3, (0.5,) * 3))
staged = bool(c.stage_depths)
view = sys.argv[3]
SIDES = sides(sys.argv[1], view)


def maps(analysis):
    """Every map the explorer draws from what the analysis keeps."""
    middle = analysis.num_tokens // 2
    if staged:
        for kind in ("attention", "rollout", "norms"):
            for layer in (0, -1):
                attention_maps.stage_map(analysis, attention_maps.MapSettings(kind=kind, layer=layer, end_layer=layer,
                                                                              query=middle))
        return
    for layer in range(analysis.num_layers):
        attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=layer, query=middle))
        attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="norms", layer=layer))
    attention_maps.rollout_map(analysis, attention_maps.MapSettings(kind="rollout", query=middle))


def run(view, image, size):
    if view == "forward":  # vit.predict's
        with torch.inference_mode():
            model(preprocess([image], checkpoint.preprocessing, size, c.patch_size))
    elif view == "analysis":
        maps(image_analysis.analyse(checkpoint, image, size))
    elif view == "class":
        relevance = method_maps.class_relevance(checkpoint, image, 0, size)
        if staged:
            relevance_rollout_row(relevance.terms, relevance.layouts, -1, None)
        else:
            relevance.row(0, -1)
    elif view == "attnlrp-checkpointed":  # its path past the whole one's bound, at any size
        with mock.patch.object(plan, "decide", lambda cost: "chunks"):
            method_maps.model_method_map(checkpoint, image, "attnlrp", 0, size=size)
    else:
        method_maps.model_method_map(checkpoint, image, view, 0, size=size, start_layer=-1)


def warm(view, image):
    """Lazy imports, thread pools, autograd's first pass (~40 MB once): before measuring, at a small size (the cost
    of these is the process's, not the size's), the class map's and AttnLRP's paths in chunks as well as their
    whole ones (a first checkpointed backward holds ~150 MB more, once); the
    forward at the first size measured (its matrix products' workspace grows with it the first time, ~0.4 MB at
    2,304 tokens, which a forward's estimate has no room for)."""
    run(view, image, InputSize(SIDES[0] if view == "forward" else WARM))  # a forward's, cheap, at the first size
    if view in ("class", "attnlrp") and not staged:
        with mock.patch.object(plan, "decide", lambda cost: "chunks"):
            run(view, image, InputSize(WARM))


image = Image.new("RGB", (SIDES[-1], SIDES[-1]), (120, 60, 30))
out = []
try:
    warm(view, image)
except ValueError as e:  # a view this family refuses for what it is (not for its size)
    out.append({"view": view, "refused": str(e)})
    print(json.dumps(out))
    sys.exit(0)
for side in SIDES:
    since = start()
    try:
        run(view, image, InputSize(side))
    except ValueError as e:
        out.append({"view": view, "side": side, "refused": str(e)})
        continue
    out.append({"view": view, "side": side, "measured": peak() - since,
                "estimate": estimate(model, view, model.patch_grid(side, side))})
print(json.dumps(out))
'''


def default_views(family: str) -> tuple[str, ...]:
    """The forward and the analysis, and a classifier's class map and LeGrad."""
    return ("forward", "analysis") + (("class", "legrad") if build(family).config.num_classes else ())


def measure(family: str, views: tuple[str, ...] = ()) -> list[dict]:
    """Each of ``views`` (default: forward, analysis, and a classifier's class map and LeGrad) of ``family``'s model
    at each of its ``sides``: its measured peak and estimate, or its refusal; each view in a fresh process, so no
    view runs on what an earlier one left mapped."""
    rows: list[dict] = []
    for view in views or default_views(family):
        done = run_measured(WORKER, [family, str(ROOT / "tests"), view], timeout=280, preload=MEMORY_GROUP,
                            **cell_env(family, view))
        assert done.returncode == 0, done.stderr[-3000:]
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    return rows


# The cells (family, view, side) whose estimate is still off the bound, each with why; none now. A cell listed here
# must be off: the test fails when it is within the bound again (strict), so the list only shrinks. Fix the
# estimate (vit.costs), do not widen this.
STILL_OFF: dict[tuple[str, str, int], str] = {}


def within(row: dict) -> bool:
    """Whether a measured row's estimate bounds its peak less the allocator's slack and is at most 1.5 x the peak."""
    return row["measured"] - ALLOCATOR_SLACK <= row["estimate"] <= 1.5 * row["measured"]


def measured_again_where_off(family: str, views: tuple[str, ...], rows: list[dict]) -> list[dict]:
    """``rows``, where a cell off the bound is measured once more, in a fresh process, and that measure kept: an
    estimate that is wrong is off in both. Under load a small cell's peak once came out a third under what its
    neighbours imply (gate 13 of 2026-11-26: vit's forward at 512 px, 27.3 MB between 30.1 at 448 and 49.6 at 576;
    alone it measured within the bound)."""
    if all(within(r) for r in rows if "measured" in r):
        return rows
    again = {(r["view"], r["side"]): r for r in measure(family, views) if "measured" in r}
    return [again.get((r["view"], r["side"]), r) if "measured" in r and not within(r) else r for r in rows]


def assert_within_the_bound(family: str, rows: list[dict]) -> None:
    """Every measured cell of ``rows`` (``measure``'s) bounds its measured peak less the allocator's slack and is at
    most 1.5 x the peak, bar ``STILL_OFF``'s, which must still be off; every refusal one line."""
    measured = [r for r in rows if "measured" in r]
    cells = {(family, r["view"], r["side"]): (round(r["measured"] / 2**20, 1), round(r["estimate"] / 2**20, 1),
                                              within(r))
             for r in measured}
    off = {cell: figures[:2] for cell, figures in cells.items() if not figures[2] and cell not in STILL_OFF}
    assert not off, f"(family, view, side): (measured MB, estimated MB) off the bound: {off}"
    views = {r["view"] for r in rows}
    listed = [cell for cell in STILL_OFF if cell[0] == family and cell[1] in views]
    assert all(cell in cells for cell in listed), f"not measured, take them off STILL_OFF: {listed}"
    back = {cell: cells[cell][:2] for cell in listed if cells[cell][2]}
    assert not back, f"within the bound now, take them off STILL_OFF: {back}"
    for r in rows:  # a refusal is the view's one line (a family a map does not support), never a size's
        assert "refused" not in r or "\n" not in r["refused"], r


# (family, view) for every family's default_views, one test each: one fresh process of at most a minute on a busy
# two-core machine, where a family's four in one test took up to 230 s idle and passed the test's deadline under load.
# A classifier is a family whose config names its labels (default_views reads the built model: the test below holds
# the two equal).
CELLS = [(family, view) for family, (_, config, _) in FAMILIES.items()
         for view in ("forward", "analysis") + (("class", "legrad") if "num_labels" in config else ())]


def test_the_measured_cells_are_every_familys_default_views():
    assert CELLS == [(family, view) for family in FAMILIES for view in default_views(family)]


@pytest.mark.slow
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
@pytest.mark.parametrize("family, view", CELLS)
def test_the_estimate_of_every_view_bounds_its_measured_peak_within_a_factor_of_one_and_a_half(family, view):
    rows = measure(family, (view,))
    if view in ("forward", "analysis"):  # every family has both: measured, not refused
        assert {r["view"] for r in rows if "measured" in r} == {view}, rows
    assert_within_the_bound(family, measured_again_where_off(family, (view,), rows))


def test_every_compared_cell_is_sized_so_the_view_dominates_the_slack(monkeypatch):
    """Each family's views at their ``sides`` count at least ``DOMINATES`` allocator slacks (whichever path
    ``decide`` picks there): a size at which a few MB of pages decide the comparison tests the machine, not the
    estimate."""
    small = {}
    for family in FAMILIES:
        model = build(family)
        views = default_views(family) + (("attnlrp", "attnlrp-checkpointed") if family in ATTNLRP_FAMILIES else ())
        for view in views:
            monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB", raising=False)
            for name, value in cell_env(family, view).items():  # as measure's processes
                monkeypatch.setenv(name, value)
            for side in sides(family, view):
                try:
                    need = estimate(model, view, model.patch_grid(side, side))
                except ValueError:  # the family refuses the view (the measured test checks that refusal's line)
                    continue
                if need < DOMINATES * ALLOCATOR_SLACK:
                    small[(family, view, side)] = round(need / 2**20, 1)
    assert not small, f"(family, view, side): estimated MB under {DOMINATES} slacks: {small}"


# AttnLRP's families: the plain ViT and DINOv2 with registers (layer scale, four more prefix tokens), ~7 s each.
# BEiT's bias is counted as before, safe and not fitted (its whole path measured 1.5 to 2.3 times under the count,
# its checkpointed one 1.0 to 1.7), Swin's and Hiera's stages by ``plan.gradient``: neither is held here.
ATTNLRP_FAMILIES = ("vit", "dinov2-registers")


@pytest.mark.slow
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
@pytest.mark.parametrize("family", ATTNLRP_FAMILIES)
def test_the_estimate_of_each_attnlrp_path_bounds_its_measured_peak_within_a_factor_of_one_and_a_half(family):
    """The whole path (``decide``'s at these sizes: every block's graph under the rules) and the checkpointed one
    (forced: each block's input, one block's graph at a time)."""
    model = build(family)
    assert all(plan.decide(plan.attnlrp(model, model.patch_grid(side, side))) == "run"
               for side in sides(family, "attnlrp"))
    rows = measure(family, ("attnlrp", "attnlrp-checkpointed"))
    assert {(r["view"], r["side"]) for r in rows if "measured" in r} == {
        (view, side) for view in ("attnlrp", "attnlrp-checkpointed") for side in sides(family, view)}, rows
    assert_within_the_bound(family, measured_again_where_off(family, ("attnlrp", "attnlrp-checkpointed"), rows))


def test_decide_runs_attnlrp_whole_while_it_fits_then_with_checkpointed_blocks_then_refuses(monkeypatch):
    model = build("vit")  # 2 layers, 64 wide, MLP 128, 4-px patches
    grid = (48, 48)  # 2,305 tokens of a 192-px image
    pixels = 4 * 3 * 192 * 192 * 4  # the input's four copies
    # every block's graph (10 streams and 2 MLP widths a token each), the backward's gradients (4 and 2)
    whole = 4 * 2305 * (2 * (10 * 64 + 2 * 128) + 4 * 64 + 2 * 128) + pixels
    # each block's input and the last one's output, one block's graph, the backward's gradients
    checkpointed = 4 * 2305 * (3 * 64 + (10 * 64 + 2 * 128) + 4 * 64 + 2 * 128) + pixels
    cost = plan.attnlrp(model, grid)
    assert (cost.memory, cost.chunked) == (whole, checkpointed)  # no H x T² (4 x 2 x 2 x 4 x 2,305² = 340 MB)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(whole / 2**20))
    assert plan.decide(plan.attnlrp(model, grid)) == "run"
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((whole - 1) / 2**20))
    assert plan.decide(plan.attnlrp(model, grid)) == "chunks"
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((checkpointed - 1) / 2**20))
    with pytest.raises(plan.TooManyTokens, match=r"AttnLRP keeps each block's input and one block's graph: about 16 "
                                                 r"MB at 2,305 tokens.*the largest square input that fits is 188 px"):
        plan.decide(plan.attnlrp(model, grid))


def test_decide_runs_the_class_map_whole_while_it_fits_and_in_chunks_past_it(monkeypatch):
    model = build("vit")
    grid = (48, 48)  # 2,305 tokens: 2 layers x 2 heads of whole attention and gradient, 4 x 4 x 4 x 2,305² bytes,
    # beside every block's activations (64 wide, its MLP 128): 2 layers x (11 x 64 + 2 x 128) and 4 x 64 floats a token
    whole = 4 * 2 * 2 * 4 * 2305 ** 2 + 4 * 2305 * (2 * (11 * 64 + 2 * 128) + 4 * 64)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(whole / 2**20))
    assert plan.decide(plan.class_map(model, grid)) == "run"
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((whole - 1) / 2**20))
    assert plan.decide(plan.class_map(model, grid)) == "chunks"
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "1")
    with pytest.raises(plan.TooManyTokens, match="The class-specific map keeps every layer's input and gradient"):
        plan.decide(plan.class_map(model, grid))


def test_a_gradient_through_windows_counts_each_windowed_layer_by_its_windows_not_t_squared(monkeypatch):
    model = build("qwen2.5-vl")  # 3 layers x 2 heads; layers 0 and 2 in 8 x 8-patch windows, layer 1 global
    grid = (16, 16)  # 256 tokens: 4 windows of 64 slots; the global layer 256²
    need = 4 * 2 * 4 * (256 ** 2 + 2 * 4 * 64 ** 2)  # every layer's attention and gradient, four copies each
    # beside every block's activations (64 wide, its MLP 128): 3 layers x (11 x 64 + 2 x 128) and 4 x 64 floats a token
    need += 4 * 256 * (3 * (11 * 64 + 2 * 128) + 4 * 64)
    assert plan.gradient(model, grid, "AttnLRP").memory == need  # (layers x T² would be 6,291,456 beside them)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((need - 1) / 2**20))
    # the largest square that fits: 14 x 14 patches (196² + 2 layers x 4 ragged windows of 64 slots; 196 tokens'
    # activations), 56 px
    with pytest.raises(plan.TooManyTokens, match=r"about 6 MB at 256 tokens.*the largest square input that fits is "
                                                 r"56 px"):
        plan.decide(plan.gradient(model, grid, "AttnLRP"))
