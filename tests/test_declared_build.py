"""What a config declares is counted before, and while, anything of it is built or allocated (issue 114, items 2 and
3): every whole number under any key is bounded (``declared_number_problem``), the build runs under a module and
time budget (``bounded_build``: UDOP's ``num_decoder_layers`` 10^6, under a key no list names, built a million blocks
on the meta device while the picker described a listed folder), and every tensor of the model built on the meta device
is looked up in the weights' headers before ``from_pretrained`` allocates it (an I-JEPA or SAM 3 config declaring an
``intermediate_size`` its weights do not hold allocated gigabytes before the loading report named the mismatch).

Each hostile folder is a tiny model built and saved by its library (transformers), one value of its config.json
edited, asked in a fresh process (``peak_memory.run_measured``) after its good copy (whose imports the road makes at
first use), its resident-set peak over that start held under ``BOUND_MB``. Measured on 2 busy cores with this file's
worker, before the fix (the call sites of 8d85619) and after: UDOP described by the picker ran past the 180 s given
(killed), after: refused in 5 s, 26 MB; I-JEPA at 10^6 peaked at 837 MB before its refusal (0.0 MB after); at 10^9 it
asked the allocator for 128 GB and came out as a raw allocator error (refused from the JSON after); SAM 3's text tower
at 10^6 peaked at 278 MB and its DETR decoder at 407 MB (0.1 MB after); GLM-4.1V's ``out_hidden_size`` 10^6 asked for
4 TB (0.0 MB after); the picker over the cache below ran past 180 s.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from peak_memory import ROADS, can_reset_the_peak, run_measured

transformers = pytest.importorskip("transformers")
from test_library_path import save_family  # noqa: E402
from test_sam3_concepts import build_sam3  # noqa: E402
from test_vlm_answer import saved_whole  # noqa: E402

from vit.sources.build_bounds import (  # noqa: E402
    MAX_DECLARED,
    MAX_MODULES,
    BuildBoundError,
    bounded_build,
    declared_number_problem,
)

pytestmark = pytest.mark.slow  # transformers' imports, fresh processes

ROOT = Path(__file__).resolve().parents[1]
BOUND_MB = 64  # what asking a hostile folder may grow a fresh process by (its imports made before the start)
WIDE = 10**6  # a declared intermediate_size whose weights hold 32 to 64: 0.25 to 0.8 GB of float32 when allocated


# --- the walk and the budget --------------------------------------------------------------------------------------

def test_a_whole_number_past_the_bound_is_refused_under_any_key_at_any_depth():
    config = {"model_type": "x", "sub": {"list": [3, {"never_heard_of": MAX_DECLARED + 1}]}}
    assert declared_number_problem(config) == (
        f"its config declares sub.list[1].never_heard_of = {MAX_DECLARED + 1:,}, past the {MAX_DECLARED:,} any size a "
        "model here is built with may be")
    assert "= -" in declared_number_problem({"n": -MAX_DECLARED - 1})


def test_numbers_within_the_bound_fractions_and_flags_pass():
    assert declared_number_problem({"vocab_size": 262_208, "rope_theta": 5_000_000, "n": MAX_DECLARED,
                                    "eps": 1e30, "flag": True, "pad_token_id": -1}) is None


def test_a_build_past_the_module_budget_is_stopped_while_it_builds():
    made = []

    def modules():
        for _ in range(3 * MAX_MODULES):
            made.append(1)
            yield torch.nn.Identity()

    with pytest.raises(BuildBoundError, match=f"more than {MAX_MODULES:,} modules") as refusal:
        with bounded_build("hostile"):
            torch.nn.ModuleList(modules())
    assert len(made) == MAX_MODULES + 1 and "\n" not in str(refusal.value)
    torch.nn.ModuleList(torch.nn.Identity() for _ in range(MAX_MODULES + 1))  # outside a budget: nothing counted


def test_a_build_past_its_time_is_stopped_at_its_next_module():
    with pytest.raises(BuildBoundError, match=r"took more than 0 s \(stopped at 1 modules\)"):
        with bounded_build("slow", seconds=0):
            torch.nn.Sequential(torch.nn.Identity())


# --- hostile folders, each asked in a fresh process -------------------------------------------------------------

def udop(folder: Path) -> Path:
    """A tiny UDOP saved by transformers: its decoder's layers are ``num_decoder_layers``, a key no list named."""
    config = transformers.UdopConfig(d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                                     vocab_size=64, image_size=32, patch_size=8, relative_bias_args=[{"type": "1d"}])
    torch.manual_seed(0)
    transformers.UdopForConditionalGeneration(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    """The good tiny folders each hostile one is a copy of."""
    root = tmp_path_factory.mktemp("good")
    return {"ijepa": save_family(root / "ijepa", "ijepa"), "udop": udop(root / "udop"),
            "sam3": build_sam3(root / "sam3"), **saved_whole(tmp_path_factory, ["glm4v"])}


def hostile(good: dict, kind: str, where: str, value, folder: Path) -> Path:
    """A copy of ``good[kind]`` in ``folder`` whose config.json holds ``value`` at ``where`` ("a.b": nested)."""
    shutil.copytree(good[kind], folder)
    config = json.loads((folder / "config.json").read_text())
    *parents, key = where.split(".")
    place = config
    for parent in parents:
        place = place[parent]
    place[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# A fresh process asks the good folder (the imports its road makes at first use: 250 MB and 8 s for UDOP), then, from
# a reset peak, the hostile copy, the way the road asks: what came back each time, what the peak grew by, how long.
WORKER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from peak_memory import peak, start
import vit
from vit.app import catalog

how, good, folder = sys.argv[2:5]
ask = {"describe": lambda f: catalog.describe_library(catalog.Candidate(catalog.Path(f), "hf-cache", "evil/x")),
       "load": lambda f: vit.load(f, device="cpu"), "sam3": vit.open_sam3, "vlm": vit.open_vlm}[how]


def answer(f):
    try:
        return getattr(ask(f), "error", None) or "opened"
    except ValueError as e:  # CheckpointError and its kinds
        return str(e)


opened = answer(good)
begin, clock = start(), time.monotonic()
error = answer(folder)
print(json.dumps({"good": opened, "error": error, "grew_mb": (peak() - begin) / 2**20,
                  "seconds": time.monotonic() - clock}))
'''


HOSTILE = {  # name: (how it is asked, the good folder, where, the value, the refusal)
    "udop-decoder-layers": ("describe", "udop", "num_decoder_layers", 10**6, f"more than {MAX_MODULES:,} modules"),
    "ijepa-wide": ("load", "ijepa", "intermediate_size", WIDE, r"size mismatch for .*fc1.* \(64,\) in the weights"),
    "ijepa-wide-described": ("describe", "ijepa", "intermediate_size", WIDE, "size mismatch"),
    "ijepa-past-the-bound": ("load", "ijepa", "intermediate_size", 10**9, "intermediate_size = 1,000,000,000"),
    "sam3-text": ("sam3", "sam3", "text_config.intermediate_size", WIDE, r"size mismatch for text_encoder\."),
    "sam3-decoder": ("sam3", "sam3", "detr_decoder_config.intermediate_size", WIDE,
                     r"size mismatch for detr_decoder\."),
    "glm4v-tower-out": ("vlm", "glm4v", "vision_config.out_hidden_size", WIDE, r"size mismatch for model\.visual\."),
    "glm4v-past-the-bound": ("vlm", "glm4v", "vision_config.out_hidden_size", 10**9, "out_hidden_size = 1,000,000,000"),
}


@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_folder_is_refused_in_one_line_before_it_grows_the_process(good, tmp_path, name):
    """And the good folder it is a copy of still opens (UDOP is only built here: the library road then refuses it
    in one line, having no embeddings module to count its prefix tokens from)."""
    how, kind, where, value, refusal = HOSTILE[name]
    folder = hostile(good, kind, where, value, tmp_path / name)
    done = run_measured(WORKER, [str(ROOT / "tests"), how, str(good[kind]), str(folder)], timeout=180, preload=ROADS)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["good"] == "opened" or kind == "udop" and "no embeddings module" in out["good"], out["good"]
    assert "\n" not in out["error"] and re.search(refusal, out["error"]), out["error"]
    assert out["grew_mb"] < BOUND_MB, out


def test_a_library_error_building_a_listed_folder_is_listed_as_refused_once(good, tmp_path, monkeypatch):
    """Not only our refusals: whatever the library raises building a folder nobody picked is the entry's one line,
    and the next visit reads the entry kept, not the folder."""
    from vit.app import catalog
    from vit.sources import open as sources

    calls, real = [], sources.open_source

    def failing(path, *args, library_road=False, **kwargs):
        if library_road:
            calls.append(path)
            raise AssertionError("the library's own check\nand its second line")
        return real(path, *args, library_road=library_road, **kwargs)

    monkeypatch.setattr(sources, "open_source", failing)
    folder = shutil.copytree(good["ijepa"], tmp_path / "ijepa")
    candidate = catalog.Candidate(folder, "hf-cache", "org/ijepa")
    first = catalog.describe_current(candidate, library_road=True)
    assert first.error == f"{folder}: AssertionError building it: the library's own check"
    assert catalog.describe_current(candidate, library_road=True) == first and len(calls) == 1


# --- the picker over a cache of hostile folders beside a good one --------------------------------------------------

PICKER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from peak_memory import peak, start
import vit
from vit.app import catalog
from vit.sources import open as sources

cache = catalog.Path(sys.argv[2])
import transformers
transformers.UdopForConditionalGeneration, transformers.IJepaModel  # their modules' imports, before the start
begin = start()
listing = catalog.hf_cache_listing([cache], library_road=True)  # what the explorer's picker lists and describes
described = {c.name: catalog.describe_current(c, library_road=True) for c in listing.candidates}
grew = (peak() - begin) / 2**20
built, real = [], sources.open_source
sources.open_source = lambda *a, **k: built.append(a) or real(*a, **k)
again = {c.name: catalog.describe_current(c, library_road=True) for c in listing.candidates}  # the next visit
good = next(c for c in listing.candidates if c.name == "good/ijepa")
print(json.dumps({"errors": {n: e.error for n, e in described.items()}, "grew_mb": grew, "rebuilt": len(built),
                  "same": again == described, "opens": vit.load(str(good.path), device="cpu").road}))
'''


def cached(root: Path, name: str, folder: Path) -> None:
    """``folder`` moved into the HF cache ``root`` as huggingface_hub lays out the model ``name``."""
    model = root / f"models--{name.replace('/', '--')}"
    (model / "refs").mkdir(parents=True)
    (model / "refs" / "main").write_text("rev1")
    (model / "snapshots").mkdir()
    shutil.move(folder, model / "snapshots" / "rev1")


@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_the_picker_lists_each_hostile_folder_as_refused_once_and_the_good_model_still_opens(good, tmp_path):
    """The picker's description (``describe_current``, what the explorer's home page calls for every listed folder,
    with or without the token) of a cache holding a hostile folder of each kind beside a good one."""
    cache = tmp_path / "hub"
    for name in ("udop-decoder-layers", "ijepa-wide", "ijepa-past-the-bound"):
        _, kind, where, value, _ = HOSTILE[name]
        cached(cache, f"evil/{name}", hostile(good, kind, where, value, tmp_path / name))
    shutil.copytree(good["ijepa"], tmp_path / "good")
    cached(cache, "good/ijepa", tmp_path / "good")
    done = run_measured(PICKER, [str(ROOT / "tests"), str(cache)], timeout=180, preload=ROADS)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errors"]["good/ijepa"] is None and out["opens"] == "library"
    refused = {n: e for n, e in out["errors"].items() if n != "good/ijepa"}
    assert len(refused) == 3 and all(e and "\n" not in e for e in refused.values()), out
    assert out["grew_mb"] < BOUND_MB and out["rebuilt"] == 0 and out["same"], out
