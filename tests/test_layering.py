"""The folder layout of ``vit/`` is its architecture: each room imports only what sits below it.

``costs`` (the cost model) <- ``model`` <- ``core`` (images, clips, inference, the runs folder's files, small helpers;
with ``vit.checkpoint`` and ``vit.registry``, which stay at the root because users and plugins import them there, and
import nothing of ``vit/core/``, which reads them) <- ``sources``, ``explain`` <- ``training`` <- ``features``,
``runs`` <- ``app``. The package root is the commands' room: the modules ``python -m vit.…`` runs (a command must
stand there to keep its ``python -m`` name), which may use every room but ``app``. Only the pages and the notebook API
use ``app``, the API only to draw as the explorer draws (its computations are the engine's). The notebook API is
``vit/__init__.py`` (its names load ``vit.api`` when first used, so ``import vit`` imports no wing) and the
``vit/api/`` package (its ``__init__`` names what its modules hold, one module by concern); nothing in ``vit/``
imports it but a command that draws any map ``vit.methods()`` lists through ``vit.explain``, the one place that
dispatches every method (``vit.faithfulness``), and ``vit.predict``'s SAM prompts (``vit.segment``).
"""

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

VIT = Path(__file__).resolve().parent.parent / "vit"
REPOSITORY = VIT.parent
# The house's modules, each place a folder and its package's name or a file and its module's: the engine, the pages.
HOUSE = ((VIT, "vit"), (REPOSITORY / "app_pages", "app_pages"), (REPOSITORY / "app.py", "app"))
COMMANDS = {"predict", "evaluate", "convert", "train", "faithfulness", "analyze", "explorer", "sae", "describe_heads"}
LOW = {"costs", "model", "core"}  # the engine's lower rooms, each a package
ROOT_CORE = {"checkpoint", "registry"}  # the core's modules (a package) kept at the root: users import their paths
WINGS = {"sources", "explain", "training", "features", "runs", "app"}
API = {"vit", "vit.api"}  # what ``import vit`` exposes to notebooks, with ``vit.api``'s modules
# What each layer may import besides itself.
ALLOWED = {
    "costs": set(),
    "model": {"costs"},
    "core": {"costs", "model"},
    "sources": LOW,
    "explain": LOW,
    "training": LOW | {"explain", "sources"},
    "features": LOW | {"explain", "sources", "training"},
    "runs": LOW | {"explain", "sources", "training", "features"},
    "app": LOW | {"explain", "sources", "training", "features", "runs"},
    "commands": LOW | {"explain", "sources", "training", "features", "runs", "api"},
    "api": LOW | {"explain", "sources", "training", "features", "runs", "app"},
}


def layer_of(module: str) -> str:
    """The layer of a dotted ``vit`` module name (``vit.explain.methods.attention`` -> ``explain``)."""
    if module in API or module.startswith("vit.api."):
        return "api"
    name = module.split(".")[1]
    if name in LOW | WINGS:
        return name
    if name.startswith("__") or name in ROOT_CORE:  # __version__ (the package's metadata) loads nothing
        return "core"
    return "commands" if name in COMMANDS else "api"  # any other name of the root is the notebook API's (vit.ViT)


@functools.cache
def _summary(path: Path, stamp: tuple[int, int]) -> tuple[tuple, tuple, tuple]:
    """What the checks read of ``path`` (``stamp``: its mtime and size, so a rewritten file is read again), parsed
    and walked once per test process (issue 112: the checks parsed vit/ five times and the whole repository twice,
    ~29 s of CPU a run): each import as ``(line, module or None, level, ((name, asname), ...))`` (``None`` for a
    plain ``import``), each ``base.attr`` on a bare name as ``(base, attr, line)``, both in ``ast.walk``'s order,
    and each function's ``(name, first line, last line)``. SyntaxError where it does not parse."""
    imports, attributes, functions = [], [], []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            level = node.level if isinstance(node, ast.ImportFrom) else -1
            imports.append((node.lineno, module, level, tuple((a.name, a.asname) for a in node.names)))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attributes.append((node.value.id, node.attr, node.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append((node.name, node.lineno, node.end_lineno))
    return tuple(imports), tuple(attributes), tuple(functions)


def summary(path: Path) -> tuple[tuple, tuple, tuple]:
    """``_summary`` of ``path`` as it is now."""
    stat = path.stat()
    return _summary(path, (stat.st_mtime_ns, stat.st_size))


@pytest.fixture(scope="module")
def repository() -> list[Path]:
    """The Python files the re-export check reads (``app.py``, the pages, ``vit/``, the tests, the benches), for every
    test that reads the real repository's files through ``summary``: a fixture built once per module keeps those tests
    on one xdist worker (tests/conftest.py's ``_item_group``), so the repository's ~9 MB of Python is parsed once a
    run; spread over four workers each parsed it again (issue 112: 24.5 s of CPU in a whole run, ~9 s alone)."""
    return [REPOSITORY / "app.py", *REPOSITORY.glob("app_pages/**/*.py"), *VIT.rglob("*.py"),
            *REPOSITORY.glob("tests/**/*.py"), *REPOSITORY.glob("bench/**/*.py")]


def vit_imports(path: Path, packages: set[str] = frozenset({"vit"})) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of a module of ``packages`` (``vit``'s) in ``path``, inside functions
    too; a from-import names the module, or the submodule a name may be."""
    found = []
    for line, module, level, names in summary(path)[0]:
        if level == -1:  # import a.b
            found += [(line, name) for name, _ in names if name.split(".")[0] in packages]
        elif level == 0 and module:
            if module.split(".")[0] in packages:  # from vit import x, y: each name may be a module
                found += [(line, f"{module}.{name}") for name, _ in names]
        elif level:
            found.append((line, "relative import"))
    return found


def module_name(path: Path, root: Path = VIT, package: str = "vit") -> str:
    return ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")


def house_modules(places: tuple[tuple[Path, str], ...] = HOUSE) -> dict[str, Path]:
    """{dotted name: file} of every module of ``places`` (a folder and its package's name, or a file and its
    module's)."""
    found = {}
    for place, name in places:
        if place.is_file():
            found[name] = place
        else:
            found |= {module_name(path, place, name): path for path in sorted(place.rglob("*.py"))}
    return found


def violations(root: Path = VIT) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        layer = layer_of(name)
        for line, imported in vit_imports(path):
            if imported == "relative import":
                problems.append(f"{name}:{line} uses a relative import; write the full vit.… path")
                continue
            target = layer_of(imported)
            if target != layer and target not in ALLOWED[layer]:
                problems.append(f"{name}:{line} ({layer}) imports {imported} ({target})")
    return problems


@pytest.mark.usefixtures("repository")
def test_every_module_imports_only_the_layers_below_it():
    assert violations() == []


def test_the_check_catches_an_upward_import(tmp_path):
    for room in ("explain", "core", "model", "costs"):
        (tmp_path / room).mkdir()
    (tmp_path / "explain" / "attention.py").write_text("def f():\n    from vit.app import explorer_page\n")
    (tmp_path / "core" / "images.py").write_text("from vit.training.data import Dataset\n")
    (tmp_path / "predict.py").write_text("from vit.app.catalog import list_checkpoints\n")
    (tmp_path / "core" / "inference.py").write_text("def f():\n    from vit import api\n")
    (tmp_path / "model" / "blocks.py").write_text("from vit.core import images\n")
    (tmp_path / "costs" / "plan.py").write_text("from vit.core.inference import preprocess\n")
    found = violations(tmp_path)
    assert len(found) == 6 and all("imports" in p for p in found)


def circles(places: tuple[tuple[Path, str], ...] = HOUSE) -> list[list[str]]:
    """Every set of modules of ``places`` (the engine's, the pages' and ``app.py``) that import one another round a
    circle (imports inside functions count: a circle is a constant or an exception defined in the wrong room,
    whenever the import runs)."""
    import networkx as nx

    modules = house_modules(places)
    packages = {name for place, name in places if place.is_dir()}  # a package's root (vit's lazy names): no edge
    graph = nx.DiGraph()
    for name, path in modules.items():
        for _, imported in vit_imports(path, {n for _, n in places}):
            while imported not in modules and "." in imported:  # from vit.a.b import name: module vit.a.b
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and imported != name and imported not in packages:
                graph.add_edge(name, imported)
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


@pytest.mark.usefixtures("repository")
def test_no_modules_import_one_another_round_a_circle():
    assert circles() == []


def back_up(root: Path = VIT) -> list[str]:
    """``"module:line imports name"`` for each import that runs back up inside the house though every layer allows it:
    a name of the package root that is no module (``from vit import __version__``: the root's names load the
    notebook API, above everything), and an import of ``vit/core/`` by a core module kept at the root (the core's
    images and inference read ``vit.checkpoint``, so it stands below them)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        for line, imported in vit_imports(path):
            parts = imported.split(".")
            root_name = (len(parts) == 2 and name != "vit" and not (root / parts[1]).is_dir()
                         and not (root / f"{parts[1]}.py").is_file())
            in_root_core = name.partition(".")[2].split(".")[0] in ROOT_CORE  # vit.checkpoint and its modules
            core_below = in_root_core and imported.startswith("vit.core.")
            if root_name or core_below:
                found.append(f"{name}:{line} imports {imported}")
    return found


@pytest.mark.usefixtures("repository")
def test_no_import_runs_back_up_to_the_package_root_or_from_the_checkpoint_format_to_the_core():
    assert back_up() == []


def test_the_back_up_check_catches_a_root_name_and_the_checkpoint_format_reading_the_core(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "cli.py").write_text("def f():\n    from vit import __version__\n")
    (tmp_path / "core" / "images.py").write_text("from vit import checkpoint, registry\n")
    (tmp_path / "checkpoint.py").write_text("from vit.core.images import BACKENDS\n")
    (tmp_path / "registry.py").write_text("")
    assert back_up(tmp_path) == ["vit.checkpoint:1 imports vit.core.images.BACKENDS",
                                 "vit.core.cli:2 imports vit.__version__"]


def test_the_back_up_check_catches_a_module_of_the_checkpoint_package_reading_the_core(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "__init__.py").write_text("from vit.checkpoint.file_format import Checkpoint\n")
    (tmp_path / "checkpoint" / "file_format.py").write_text("def f():\n    from vit.core.images import BACKENDS\n")
    assert back_up(tmp_path) == ["vit.checkpoint.file_format:2 imports vit.core.images.BACKENDS"]


def test_the_circle_check_catches_a_circle_through_an_import_inside_a_function(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "data.py").write_text("from vit.training.options import AUGMENTATIONS\n")
    (tmp_path / "training" / "options.py").write_text("def f():\n    from vit.training.trainer import Settings\n")
    (tmp_path / "training" / "trainer.py").write_text("from vit.training.data import Dataset\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "cli.py").write_text("def f():\n    from vit.core.inference import NonFiniteOutput\n")
    (tmp_path / "core" / "inference.py").write_text("from vit.core.cli import MAX_INPUT_SIDE\n")
    (tmp_path / "sources").mkdir()  # a module named in a from-import of its package
    (tmp_path / "sources" / "hf_preprocessing.py").write_text("from vit.sources import import_qwen\n")
    (tmp_path / "sources" / "import_qwen.py").write_text("def f():\n    from vit.sources import hf_preprocessing\n")
    assert circles(((tmp_path, "vit"),)) == [["vit.core.cli", "vit.core.inference"],
                                             ["vit.sources.hf_preprocessing", "vit.sources.import_qwen"],
                                             ["vit.training.data", "vit.training.options", "vit.training.trainer"]]


def test_the_circle_check_catches_a_circle_between_pages_and_through_app_py(tmp_path):
    sections = tmp_path / "app_pages" / "explorer_sections"
    sections.mkdir(parents=True)
    (sections / "ask_vlm.py").write_text("def share():\n    from app_pages.explorer_sections import share_view\n")
    (sections / "share_view.py").write_text("from app_pages.explorer_sections.ask_vlm import take_link\n"
                                            "from vit.app import share\n")
    (tmp_path / "app_pages" / "explorer.py").write_text("import app\n")
    (tmp_path / "app.py").write_text("from app_pages import explorer\n")
    (tmp_path / "vit" / "app").mkdir(parents=True)
    (tmp_path / "vit" / "app" / "share.py").write_text("")
    places = ((tmp_path / "vit", "vit"), (tmp_path / "app_pages", "app_pages"), (tmp_path / "app.py", "app"))
    assert circles(places) == [["app", "app_pages.explorer"],
                               ["app_pages.explorer_sections.ask_vlm", "app_pages.explorer_sections.share_view"]]


# The notebook API computes through the engine; it reaches into ``vit.app`` only where it draws as the explorer draws
# (a Plotly picker, the HTML export), and only when that is asked for; ``explore`` serves the explorer's page itself.
API_DISPLAY = {"figure", "to_html", "html", "explore"}  # html: the text to_html writes (the explorer's Download)


def app_imports_outside(path: Path, allowed: set[str]) -> list[str]:
    """``"line: module (in function)"`` for each import of ``vit.app`` in ``path`` but inside a function named in
    ``allowed`` (the innermost function around it counts; at module level, none)."""
    functions = summary(path)[2]
    found = []
    for line, imported in vit_imports(path):
        if layer_of(imported) != "app":
            continue
        around = [(first, last, name) for name, first, last in functions if first <= line <= last]
        name = min(around, key=lambda f: f[1] - f[0])[2] if around else None
        if name not in allowed:
            found.append(f"{line}: {imported} (in {name or 'the module'})")
    return found


@pytest.mark.usefixtures("repository")
def test_the_notebook_api_imports_the_app_only_to_draw():
    assert [f"{path.name}:{found}" for path in sorted((VIT / "api").glob("*.py"))
            for found in app_imports_outside(path, API_DISPLAY)] == []


def test_the_app_import_check_catches_one_at_module_level_and_in_a_computation(tmp_path):
    (tmp_path / "api.py").write_text("from vit.app import words\n\nclass E:\n    def figure(self):\n"
                                     "        from vit.app.drawing import patch_picker_figure\n\n"
                                     "def pca():\n    from vit.app import dense\n")
    assert app_imports_outside(tmp_path / "api.py", API_DISPLAY) == ["1: vit.app.words (in the module)",
                                                                   "8: vit.app.dense (in pca)"]


@pytest.mark.parametrize("module, layer", [("vit.model", "model"), ("vit.train", "commands"),
                                           ("vit.explain.methods.attention", "explain"), ("vit.app", "app"),
                                           ("vit.runs.manager", "runs"), ("vit", "api"), ("vit.api", "api"),
                                           ("vit.api.maps", "api"), ("vit.api.sam.segment", "api"),
                                           ("vit.features.autoencoder", "features"), ("vit.sae", "commands"),
                                           ("vit.core.inference", "core"), ("vit.costs.bounds", "costs"),
                                           ("vit.ViT", "api"), ("vit.__version__", "core"),
                                           ("vit.checkpoint", "core"), ("vit.checkpoint.torch_files", "core"),
                                           ("vit.registry", "core")])
def test_layer_of(module, layer):
    assert layer_of(module) == layer


def test_packages_are_empty():
    """No star re-exports or registries: a package's ``__init__`` holds at most a docstring (but ``vit``'s and
    ``vit.api``'s, the notebook API, and ``vit.model``'s and ``vit.checkpoint``'s, which name their parts: users import
    them by those paths)."""
    for init in VIT.rglob("__init__.py"):
        if init.parent in (VIT, VIT / "api", VIT / "model", VIT / "checkpoint"):
            continue
        body = ast.parse(init.read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), init


def borrowed(module: str, module_path: Path, files: list[Path]) -> list[str]:
    """``"file:line: name"`` for each name that ``module_path`` (the module ``module``, ``vit.app.drawing``) imports
    from elsewhere and that one of ``files`` reads through it (``drawing.name`` or ``from vit.app.drawing import
    name``): a re-export, which hides where the name lives."""
    body = ast.parse(module_path.read_text()).body
    foreign = {a.asname or a.name.split(".")[0] for n in body if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names}
    package, _, leaf = module.rpartition(".")
    found = []
    for path in files:
        reads = _reads(path)
        if reads is None:  # tests/reference/ holds third-party scripts copied verbatim
            continue
        imports, attributes = reads
        aliases = {asname or name for source, name, asname, _ in imports if source == package and name == leaf}
        found += [f"{path.name}:{line}: {name}" for source, name, _, line in imports
                  if source == module and name in foreign]
        found += [f"{path.name}:{line}: {attr}" for base, attr, line in attributes
                  if base in aliases and attr in foreign]
    return found


def _reads(path: Path) -> tuple[tuple, tuple] | None:
    """What ``path`` reads (``summary``: each app module's check reads every file of the repository, parsed once per
    test process): each ``from M import name as asname`` as ``(M, name, asname, line)`` and each ``base.attr`` on a
    bare name as ``(base, attr, line)``, in ``ast.walk``'s order; None when it does not parse."""
    try:
        imports, attributes, _ = summary(path)
    except SyntaxError:
        return None
    return tuple((module, name, asname, line) for line, module, level, names in imports if level >= 0
                 for name, asname in names), attributes


@pytest.mark.parametrize("module", sorted(p.stem for p in (VIT / "app").glob("*.py") if p.stem != "__init__"))
def test_nothing_reads_an_engine_name_through_a_module_of_the_app_layer(module, repository):
    """``vit.app``'s modules hold what the pages draw and run; a name one of them only imports (the overlay helpers
    and token labels ``drawing`` uses, the checkpoints folder ``catalog`` reads, the ``Progress`` ``work`` reports
    to) is read where it lives, by the pages as by everything else."""
    assert borrowed(f"vit.app.{module}", VIT / "app" / f"{module}.py", repository) == []


def test_the_re_export_check_catches_both_ways_of_reading_one(tmp_path):
    (tmp_path / "drawing.py").write_text("from vit.explain.views.overlay import jpeg_data_uri\n\n"
                                         "def figure():\n    pass\n")
    (tmp_path / "page.py").write_text("from vit.app import drawing\nfrom vit.app.drawing import figure, "
                                      "jpeg_data_uri\n\ndrawing.figure()\ndrawing.jpeg_data_uri(None)\n")
    assert borrowed("vit.app.drawing", tmp_path / "drawing.py", [tmp_path / "page.py"]) == [
        "page.py:2: jpeg_data_uri", "page.py:5: jpeg_data_uri"]


# The pages are short scripts (STYLE.md): a file past this many lines is split by concern into its page's sections
# package (``app_pages/explorer_sections/``, ``app_pages/training_sections/``, ``app_pages/analyze_sections/``).
PAGE_LINES = 400


def long_files(root: Path, limit: int = PAGE_LINES) -> dict[str, int]:
    """{file: lines} of the Python files under ``root`` longer than ``limit`` lines."""
    counted = {path: len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}
    return {str(path.relative_to(root)): n for path, n in counted.items() if n > limit}


def test_no_page_file_is_longer_than_400_lines():
    pages = VIT.parent / "app_pages"
    assert long_files(pages) == {}, f"split these by concern into their page's sections package: {long_files(pages)}"
    assert len((VIT.parent / "app.py").read_text().splitlines()) <= PAGE_LINES


# Past this many lines a module has more than one concern (STYLE.md): split it by concern, as ``vit/model/``,
# ``vit/api/`` and ``vit/checkpoint/`` are (issue 112: the house's bar came down from 1,000 lines).
MODULE_LINES = 800


def modules_over(bar: int = MODULE_LINES, places: tuple[tuple[Path, str], ...] = HOUSE) -> dict[str, int]:
    """{path from the repository's root: lines} of the house's modules (``vit/``, ``app_pages/``) over ``bar``."""
    return {f"{place.name}/{path}": n for place, _ in places if place.is_dir()
            for path, n in long_files(place, bar).items()}


def test_no_module_is_longer_than_800_lines():
    assert modules_over() == {}, f"split these by concern: {modules_over()}"


def test_the_length_check_catches_a_long_page(tmp_path):
    (tmp_path / "explorer_sections").mkdir()
    (tmp_path / "explorer_sections" / "long.py").write_text("x = 1\n" * (PAGE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * PAGE_LINES)
    assert long_files(tmp_path) == {"explorer_sections/long.py": PAGE_LINES + 1}


def test_the_module_bar_catches_a_module_of_801_lines_in_a_wing(tmp_path):
    (tmp_path / "vit" / "runs").mkdir(parents=True)
    (tmp_path / "vit" / "runs" / "manager.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (tmp_path / "vit" / "runs" / "display.py").write_text("x = 1\n" * MODULE_LINES)
    (tmp_path / "app_pages").mkdir()
    places = ((tmp_path / "vit", "vit"), (tmp_path / "app_pages", "app_pages"), (tmp_path / "app.py", "app"))
    assert modules_over(places=places) == {"vit/runs/manager.py": MODULE_LINES + 1}


# Rooms by kind: a folder past this many modules side by side is grouped by kind into sub-packages (STYLE.md), and
# one name means one module, wherever it stands (a ``sae`` command beside a ``features/sae`` model confuses readers).
ROOM_MODULES = 15


def crowded_folders(root: Path = VIT, limit: int = ROOM_MODULES) -> dict[str, int]:
    """{folder: modules} of the folders under ``root`` holding more than ``limit`` modules (``__init__`` aside)."""
    counts = defaultdict(int)
    for path in root.rglob("*.py"):
        if path.stem not in ("__init__", "__main__"):
            counts[str(path.parent.relative_to(root.parent))] += 1
    return {folder: n for folder, n in sorted(counts.items()) if n > limit}


def repeated_names(root: Path = VIT) -> dict[str, list[str]]:
    """{name: [paths]} of every module or package name borne by two places under ``root``."""
    places = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            places[path.stem].append(str(path.relative_to(root.parent)))
    for init in sorted(root.rglob("*/__init__.py")):
        places[init.parent.name].append(str(init.parent.relative_to(root.parent)) + "/")
    return {name: found for name, found in places.items() if len(found) > 1}


def test_no_folder_holds_more_than_15_modules():
    assert crowded_folders() == {}, "group these folders' modules by kind into sub-packages"


def test_no_module_name_stands_at_two_levels():
    assert repeated_names() == {}, "rename one of each pair for what it holds"


def test_the_room_checks_catch_a_crowded_folder_and_a_repeated_name(tmp_path):
    vit = tmp_path / "vit"
    (vit / "features").mkdir(parents=True)
    for i in range(ROOM_MODULES + 1):
        (vit / f"m{i}.py").write_text("")
    (vit / "__init__.py").write_text("")
    (vit / "features" / "__init__.py").write_text("")
    (vit / "features" / "m0.py").write_text("")
    (vit / "features" / "sae.py").write_text("")
    (vit / "sae.py").write_text("")
    assert crowded_folders(vit) == {"vit": ROOM_MODULES + 2}
    assert repeated_names(vit) == {"m0": ["vit/features/m0.py", "vit/m0.py"],
                                   "sae": ["vit/features/sae.py", "vit/sae.py"]}


IMPORT_ROOTS = tuple(REPOSITORY / name for name in ("vit", "app_pages", "tests", "bench", "scripts"))


def unresolved_imports(roots: tuple[Path, ...] = IMPORT_ROOTS) -> list[str]:
    """``file:line: from MODULE import NAME`` for each from-import of a ``vit`` module, at module level or inside a
    function, whose module does not exist or has no ``NAME`` (neither an attribute nor a submodule): a path a move of
    modules left behind, which importing every module misses when the import is inside a function."""
    import importlib

    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.is_relative_to(REPOSITORY / "tests" / "reference"):  # the authors' code, vendored as it is
                continue
            for line, name, level, names in summary(path)[0]:
                if not (level == 0 and name and name.split(".")[0] == "vit"):
                    continue
                where = f"{path.relative_to(root.parent)}:{line}: from {name} import"
                try:
                    module = importlib.import_module(name)
                except ImportError:
                    found.append(f"{where} (no such module)")
                    continue
                for alias, _ in names:
                    if hasattr(module, alias):
                        continue
                    try:
                        importlib.import_module(f"{name}.{alias}")
                    except ImportError:
                        found.append(f"{where} {alias}")
    return found


@pytest.mark.usefixtures("repository")
def test_every_from_import_of_a_vit_module_names_what_it_holds():
    assert unresolved_imports() == []


def test_the_import_check_catches_a_name_a_move_left_behind(tmp_path):
    (tmp_path / "late.py").write_text("def f():\n    from vit.explain.mechanism import MechanismError\n"
                                      "    from vit.core import images, no_such_module\n"
                                      "    from vit.no_such_room import x\n")
    assert unresolved_imports((tmp_path,)) == [
        f"{tmp_path.name}/late.py:2: from vit.explain.mechanism import MechanismError",
        f"{tmp_path.name}/late.py:3: from vit.core import no_such_module",
        f"{tmp_path.name}/late.py:4: from vit.no_such_room import (no such module)"]
