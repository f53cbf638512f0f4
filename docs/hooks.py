"""The docs site's generated parts, read from the code at build time so they cannot drift (mkdocs.yml: ``hooks``).

A page asks for one with a marker line, ``<!-- generated: NAME -->``, which ``on_page_markdown`` replaces with
``GENERATORS[NAME]()``; ``<!-- include: PATH -->`` puts a file of the repository there (CHANGELOG.md, the model
cards). A page GitHub shows too (the README links its anchors: ``COMMITTED``) holds the generated part itself, between
``<!-- generated: NAME -->`` and ``<!-- /generated: NAME -->``: the build generates it again, and
``python docs/hooks.py`` writes it into the page (``tests/test_docs.py`` fails while the committed one differs).

Everything here reads the code's own lists: ``vit.registry`` for the methods and the families (the list the loader,
``vit.methods()``, the explorer's pickers and the CLI read, plugins' entries included), ``[project.scripts]`` and
each command's parser for ``--help``, ``vit.API`` for the notebook API, ``bench/results/`` for the measurements.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MARKER = re.compile(r"^<!-- (generated|include): (\S+) -->$", re.MULTILINE)
BLOCK = re.compile(r"^<!-- generated: (\S+) -->\n.*?^<!-- /generated: \1 -->$", re.MULTILINE | re.DOTALL)
HELP_COLUMNS = "100"  # argparse wraps --help to $COLUMNS: fixed, so the page does not depend on the build's terminal

# Which page of "Models" shows each of the registry's family kinds (vit.registry.FAMILY_KINDS); the from-scratch
# families ("Your own ViT") are image ViTs with a page of their own. A kind with no page fails the build.
PAGES = {"image": "image", "windowed": "windowed / hierarchical", "vlm": "vlm tower", "video": "video",
         "own": "image"}
OWN = ("ours", "scratch", "vit-pytorch", "mapped")  # the families of the "own" page, not the "image" one
# Pages of docs/ whose generated parts are written into the file, so GitHub shows them: the README links each.
COMMITTED = ("methods.md", "which-map.md", *(f"models/{page}.md" for page in PAGES),
             "../README.md")  # the README's census figure


def method_anchor(method: str) -> str:
    """The id of a method's entry on the Methods page (``gradcam++`` and ``gradcam`` must not meet)."""
    return "method-" + method.replace("+", "p").replace("_", "-")


def methods_markdown() -> str:
    """One entry per method of the registry, in the explorer's order: what it shows and where it applies, its
    reference and the test that holds it equal to that reference. Each entry's anchor is an ``<a id>``, which GitHub
    keeps (as ``user-content-``, which its pages scroll to) where it drops a ``<span id>``."""
    from vit import registry

    lines = ["| method | what it shows — where it applies | reference | held equal by |", "|---|---|---|---|"]
    for m in registry.methods():
        lines.append(f"| <a id=\"{method_anchor(m.name)}\"></a>`{m.name}` | {_literal(m.title)} — "
                     f"{_literal(m.applies_to)} | {_literal(m.reference) or '—'} | `{m.test or '—'}` |")
    return "\n".join(lines) + "\n"


# What a plugin's method costs, from its cost ("forward", or "gradient", a class-specific one's default)
PLUGIN_RUNS = {"forward": "a forward", "gradient": "a forward and a backward"}


def which_map_markdown() -> str:
    """"Which map should I use?": one row per method of the registry, in the explorer's order: the question its map
    answers, whether it explains one class, whether it is signed, what it costs, and how close its test holds it to
    its reference. A plugin's method says what its registration says."""
    from vit import registry

    lines = ["| method | the question it answers | class-specific | signed | what it costs | held to its reference "
             "within |", "|---|---|---|---|---|---|"]
    for m in registry.methods():
        runs = m.runs or PLUGIN_RUNS.get(m.cost or ("gradient" if m.class_specific else "forward"), "")
        lines.append(f"| [`{m.name}`](methods.md#{method_anchor(m.name)}) | {_literal(m.question) or '—'} | "
                     f"{'yes' if m.class_specific else 'no'} | {'yes' if m.signed else 'no'} | "
                     f"{_literal(runs) or '—'} | {_literal(m.tolerance) or '—'} |")
    return "\n".join(lines) + "\n"


def _literal(text: str) -> str:
    """``text`` shown as written: Markdown's emphasis characters escaped outside its code spans (``vit_*_dinov3*``
    is a name, not emphasis), a table's ``|`` too."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    return "".join(part if part.startswith("`") else re.sub(r"([*_|\\])", r"\\\1", part) for part in parts)


def page_families(page: str) -> list:
    """The registry's families one Models page shows."""
    from vit import registry

    missing = set(registry.FAMILY_KINDS) - set(PAGES.values())
    if missing:
        raise ValueError(f"docs/hooks.py PAGES has no Models page for the families of kind {sorted(missing)}")
    return [f for f in registry.families(PAGES[page]) if (f.name in OWN) == (page == "own")]


def families_markdown(page: str) -> str:
    """The families one Models page covers, one row each from the registry: what opens, from where, which maps
    (and what is refused, and why), the module that reads it."""
    lines = ["| family | opens from | maps | road | read by |", "|---|---|---|---|---|"]
    lines += [f"| {_literal(f.title)} | {_literal(f.opens_from)} | {_literal(f.maps) or '—'} | {f.road} | "
              f"`{f.importer}` |" for f in page_families(page)]
    return "\n".join(lines) + "\n"


def commands() -> dict[str, str]:
    """``[project.scripts]``: console command -> module."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


def parsers(name: str, module_name: str) -> list[tuple[str, str]]:
    """``(command line, --help text)`` for a command and each of its subcommands, as argparse prints them."""
    module = importlib.import_module(module_name)
    build = getattr(module, "build_parser", None)
    if build is None:  # vit-explorer passes its options to streamlit: its help is its docstring
        return [(name, (module.__doc__ or "").strip())]
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build()
        parser.prog = name
        found = [(name, parser.format_help())]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    sub.prog = f"{name} {sub_name}"
                    found.append((sub.prog, sub.format_help()))
        return found
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_markdown() -> str:
    """Every console command's ``--help``, generated from its parser."""
    parts = []
    for name, module_name in commands().items():
        for command, text in parsers(name, module_name):
            parts.append(f"### `{command}`\n\n`python -m {module_name}` is the same command.\n\n"
                         f"```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def api_markdown() -> str:
    """The notebook API: mkdocstrings' entry for each name ``import vit`` exposes (``vit.API``)."""
    import vit

    return "\n".join(f"::: vit.api.{name}\n" for name in vit.API)


BENCH_SHOWN_LINES = 400  # a results file longer than this is shown to here, with its length said


def bench_markdown() -> str:
    """Every file under ``bench/results``, by folder (machine and date), with its content."""
    results = ROOT / "bench" / "results"
    parts = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        parts.append(f"### `{folder.name}`\n")
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            lines = path.read_text(errors="replace").splitlines()
            shown = "\n".join(lines[:BENCH_SHOWN_LINES]).replace("```", "'''")
            note = "" if len(lines) <= BENCH_SHOWN_LINES else \
                f" (the first {BENCH_SHOWN_LINES} of its {len(lines):,} lines)"
            title = path.relative_to(results).as_posix()
            parts.append(f"??? note \"`bench/results/{title}`{note}\"\n\n" +
                         "".join(f"    {line}\n" for line in f"```text\n{shown}\n```".splitlines()))
    return "\n".join(parts)


def census_vlm_path() -> Path:
    """The newest VLM census's table (``bench/census_vlm.py`` writes it beside its rows, ``census_vlm.json``)."""
    found = sorted((ROOT / "bench" / "results").glob("*/census_vlm.md"))
    if not found:
        raise ValueError("no bench/results/*/census_vlm.md; run python -m bench.census_vlm")
    return found[-1]


def census_vlm_markdown() -> str:
    """The VLM census's table: every image-text-to-text type of transformers' auto-mapping, answered, placed or
    refused with its reason."""
    path = census_vlm_path()
    return f"From `{path.relative_to(ROOT).as_posix()}`. " + path.read_text()  # its reasons escaped by the census


def census_vlm_figure() -> str:
    """The README's figure of the VLM census, from the newest ``census_vlm.json`` beside its table."""
    path = census_vlm_path()
    totals = json.loads(path.with_suffix(".json").read_text())["totals"]
    text = (f"Of the {totals['types']} image-text-to-text types transformers ships, the census built "
            f"{totals['built']} tiny offline with their processors: {totals['answered']} answer as `generate` does "
            f"and {totals['placed']} are placed on the image (`{path.relative_to(ROOT).as_posix()}`, from "
            "`bench/census_vlm.py`).")
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False) + "\n"


def census_markdown() -> str:
    """The census's figure, from the newest ``bench/results/*/census.json`` (``bench/census_families.py``): how many
    of the vision families the libraries register open and draw, and how many are refused."""
    results = ROOT / "bench" / "results"
    runs = [(json.loads(path.read_text()), path) for path in results.glob("*/census.json")]
    if not runs:
        return "The census (`bench/census_families.py`) has no results yet."
    run, path = max(runs, key=lambda item: (item[0].get("date", ""), item[1].as_posix()))
    totals, rows = run["totals"], run["rows"]
    kinds = {}
    for row in rows:
        kind = (row.get("registry") or "").partition(":")[0]
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    counted = (f"The census counts {kinds.get('transformers', 0)} model types of transformers' vision auto-mappings, "
               f"{kinds.get('timm', 0)} timm architecture families and {kinds.get('open_clip', 0)} open_clip configs, "
               "beside the vision towers of composite models. ") if kinds else ""
    text = (f"{counted}Of the {totals['families']} vision families of transformers, timm and open_clip it builds, "
            f"{totals['with_attention']} have attention. Of those, {totals['open']} open, {totals['open_and_draw']} "
            f"draw ({100 * totals['open_and_draw'] // max(totals['with_attention'], 1)} % of those with attention) "
            f"and {totals['refused']} are refused in one line naming why. {totals['build_failed']} could not "
            f"be built tiny and {totals['timed_out']} ran past the time limit "
            f"(`{path.relative_to(ROOT).with_suffix('.md').as_posix()}`, from `bench/census_families.py`, "
            f"{run.get('date', '')}).")
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False) + "\n"


def suite_costliest_path() -> Path:
    """The newest table of the suite's costliest tests (``bench/suite_cpu.py --costliest`` writes it beside the
    report it reads)."""
    found = sorted((ROOT / "bench" / "results").glob("cpu-*/suite-costliest.md"))
    if not found:
        raise ValueError("no bench/results/cpu-*/suite-costliest.md; run python bench/suite_cpu.py --costliest REPORT "
                         "--out bench/results/cpu-DATE/suite-costliest.md")
    return found[-1]


def suite_costliest_markdown() -> str:
    """The suite's ten costliest tests, with the lane that runs each and why it must be that long."""
    text = re.sub(r"\A# .*\n+", "", suite_costliest_path().read_text())
    return text.replace("<", "&lt;")  # the whys are docstrings' words, which may name a tag: text, never HTML


def include(path: str) -> str:
    """A repository file's Markdown, its top heading dropped (the page has its own) and its images pointed at
    their copies in ``repository/``."""
    text = (ROOT / path).read_text()
    text = re.sub(r"\A# .*\n", "", text)
    folder = Path(path).parent.as_posix()
    prefix = "repository/" + ("" if folder == "." else folder + "/")
    return re.sub(r"!\[([^\]]*)\]\((?!https?:)([^)]+)\)", lambda m: f"![{m.group(1)}]({prefix}{m.group(2)})", text)


INCLUDED_IMAGES = ("checkpoints/*.png",)  # the model cards' curves, copied into the site under repository/

GENERATORS = {
    "methods": methods_markdown,
    "which-map": which_map_markdown,
    "cli": cli_markdown,
    "api": api_markdown,
    "bench": bench_markdown,
    "census-vlm": census_vlm_markdown,
    "census-vlm-figure": census_vlm_figure,
    "census": census_markdown,
    "suite-costliest": suite_costliest_markdown,
    **{f"families-{page}": (lambda page=page: families_markdown(page)) for page in PAGES},
}


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it names."""
    if str(ROOT) not in sys.path:  # the checkout's `vit`; put back on each page (mkdocs' plugins reset sys.path)
        sys.path.insert(0, str(ROOT))
    def replace(match: re.Match) -> str:
        what, name = match.groups()
        if what == "include":
            return include(name)
        if name not in GENERATORS:
            raise ValueError(f"no generator {name!r} (docs/hooks.py GENERATORS has {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(replace, BLOCK.sub(lambda m: f"<!-- generated: {m[1]} -->", markdown))


def refreshed(markdown: str) -> str:
    """A committed page (``COMMITTED``) with each generated part written out between its two markers, as GitHub
    shows it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    markdown = BLOCK.sub(lambda m: f"<!-- generated: {m[1]} -->", markdown)
    return MARKER.sub(lambda m: m[0] if m[1] == "include" else
                      f"{m[0]}\n\n{GENERATORS[m[2]]()}\n<!-- /generated: {m[2]} -->", markdown)


def on_page_markdown(markdown, page, config, files):  # mkdocs' hook
    return expand(markdown)


# A relative link to a page of docs/ in a notebook's rendered HTML (not a URL, an anchor or a path from the root)
NOTEBOOK_LINK = re.compile(r'href="(?![a-zA-Z][\w+.-]*:|#|/)([^"#]+\.(?:md|ipynb))(#[^"]*)?"')


def notebook_links(html: str, src_uri: str, files) -> str:
    """A notebook's links as written for Jupyter (``../sae.md``, a file beside it in docs/) made the site's URLs of
    those pages: mkdocs rewrites the links of Markdown pages, not the HTML mkdocs-jupyter renders. A link to no
    page of the site fails the build."""
    import posixpath

    def site_url(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), match[1]))
        page = files.get_file_from_path(target)
        if page is None:
            raise ValueError(f"{src_uri} links to {match[1]}, which is no page of docs/")
        here = files.get_file_from_path(src_uri)
        return f'href="{page.url_relative_to(here)}{match[2] or ""}"'

    return NOTEBOOK_LINK.sub(site_url, html)


def on_page_content(html, page, config, files):  # mkdocs' hook, after mkdocs-jupyter's render of a notebook
    return notebook_links(html, page.file.src_uri, files) if page.file.src_uri.endswith(".ipynb") else html


def on_files(files, config):  # mkdocs' hook: the included files' images
    from mkdocs.structure.files import File

    for pattern in INCLUDED_IMAGES:
        for path in sorted(ROOT.glob(pattern)):
            files.append(File.generated(config, "repository/" + path.relative_to(ROOT).as_posix(),
                                        abs_src_path=str(path)))
    return files


if __name__ == "__main__":  # python docs/hooks.py: the committed pages' generated parts written again
    for name in COMMITTED:
        page = ROOT / "docs" / name
        page.write_text(refreshed(page.read_text()))
        print(f"wrote {page.relative_to(ROOT)}")
