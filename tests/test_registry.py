"""The registry (``vit.registry``) is the one list of what exists: every map the code draws is in it and every
method in it is drawn or refused in one line; every config.json model_type the loader opens is a family of it, read
by the importer it names; each method names a test that exists and a cost the cost model has; the docs' tables are
its rows in the explorer's order."""

import ast
import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit import api, registry
from vit.checkpoint import Checkpoint, Preprocessing
from vit.explain.views import attention_maps, method_maps
from vit.model import ViT, ViTConfig

ROOT = Path(__file__).resolve().parent.parent
NAMES = {m.name for m in registry.BUILTIN_METHODS}


def compared_names(function, names=("kind", "method")) -> set[str]:
    """The strings ``function``'s source compares ``kind`` / ``method`` / ``s.kind`` with (``==``, ``in (...)``):
    the method keys it dispatches on."""
    found = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        subject = left.id if isinstance(left, ast.Name) else left.attr if isinstance(left, ast.Attribute) else None
        if subject not in names:
            continue
        for comparator in node.comparators:
            values = comparator.elts if isinstance(comparator, (ast.Tuple, ast.List, ast.Set)) else [comparator]
            found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


@pytest.mark.parametrize("function", [method_maps.model_method_map, attention_maps.attention_map,
                                      attention_maps.stage_map, api.explain, method_maps.plugin_map],
                         ids=lambda f: f.__name__)
def test_every_method_the_code_dispatches_on_is_registered(function):
    assert compared_names(function) <= NAMES, compared_names(function) - NAMES


def test_the_old_lists_are_the_registrys():
    maps = [m for m in registry.BUILTIN_METHODS if m.group != "words"]
    assert list(attention_maps.MAP_KINDS) == [m.name for m in maps]
    assert {k: attention_maps.MAP_CONTROLS[k] for k in attention_maps.MAP_KINDS} == {m.name: m.reads for m in maps}
    assert set(attention_maps.METHOD_MAP_KINDS) == {m.name for m in maps if m.own_pass}
    assert set(attention_maps.STAGE_MAP_KINDS) <= set(attention_maps.MAP_KINDS)
    assert set(vit.methods()) == NAMES  # the notebook's list is the registry's, typed-label maps included


def tiny(classes: int, **options) -> Checkpoint:
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_classes=classes, hidden_size=16, num_layers=2, num_heads=2,
                       mlp_size=32, **options)
    return Checkpoint(model=ViT(config).eval(), class_names=[f"c{i}" for i in range(classes)],
                      preprocessing=Preprocessing.default_for(config))


@pytest.mark.parametrize("checkpoint", [tiny(3), tiny(0)], ids=["classifier", "features"])
def test_every_registered_method_is_drawn_or_refused_in_one_line(checkpoint):
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    for method in registry.BUILTIN_METHODS:
        try:
            drawn = vit.explain(checkpoint, photo, method.name)
        except ValueError as e:
            assert str(e) and "\n" not in str(e), (method.name, str(e))
            assert method.name not in vit.methods(checkpoint)  # refused: not offered for this model
        else:
            pixels = (16, 16)  # a pixel method's map: the 16-px input's pixels (issue 90, item 3)
            assert drawn.map.shape == (pixels if method.pixels else (4, 4)), method.name
            assert drawn.patch_sums().shape == (4, 4) and method.name in vit.methods(checkpoint), method.name


def test_an_unknown_method_is_refused_naming_every_registered_map():
    with pytest.raises(ValueError, match="unknown method 'nope'; choose one of: attention, rollout") as e:
        attention_maps.method_of("nope")
    assert all(m.name in str(e.value) for m in registry.BUILTIN_METHODS if m.group != "words")


def test_each_method_names_a_test_that_exists_and_a_cost_the_cost_model_has():
    from vit.costs import plan

    for method in registry.BUILTIN_METHODS:
        path, _, name = method.test.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, method.test
        assert method.cost is None or callable(getattr(plan, method.cost, None)), method.cost
        assert method.group in registry.GROUPS and set(method.reads) <= set(registry.CONTROLS), method.name
        assert method.paper and method.code and method.applies_to and method.module, method.name
        assert method.class_specific == ("class" in method.reads) or method.group == "words", method.name


def test_every_model_type_the_loader_opens_is_a_family_read_by_the_importer_it_names():
    from vit.sources import open as sources

    importers = {t: f.importer for f in registry.BUILTIN_FAMILIES for t in f.hf_model_types}
    assert sorted(sources.HF_MODEL_TYPES) == sorted(importers)
    opened = {**dict.fromkeys(sources._HF_MODEL_TYPES, "vit.sources.ports.families.hf"),
              **{t: module.__name__ for t, (module, _) in sources.HF_FAMILIES.items()},
              **{t: module.__name__ for t, module in sources.VLM_MODULES.items()}}
    assert opened == importers
    assert registry.hf_model_types() == tuple(importers)  # no plugin here


def test_every_importer_the_loader_imports_is_a_familys_and_each_family_names_a_module():
    from vit.sources import open as sources
    from vit.sources import open_hf, open_libraries, open_shared

    # The opener is four modules (by road); an importer is a module named import_*, wherever it lives (the ports'
    # families and libraries, the VLMs). Until this was checked by that name the test filtered on a package prefix
    # the importers had left, and passed on an empty set.
    imported = {v.__name__ for opener in (sources, open_hf, open_libraries, open_shared)
                for v in vars(opener).values() if inspect.ismodule(v)
                and v.__name__.startswith("vit.") and v.__name__.rpartition(".")[2].startswith("import_")}
    named = {f.importer for f in registry.BUILTIN_FAMILIES}
    assert len(imported) >= 15 and imported <= named, imported - named
    for family in registry.BUILTIN_FAMILIES:
        assert family.load_importer().__name__ == family.importer
        assert family.kind in registry.FAMILY_KINDS and family.maps and family.opens_from, family.name


def test_the_docs_tables_are_the_registrys_rows_in_the_explorers_order():
    rows = registry.table("methods")
    assert [r["name"] for r in rows] == [m.name for m in registry.methods()]
    assert rows[0]["reads"] == "query, layer, head, fusion" and "Abnar" in rows[1]["reference"]
    assert all(isinstance(v, str) for row in rows for v in row.values()) and "draw" not in rows[0]
    assert [r["name"] for r in registry.table("families")] == [f.name for f in registry.families()]
    with pytest.raises(ValueError, match="choose 'methods' or 'families'"):
        registry.table("models")


def test_the_registry_imports_no_torch_and_nothing_else_of_vit():
    import subprocess
    import sys

    code = ("import sys, vit.registry; vit.registry.methods(); "
            "print(sorted(m for m in sys.modules if m.startswith('vit')), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['vit', 'vit.registry'] False"


def test_the_library_road_families_are_listed_with_their_road_and_on_the_models_page():
    """Issue 91: the docs' Models pages list every family with its road (port or library), from the registry."""
    from pathlib import Path

    library = {f.name: f for f in registry.families() if f.road == "library"}
    assert set(library) == {"transformers-library", "timm-library", "open_clip-timm", "open_clip-recorded", "pe-video"}
    assert {f.importer for f in library.values()} == {"vit.sources.library_road.transformers_models",
                                                      "vit.sources.library_road.timm_models",
                                                      "vit.sources.library_road.open_clip_towers",
                                                      "vit.sources.library_road.pe_video"}
    assert {f.road for f in registry.families()} == {"port", "library"}
    assert all(not f.hf_model_types for f in library.values())  # taken where no port reads the folder
    models = Path(__file__).resolve().parents[1] / "docs" / "models"
    page = (models / "image.md").read_text()
    for family in library.values():  # each on its kind's page: PE video, a clip model, on the video page
        on = page if family.kind == "image" else (models / f"{family.kind}.md").read_text()
        title = family.title.replace("_", "\\_")  # as the page's Markdown writes it
        [row] = [line for line in on.splitlines() if line.startswith(f"| {title} |")]
        assert f"| library | `{family.importer}` |" in row
    assert "| port | `vit.sources.ports.families.hf` |" in page
