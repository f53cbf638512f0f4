"""The docs site's generated parts, read from the code at build time so they cannot drift (mkdocs.yml: ``hooks``).

A page asks for one with a marker line, ``<!-- generated: NAME -->``, which ``on_page_markdown`` replaces with
``GENERATORS[NAME]()``; ``<!-- include: PATH -->`` puts a file of the repository there (CHANGELOG.md, the model
cards). Everything here reads the code's own lists: ``vit.methods()`` for the methods, each ``vit.sources``
module's ``SUPPORTED`` for what opens, ``[project.scripts]`` and each command's parser for ``--help``, ``vit.API``
for the notebook API, ``bench/results/`` for the measurements. When the project gets one registry of families and
methods, repoint ``families_markdown`` and ``methods_markdown`` at it: nothing else here knows where they come from.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MARKER = re.compile(r"^<!-- (generated|include): (\S+) -->$", re.MULTILINE)
HELP_COLUMNS = "100"  # argparse wraps --help to $COLUMNS: fixed, so the page does not depend on the build's terminal

# Which page of "Models" each opening module's families belong on. A module of vit/sources that opens a family
# (it has SUPPORTED, or is import_*.py) and is missing here fails the build, as does a name here with no module.
KINDS = {
    "image": ("Image ViTs", ("hf", "import_timm", "import_torchvision", "import_dinov3", "import_clip", "import_siglip",
                             "import_naflex", "import_eva", "import_beit", "import_aimv2", "import_pe")),
    "windowed": ("Windowed and hierarchical", ("import_sam", "import_swin", "import_hiera")),
    "vlm": ("VLM towers", ("import_vlm", "import_internvl", "import_qwen")),
    "video": ("Video", ("import_videomae", "import_timesformer", "import_vjepa2")),
    "own": ("Your own ViT", ("import_scratch", "import_vit_pytorch")),
}

# Each method's published reference and the test that holds ours equal to it (or, where there is no code to
# compare with, computes it by hand). vit.methods() is the list; a method missing here fails the build.
REFERENCES = {
    "attention": ("each library's own `output_attentions` (transformers, timm, open_clip, torchvision)",
                  "tests/test_import_parity.py"),
    "rollout": ("Abnar & Zuidema 2020, attention rollout", "tests/test_attention.py"),
    "class": ("Chefer et al. 2021b, gradient rollout (their CLIP notebook's `interpret`)", "tests/test_prompts.py"),
    "legrad": ("Bousselham et al. 2024, WalBouss/LeGrad", "tests/test_relevance.py"),
    "lrp": ("Chefer et al. 2021a, hila-chefer/Transformer-Explainability `ViT_LRP.py`", "tests/test_relevance.py"),
    "attnlrp": ("Achtibat et al. 2024, lxt's rules (rachtibat/LRP-eXplains-Transformers)",
                "tests/test_family_relevance_timm.py"),
    "gradcam": ("Selvaraju et al. 2017, jacobgil/pytorch-grad-cam `GradCAM`", "tests/test_cam.py"),
    "gradcam++": ("Chattopadhay et al. 2018, pytorch-grad-cam `GradCAMPlusPlus`", "tests/test_cam.py"),
    "xgradcam": ("Fu et al. 2020, pytorch-grad-cam `XGradCAM`", "tests/test_cam.py"),
    "eigencam": ("Muhammad & Yeasin 2020, pytorch-grad-cam `EigenCAM`", "tests/test_cam.py"),
    "layercam": ("Jiang et al. 2021, pytorch-grad-cam `LayerCAM`", "tests/test_cam.py"),
    "scorecam": ("Wang et al. 2020, pytorch-grad-cam `ScoreCAM`", "tests/test_cam.py"),
    "attn-gradcam": ("Chefer et al. 2021a's baseline, `ViT_explanation_generator.py`",
                     "tests/test_chefer_baselines.py"),
    "lrp-partial": ("Chefer et al. 2021a's baseline (Voita et al. 2019)", "tests/test_chefer_baselines.py"),
    "lrp-full": ("Chefer et al. 2021a's baseline (Binder et al. 2016)", "tests/test_chefer_baselines.py"),
    "flow": ("Abnar & Zuidema 2020, samiraabnar/attention_flow", "tests/test_relevance.py"),
    "norms": ("Darcet et al. 2023, high-norm tokens", "tests/test_mechanism_phenomena.py"),
    "probe": ("the attention-pooling head's own attention (timm `AttentionPoolLatent`, HF SigLIP's head)",
              "tests/test_siglip_parity.py"),
    "probe_rollout": ("attention rollout ending at the pooling probe", "tests/test_family_explorer.py"),
    "grad_eclip": ("Zhao et al. 2024, Grad-ECLIP `generate_emap`", "tests/test_prompts.py"),
    "sclip": ("Wang et al. 2024, wangf3014/SCLIP", "tests/test_dense_clip.py"),
    "naclip": ("Hajimiri et al. 2025, sinahmr/NACLIP", "tests/test_dense_clip.py"),
    "clearclip": ("Lan et al. 2024, mc-lan/ClearCLIP", "tests/test_dense_clip.py"),
    "clipsurgery": ("Li et al. 2023, xmed-lab/CLIP_Surgery", "tests/test_dense_clip.py"),
}


def method_anchor(method: str) -> str:
    """The id of a method's entry on the Methods page (``gradcam++`` and ``gradcam`` must not meet)."""
    return "method-" + method.replace("+", "p").replace("_", "-")


def methods_markdown() -> str:
    """One entry per method of ``vit.methods()``: what it shows and where it applies, its reference, its test."""
    import vit

    methods = vit.methods()
    unknown = set(methods) - set(REFERENCES)
    if unknown:
        raise ValueError(f"docs/hooks.py REFERENCES lacks {sorted(unknown)}: add each method's reference and test")
    lines = ["| method | what it shows — where it applies | reference | held equal by |", "|---|---|---|---|"]
    for method, text in methods.items():
        reference, test = REFERENCES[method]
        lines.append(f"| <span id=\"{method_anchor(method)}\"></span>`{method}` | {_literal(text)} "
                     f"| {reference} | `{test}` |")
    return "\n".join(lines) + "\n"


def _opening_modules() -> list[str]:
    """The modules of ``vit/sources`` that open a family: every ``import_*.py``, and any other with ``SUPPORTED``."""
    names = []
    for path in sorted((ROOT / "vit" / "sources").glob("*.py")):
        if path.stem.startswith("import_") or re.search(r"^SUPPORTED\b", path.read_text(), re.MULTILINE):
            names.append(path.stem)
    return names


def supported(module_name: str) -> str:
    """What a module of ``vit.sources`` opens, in its own words: its ``SUPPORTED``, else its docstring's first
    paragraph."""
    module = importlib.import_module(f"vit.sources.{module_name}")
    text = getattr(module, "SUPPORTED", None) or (module.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(str(text).split())


def _literal(text: str) -> str:
    """``text`` shown as written: Markdown's emphasis characters escaped outside its code spans (``vit_*_dinov3*``
    is a name, not emphasis), a table's ``|`` too."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    return "".join(part if part.startswith("`") else re.sub(r"([*_|\\])", r"\\\1", part) for part in parts)


def families_markdown(kind: str) -> str:
    """The families one Models page covers, one row per opening module, in the module's own words."""
    modules = _opening_modules()
    placed = [m for _, names in KINDS.values() for m in names]
    if set(modules) != set(placed) or len(placed) != len(set(placed)):
        raise ValueError(f"docs/hooks.py KINDS places {sorted(placed)}, vit/sources opens with {modules}: put each "
                         "opening module on exactly one Models page")
    lines = ["| module | what it opens (its `SUPPORTED`) |", "|---|---|"]
    lines += [f"| `vit/sources/{m}.py` | {_literal(supported(m))} |" for m in KINDS[kind][1]]
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
    "cli": cli_markdown,
    "api": api_markdown,
    "bench": bench_markdown,
    **{f"families-{kind}": (lambda kind=kind: families_markdown(kind)) for kind in KINDS},
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

    return MARKER.sub(replace, markdown)


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
