"""Issue 62, items 1 and 2: what an input's attention layouts hold (windows, position biases and their indices, shift
masks, pooled queries, the windows a model with stages keeps and the rollout through its merges) counts in the one
memory bound per image, before any work, whatever the token gate allows.

A Swin V2 config.json with ``window_size`` 128 at its own 512 px (16,384 tokens, the token limit) made one forward ask
for 4 GB at once (its position bias and index over 16,384 x 16,384 pairs), and the rollout through Swin's merges
formed each merge as a dense matrix (7.6 GB at 896 px). Each family with a layout runs in a fresh process (forked from
the measuring process, ``peak_memory.run_measured``) under an address-space cap (``RLIMIT_AS``): at a hostile size the
analysis, and a plain forward, are refused before any block runs; at the largest size the bound allows, the analysis
and its maps run and the peak RSS grows by no more than the bound (``VmHWM``, the peak reset first through
``/proc/self/clear_refs``).
"""

import contextlib
import itertools
import json
import resource
from pathlib import Path

import pytest
import torch
from peak_memory import ALLOCATOR_SLACK, MEMORY_GROUP, can_reset_the_peak, run_measured
from PIL import Image

from vit.costs import bounds, plan
from vit.model import ViT
from vit.model.stages import through_merge
from vit.sources.ports.families import import_swin

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MB = 600  # VIT_ANALYSIS_MEMORY_MB in the subprocesses: the cache and chunk alone are 384 MB of it

# The issue's config.json: HF Swin V2, window 128 at 512 px in 4 px patches (108 KB of weights: its bias is an MLP).
ISSUE_SWINV2 = {"model_type": "swinv2", "image_size": 512, "patch_size": 4, "embed_dim": 16, "depths": [2, 2],
                "num_heads": [2, 4], "window_size": 128, "architectures": ["Swinv2ForImageClassification"],
                "num_labels": 3}

# Each family with a layout, as its importer reads a config.json: ``hostile`` is a size whose layouts are over the
# bound (the config's own where it is the attack), ``step`` the sides its windows and poolings accept, ``forward``
# whether a plain forward at ``hostile`` is refused too (its layout alone is over the bound: a bias or mask formed
# whole, not attention a forward forms a chunk at a time).
FAMILIES = {
    "swinv2": dict(importer="swin", config=ISSUE_SWINV2, hostile=512, step=8, forward=True),
    # timm's rule: windows shrink per axis, so every size has some; window 128 over a 128 x 128 grid
    "swin": dict(importer="swin", config={**ISSUE_SWINV2, "model_type": "swin",
                                          "architectures": ["SwinForImageClassification"]},
                 timm=True, hostile=512, step=8, forward=True),
    # Swin-T's window 7 over many tokens (the token gate raised): the rollout through the merges (item 2)
    "swin-w7": dict(importer="swin", config={**ISSUE_SWINV2, "model_type": "swin", "window_size": 7,
                                             "architectures": ["SwinForImageClassification"]},
                    hostile=4032, step=56, forward=False),
    # a global stage keeps each layer's whole attention (4,096 x 4,096 at 512 px), as SAM 2's global blocks do
    "hiera": dict(importer="hiera", config={"image_size": [512, 512], "embed_dim": 16, "depths": [1, 2],
                                            "num_heads": [1, 2], "num_query_pool": 1, "masked_unit_size": [8, 8],
                                            "masked_unit_attention": [True, False], "num_labels": 3,
                                            "architectures": ["HieraForImageClassification"]},
                  hostile=512, step=32, forward=False),
    "sam2": dict(importer="sam2", config={"model_type": "sam2_hiera_det_model", "image_size": [512, 512],
                                          "hidden_size": 16, "embed_dim_per_stage": [16, 32],
                                          "blocks_per_stage": [1, 2], "num_attention_heads_per_stage": [1, 2],
                                          "num_query_pool_stages": 1, "window_size_per_stage": [8, 4],
                                          "global_attention_blocks": [2],
                                          "window_positional_embedding_background_size": [4, 4]},
                 hostile=512, step=32, forward=False),
    # SAM's windows do not shrink: 40 x 40 windows, read one layer at a time (scores and probabilities). Under 513
    # MB, not 600: past 320 px (its rollout's factors not kept) its analysis counts 512.0 to 521.0 MB from 336 to
    # 480 px, so the largest size under 513 is 352 px (7,745 tokens, 512.9 counted, 463.1 MB grown), on the path that
    # 480 px (14,401 tokens, 521.0 counted, 458.9 grown) took under 600: 7.3 s of CPU, not 13.7 (issue 112). The
    # bound is tighter, the estimate held as before; the test holds the size past the factors' path.
    "sam": dict(importer="sam", config={"image_size": 640, "patch_size": 4, "hidden_size": 16,
                                        "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_dim": 32,
                                        "window_size": 40, "global_attn_indexes": [1]},
                hostile=640, step=16, forward=False, kept=304, limit=513),
    # BEiT's bias is formed a query chunk at a time (a global layer's, counted before): a wide model, so the
    # largest size is a few thousand tokens (2,705 at 208 px), not the hundreds of thousands a forward takes minutes
    # over (256 wide, the hidden states kept every 2 layers let it reach 30,977 tokens: 243 s of a busy CI run; 1,024
    # wide, 7,745 tokens at 352 px: 63-72 s, its attention's time growing as tokens squared times width, 2,048 wide
    # the half of that). Under 350 MB, not 500 (4,097 tokens at 256 px: 24.2 s of CPU, 13.8 s now; issue 112): the
    # analysis still runs whole (347 MB counted) and the class map is still refused (728 MB), as under 500.
    "beit": dict(importer="beit", config={"image_size": 64, "patch_size": 4, "hidden_size": 2048,
                                          "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256,
                                          "use_relative_position_bias": True, "num_labels": 3,
                                          "architectures": ["BeitForImageClassification"]},
                 hostile=1024, step=16, forward=False, limit=350),
}

# The families whose analysis growth at their largest size is held to the estimate that picked it (less the allocator's
# slack), not only to the bound: a bound met only because the limit is loose is not met (VIT_ANALYSIS_MEMORY_MB=450
# once picked SAM's 480 px, which grew 458.9 MB). SAM's 40 x 40 windows: the rollout's step over a windowed layer
# (its probabilities, their mean over the heads and two copies of that: 439 MB at 480 px) was not counted, 436.8 MB
# counted in all; test_costs.py's SAM (8 x 8 windows) holds a few MB of it. The other families' estimates are held
# to their peaks in test_costs.py, at its sizes; here not yet measured against theirs. A family's ``kept`` size is
# one on the rollout's path with its factors kept (SAM's up to 320 px), held there too, and within half again of its
# growth: its windows' pattern, not the step over them, is read beside the factors (516 MB counted, 256 grown at
# 304 px while the step was counted there too; 323 now).
ESTIMATE_HELD = ("sam",)
OVER_COUNT = 1.5


def build(importer: str, config: dict, timm: bool = False) -> ViT:
    """A family's model (random weights) from its config.json, as ``vit.sources`` reads it."""
    from dataclasses import replace

    from vit.sources.ports.families import import_beit, import_hiera, import_sam

    read = {"swin": import_swin.config_from_hf, "hiera": import_hiera.config_from_hf,
            "sam2": import_hiera.sam2_config_from_hf, "sam": import_sam.config_from_hf,
            "beit": import_beit.config_from_hf}[importer]
    c = read(config)
    if timm:  # timm's Swin: roll before padding, each axis's window on its own
        c = replace(c, shift_padded=False, window_rule="timm")
    torch.manual_seed(0)
    return ViT(c).eval()


WORKER = r'''
import json, resource, sys
import torch
from PIL import Image
sys.path.insert(0, sys.argv[2])
from peak_memory import peak, start
from test_layout_memory import build
from vit.costs import bounds, memory, plan
from vit.explain.views import attention_maps, image_analysis, method_maps
from vit.checkpoint import Checkpoint, Preprocessing
from vit.explain.methods.stage_maps import relevance_rollout_row
from vit.core.inference import InputSize

spec = json.loads(sys.argv[1])
model = build(spec["importer"], spec["config"], spec.get("timm", False))
c = model.config
checkpoint = Checkpoint(model, [f"class {i}" for i in range(c.num_classes)],
                        Preprocessing(c.image_size, 3, (0.5,) * 3, (0.5,) * 3))
staged, classes = bool(c.stage_depths), c.num_classes > 0
ran = []  # the blocks a forward ran
model_hooks = [(f"blocks.{i}.hook_resid_post", lambda t, hook, i=i: ran.append(i)) for i in range(len(model.blocks))]


def maps(analysis):
    """Every map the explorer draws of this analysis from what it keeps (the class map and LeGrad: ``classes``)."""
    if staged:
        for kind in ("attention", "rollout", "norms"):
            for layer in (0, -1):
                attention_maps.stage_map(analysis, attention_maps.MapSettings(kind=kind, layer=layer, end_layer=layer,
                                                                              query=analysis.num_tokens // 2))
    else:
        for layer in range(analysis.num_layers):
            query = analysis.num_tokens // 2
            attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=layer, query=query))
            attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="norms", layer=layer))
        attention_maps.rollout_map(analysis, attention_maps.MapSettings(kind="rollout", query=analysis.num_tokens // 2))


def class_maps(image, size):
    """The class-specific map (its gradients and their rollout) and, with stages, LeGrad: bounded on their own."""
    relevance = method_maps.class_relevance(checkpoint, image, 0, size)
    if staged:
        relevance_rollout_row(relevance.terms, relevance.layouts, -1, None)  # what stage_map draws for it
        method_maps.model_method_map(checkpoint, image, "legrad", 0, size=size, start_layer=-1)
    else:
        relevance.row(0, -1)


def grown(since):
    return peak() - since


def run(fn):
    """None when ``fn`` ran, else its one-line refusal (TooManyTokens, or a map this model does not support)."""
    try:
        fn()
        return None
    except ValueError as e:
        return str(e)


small = spec["step"] * max(1, 64 // spec["step"])
image = Image.new("RGB", (spec["hostile"], spec["hostile"]), (120, 60, 30))
maps(image_analysis.analyse(checkpoint, image, InputSize(small)))  # lazy imports, threads: before the cap
side = spec["hostile"] - spec["step"]
while side > 0:  # the largest side the bound allows, down from the hostile one
    try:
        image_analysis.view_shape(checkpoint, image, InputSize(side))
        break
    except ValueError:  # over the bound (TooManyTokens), or a side the windows do not tile
        side -= spec["step"]
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
limit = bounds.memory_limit()
resource.setrlimit(resource.RLIMIT_AS, (mapped + limit + 512 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
cost = plan.analysis(model, model.patch_grid(side, side))  # the estimate that picked the side, on the path it picks
out = {"side": side, "limit": limit, "estimate": cost.memory if plan.decide(cost) == "run" else cost.chunked,
       "factors kept": memory.factors_kept(c.num_layers, cost.tokens)}

since = start()
with model.hooks(model_hooks):
    out["analysis refused"] = run(lambda: maps(image_analysis.analyse(checkpoint, image, InputSize(spec["hostile"]))))
    if spec["forward"]:
        x = torch.zeros(1, 3, spec["hostile"], spec["hostile"])
        with torch.inference_mode():
            out["forward refused"] = run(lambda: model(x))
out["blocks run"], out["hostile growth"] = len(ran), grown(since)

since = start()
analysis = image_analysis.analyse(checkpoint, image, InputSize(side))
maps(analysis)
out["analysis growth"] = grown(since)
del analysis
if spec.get("kept"):  # a size whose rollout keeps its factors (``memory.factors_kept``)
    kept = spec["kept"]
    out["kept estimate"] = plan.analysis(model, model.patch_grid(kept, kept)).memory
    since = start()
    maps(image_analysis.analyse(checkpoint, image, InputSize(kept)))
    out["kept growth"] = grown(since)
if classes:
    since = start()
    out["class refused"] = run(lambda: class_maps(image, InputSize(side)))
    out["class growth"] = grown(since)
print(json.dumps(out))
'''


def run_family(name: str) -> dict:
    done = run_measured(WORKER, [json.dumps(FAMILIES[name]), str(ROOT / "tests")], timeout=280, preload=MEMORY_GROUP,
                        VIT_ANALYSIS_MEMORY_MB=str(FAMILIES[name].get("limit", LIMIT_MB)), VIT_MAX_TOKENS="2000000")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_is_refused_over_the_bound_before_any_block_and_stays_under_it_at_its_largest_size(family):
    out = run_family(family)
    mb = 2**20
    # Over the bound: refused in one line naming the bound, before any block ran and before anything was allocated
    refusals = [out["analysis refused"]] + ([out["forward refused"]] if FAMILIES[family]["forward"] else [])
    for refusal in refusals:
        assert refusal is not None and "VIT_ANALYSIS_MEMORY_MB" in refusal and "\n" not in refusal, refusal
    assert out["blocks run"] == 0
    assert out["hostile growth"] < 48 * mb
    # At the largest size the bound allows, the analysis and every map it draws stay under the bound
    assert out["side"] > 0
    assert out["analysis growth"] <= out["limit"], (out["side"], out["analysis growth"] / mb)
    if family in ESTIMATE_HELD:  # and within what the estimate that picked the side counted
        assert out["analysis growth"] - ALLOCATOR_SLACK <= out["estimate"], (
            out["side"], out["analysis growth"] / mb, out["estimate"] / mb)
    if "kept growth" in out:  # at a size with the rollout's factors kept: held, and not counted twice over
        assert not out["factors kept"], out["side"]  # while the largest size is on the other path
        assert out["kept growth"] - ALLOCATOR_SLACK <= out["kept estimate"] <= OVER_COUNT * out["kept growth"], (
            out["kept growth"] / mb, out["kept estimate"] / mb)
    if "class growth" in out and out["class refused"] is None:
        assert out["class growth"] <= out["limit"], (out["side"], out["class growth"] / mb)


@contextlib.contextmanager
def address_space(extra: int):
    """This process's address space capped at what it maps now plus ``extra`` bytes: an allocation past it fails at
    once (where the bound would not refuse), instead of taking the machine's memory."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_the_issues_swin_v2_config_is_refused_before_its_first_block(monkeypatch):
    """``window_size`` 128 at its own 512 px: one window over the whole 128 x 128 grid, whose bias and index were
    built for 16,384 x 16,384 pairs (4 GB asked for at once). Refused in one line; no block runs."""
    model = build("swin", ISSUE_SWINV2)
    ran = []
    hooks = [(f"blocks.{i}.hook_resid_pre", lambda t, hook: ran.append(1)) for i in range(len(model.blocks))]
    x = torch.zeros(1, 3, 512, 512)
    with (torch.inference_mode(), model.hooks(hooks), address_space(1024 * 2**20),
          pytest.raises(bounds.TooManyTokens) as refused):
        model(x)
    message = str(refused.value)
    assert "128×128-patch window (16,384 × 16,384 pairs" in message and "VIT_ANALYSIS_MEMORY_MB" in message
    assert "\n" not in message and not ran
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "8192")  # the bound raised: the same input runs
    assert bounds.layout_memory(model, (128, 128)).peak < 8192 * 2**20


def test_the_explorer_refuses_the_issues_config_for_a_small_upload_at_the_models_own_size():
    """The app's path: a visitor's 64 px upload is analysed at the model's own 512 px."""
    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.explain.views import image_analysis

    model = build("swin", ISSUE_SWINV2)
    checkpoint = Checkpoint(model, ["a", "b", "c"], Preprocessing(512, 3, (0.5,) * 3, (0.5,) * 3))
    with pytest.raises(bounds.TooManyTokens, match=r"position bias and index over its 128×128-patch window.*"
                                                   r"VIT_ANALYSIS_MEMORY_MB"):
        image_analysis.view_shape(checkpoint, Image.new("RGB", (64, 64)))


def test_predict_refuses_the_issues_config_in_one_line(tmp_path, capsys):
    from vit import predict
    from vit.checkpoint import Preprocessing, save_checkpoint

    model = build("swin", ISSUE_SWINV2)
    save_checkpoint(tmp_path / "swinv2.pt", model, ["a", "b", "c"], Preprocessing(512, 3, (0.5,) * 3, (0.5,) * 3))
    Image.new("RGB", (64, 64)).save(tmp_path / "cat.png")
    with address_space(1024 * 2**20):  # refused by the cost model before any image is read: a usage error
        assert predict.main([str(tmp_path / "swinv2.pt"), str(tmp_path / "cat.png")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "16,384 × 16,384 pairs" in line and "VIT_ANALYSIS_MEMORY_MB" in line and "512 px input" in line


def test_a_rollout_row_passes_a_merge_to_the_real_inputs_of_each_merged_token():
    """A 3 x 3 grid merges into 2 x 2 tokens built from 4, 2, 2 and 1 real inputs (the odd sides padded)."""
    row = torch.tensor([[4.0, 2.0, 6.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[1.0, 1.0, 1.0,
                              1.0, 1.0, 1.0,
                              3.0, 3.0, 1.0]], dtype=torch.float64)
    assert torch.equal(through_merge(row, (3, 3)), expected)


def test_sams_analysis_estimate_rises_with_the_size_but_where_its_rollout_changes_path():
    """The issue's SAM (40 x 40 windows, 2 heads) from 320 to 640 px: the estimate never falls as the size rises on
    one path. From 320 to 336 px (6,400 to 7,056 tokens) the rollout's factors (2 layers x T² in float16) pass half
    the layer cache: kept and read as factors below, a row vector through each layer's windows (the rollout's step
    over them, ``bounds.layout_memory``) and a global layer's chunks above. It fell there (the issue's 537 MB at
    320 px and 433 at 400) while the step over the windows was counted on the path with the factors too, beside
    them and their float32 copy (389 MB at 256 px, 168 grown); that path holds the windows' pattern as formed
    beside the factors instead (227 MB), and the estimate rises across the change too."""
    from vit.costs import memory

    spec = FAMILIES["sam"]
    model = build(spec["importer"], spec["config"])
    L = model.config.num_layers
    rows = []
    for side in range(320, 656, 16):
        cost = plan.analysis(model, model.patch_grid(side, side))
        T = cost.tokens
        kept = L * T * T * (2 if T > memory.HALF_PRECISION_TOKENS else 4) <= memory.LAYER_CACHE_BYTES // 2
        path = plan.decide(cost)
        rows.append((side, (kept, path, cost.every), cost.memory if path == "run" else cost.chunked))
    steps = list(itertools.pairwise(rows))
    falls = [(a[0], b[0]) for a, b in steps if b[2] < a[2]]
    assert all(a[1] != b[1] for a, b in steps if b[2] < a[2]), (falls, rows)  # a fall only where the path changes
    assert rows[0][1][0] and not rows[1][1][0] and falls == [], rows  # both paths seen, no fall


# The class map's whole path for a wide model: every block's activations in the graph (``memory.whole_graph_bytes``)
# beside its layers' attention. BEiT 2,048 wide under 300 MB picked 176 px for its analysis, and the class map ran
# whole there (229 MB counted, the attention alone) and grew 469.8 MB. At 96 px (577 tokens) the same miss is 103 MB
# of 123.5 grown (20.3 counted), 26 slacks: the smallest size where it still dominates; counted now 139.8 (1.13 x).
CLASS_WORKER = r'''
import json, sys
sys.path.insert(0, sys.argv[2])
from PIL import Image
from peak_memory import peak, start
from test_layout_memory import build
from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.inference import InputSize
from vit.costs import bounds, plan
from vit.explain.views import method_maps

spec, side, kind = json.loads(sys.argv[1]), int(sys.argv[3]), sys.argv[4]
model = build(spec["importer"], spec["config"])
c = model.config
checkpoint = Checkpoint(model, [f"class {i}" for i in range(c.num_classes)],
                        Preprocessing(c.image_size, 3, (0.5,) * 3, (0.5,) * 3))
image = Image.new("RGB", (side, side), (120, 60, 30))


def draw(size: int) -> None:  # the class map's whole path, or a gradient method's map of the last layer
    if kind == "class":
        method_maps.class_relevance(checkpoint, image, 0, InputSize(size)).row(0, -1)
    else:
        method_maps.model_method_map(checkpoint, image, kind, 0, end_layer=-1, size=InputSize(size))


draw(32)  # lazy imports, a first backward
grid = model.patch_grid(side, side)
cost = plan.class_map(model, grid) if kind == "class" else plan.gradient(model, grid, kind, layers=1)
out = {"path": plan.decide(cost), "estimate": cost.memory, "limit": bounds.memory_limit()}
since = start()
draw(side)
out["growth"] = peak() - since
print(json.dumps(out))
'''
CLASS_SIDE, CLASS_LIMIT_MB = 96, 160
# Every gradient method's estimate counts its layers' activations the same way (``plan.gradient``): the same BEiT's
# Grad-CAM of its last layer at 96 px grew 74.9 MB where 10.2 were counted (its attention alone); 80.1 now (1.07 x).


def measured_run(kind: str) -> None:
    """``kind`` (the class map, or a gradient method of the last layer) drawn for the wide BEiT at ``CLASS_SIDE``
    under ``CLASS_LIMIT_MB``: run whole, its growth under the bound and held to its estimate."""
    done = run_measured(CLASS_WORKER, [json.dumps(FAMILIES["beit"]), str(ROOT / "tests"), str(CLASS_SIDE), kind],
                        timeout=120, preload=MEMORY_GROUP, VIT_ANALYSIS_MEMORY_MB=str(CLASS_LIMIT_MB))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    mb = 2**20
    figures = (out["growth"] / mb, out["estimate"] / mb)
    assert out["path"] == "run", figures  # the whole path chosen under the bound
    assert out["growth"] <= out["limit"], figures
    assert out["growth"] - ALLOCATOR_SLACK <= out["estimate"] <= OVER_COUNT * out["growth"], figures


@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_a_wide_beits_class_map_run_whole_stays_under_the_bound_and_its_estimate():
    measured_run("class")


@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_a_wide_beits_gradcam_stays_under_the_bound_and_its_estimate():
    measured_run("gradcam")
