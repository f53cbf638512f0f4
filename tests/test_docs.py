"""The README and the docs site (issue 78): a README read in ten minutes whose every code block runs or is checked,
flags that exist, tables that agree with the code, and a site that builds with no broken internal link."""

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import re
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import vit
from vit.core.cli import option_strings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAX_LINES, MAX_WORDS = 300, 35
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# Other tools' options a code line or the prose may name: pip's, venv's, pytest's, Streamlit's (--server.*).
OTHER_TOOLS = ("pip", "python3 -m venv", "streamlit", "pytest", "torchrun", "ray", "mkdocs")
OTHER_FLAGS = re.compile(r"--(index-url|no-deps|server\.[\w.]+|strict|standalone|nproc_per_node)\b")


def hooks():
    """docs/hooks.py, the site's generators, as a module (it is not a package of the project)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_blocks(markdown: str, language: str | None = None) -> list[str]:
    return [body for lang, body in FENCE.findall(markdown) if language is None or lang == language]


def sentences(markdown: str) -> list[str]:
    """The prose's sentences: code blocks left out, a link or image counted by its text, a table row or list item
    its own unit (a sentence never runs across them)."""
    text = FENCE.sub("", markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("e.g.", "eg").replace("i.e.", "ie")
    units, current = [], []
    for line in text.splitlines():
        starts_unit = re.match(r"\s*(\||#|- |\d+\. )", line)
        if not line.strip() or starts_unit:
            units.append(" ".join(current))
            current = []
        if starts_unit:
            units.append(line)
        elif line.strip():
            current.append(line.strip())
    units.append(" ".join(current))
    return [s for unit in units for s in re.split(r"(?<=[.!?])\s+", unit.strip()) if s]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command that has a parser, by the names a user types: ``vit-predict`` and ``vit.predict``."""
    found = {}
    for script, target in PYPROJECT["project"]["scripts"].items():
        module = importlib.import_module(target.split(":")[0])
        if hasattr(module, "build_parser"):
            found[script] = found[module.__name__] = module.build_parser()
    return found


def explorer_options() -> set[str]:
    return {"--help", "-h", "--version"}  # vit-explorer's own; the rest are Streamlit's (--server.*)


def test_the_readme_is_at_most_300_lines_with_no_sentence_over_35_words():
    assert len(README.splitlines()) <= MAX_LINES
    long = [s for s in sentences(README) if len(s.split()) > MAX_WORDS]
    assert not long, long


def test_the_sentence_counter_sees_a_long_sentence_across_lines_and_not_across_list_items():
    long = " ".join(["word"] * 36)
    assert [len(s.split()) for s in sentences(f"{long[:100]}\n{long[100:]}.\n")] == [36]
    assert all(len(s.split()) < 36 for s in sentences("- " + " word" * 20 + "\n- " + " word" * 20))


def test_the_readmes_two_commands_are_the_app_and_cis_test_command():
    app, tests = [b.strip() for b in code_blocks(README, "bash")[1:3]]
    assert app == "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/streamlit run app.py"
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()  # CI runs the README's test command exactly
    assert "python -m pytest" in tests and (ROOT / "requirements-test-nodeps.txt").is_file()


def test_ci_stops_when_the_readmes_test_command_fails_before_its_tests():
    """Under ``set -e`` a failed install inside the command's ``&&`` chain does not stop the script: the line after
    it must, or CI goes on to the docs and can pass with no test run."""
    import subprocess

    tests = code_blocks(README, "bash")[2].strip()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    guard = lines[lines.index(tests) + 1 + int(lines[lines.index(tests) + 1].startswith("#"))]
    for chain, stops in (("false && true", True), ("true && true", False)):
        done = subprocess.run(["bash", "-c", f"set -euo pipefail; {chain}\n{guard}\necho after"], capture_output=True,
                              text=True, timeout=30)
        assert (done.returncode != 0 and "after" not in done.stdout) == stops, (chain, done)


def test_the_cpu_note_comes_before_the_first_command():
    first_block = README.index("```")
    assert README.index("## CPU or GPU?") < first_block
    assert "download.pytorch.org/whl/cpu" in code_blocks(README, "bash")[0]


def test_the_installs_size_and_its_cuda_share_are_said_just_before_the_cpu_line_and_the_apps_command():
    """Issue 90, item 8: a reader on a CPU machine learns the install's size, and how much of it is CUDA, before
    running either command; the app's command points back to the CPU line."""
    size = re.compile(r"about \d+(\.\d+)? GB, \d+(\.\d+)? GB of it CUDA libraries")
    blocks = code_blocks(README, "bash")
    before_cpu = README[:README.index(blocks[0])].rsplit("```", 1)[0].strip().rsplit("\n\n", 1)[1]
    after_cpu = README.index(blocks[0]) + len(blocks[0])
    before_app = README[after_cpu:README.index(blocks[1])].rsplit("```", 1)[0].strip().rsplit("\n\n", 1)[1]
    assert size.search(" ".join(before_cpu.split())), before_cpu
    assert size.search(" ".join(before_app.split())) and "(#cpu-or-gpu)" in before_app, before_app


def test_the_readmes_notebook_lines_run_on_the_shipped_checkpoint(tmp_path, monkeypatch):
    [block] = code_blocks(README, "python")
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(block, "README.md", "exec"), names)
    assert names["e"].map.shape == (8, 8) and (tmp_path / "legrad.png").stat().st_size > 0
    assert isinstance(names["ablated"], type(names["checkpoint"]))
    assert len(block.splitlines()) <= 10


def vit_command_lines(markdown: str) -> list[list[str]]:
    """Each line of a bash block that runs one of the project's commands, as its words (a `\\` continuation
    joined), from the command's name on."""
    lines = []
    for block in code_blocks(markdown, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].split()
            for i, word in enumerate(words):
                name = word.rsplit("/", 1)[-1]
                if name.startswith("vit-") or (word == "-m" and i + 1 < len(words)
                                               and words[i + 1].startswith("vit.")):
                    lines.append(words[i + 1:] if word == "-m" else [name, *words[i + 1:]])
                    break
    return lines


def test_the_readmes_predict_line_runs_and_its_train_line_parses(tmp_path):
    from vit import predict

    lines = {words[0]: words[1:] for words in vit_command_lines(README)}
    assert set(lines) == {"vit.predict", "vit.train"}
    argv = lines["vit.predict"]
    argv[argv.index("--save-maps") + 1] = str(tmp_path / "maps")
    out = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out):
        assert predict.main(argv) == 0
    assert len(json.loads(out.getvalue())[0]["predictions"]) == 3 and any((tmp_path / "maps").glob("*.npz"))
    args = command_parsers()["vit.train"].parse_args(lines["vit.train"])
    assert (args.dataset, args.preset, args.epochs) == ("cifar10", "cifar-s", 80)


def unknown_flags(markdown: str, parsers: dict[str, argparse.ArgumentParser], prose: bool = True) -> list[str]:
    """The ``--flags`` ``markdown`` names that no command has: on a command's line, that command's options; with
    ``prose``, in the prose's code spans, any command's (or another tool's, see OTHER_FLAGS)."""
    wrong = []
    for words in vit_command_lines(markdown):
        known = explorer_options() if words[0] in ("vit-explorer", "vit.explorer") else \
            set(option_strings(parsers[words[0]]))
        if words[0] in ("vit-explorer", "vit.explorer"):
            words = [w for w in words if not OTHER_FLAGS.match(w)]
        wrong += [f"{words[0]} {w}" for w in words if w.startswith("--") and w.split("=")[0] not in known]
    if not prose:
        return wrong
    every = set().union(*(option_strings(p) for p in parsers.values())) | explorer_options()
    for span in re.findall(r"`([^`\n]+)`", FENCE.sub("", markdown)):
        wrong += [flag for flag in re.findall(r"(?<![\w-])--[a-z][\w.-]*", span)
                  if flag not in every and not OTHER_FLAGS.match(flag)]
    return wrong


def test_every_flag_the_readme_names_is_in_that_commands_help_and_so_is_every_docs_command_lines():
    parsers = command_parsers()
    assert unknown_flags(README, parsers) == []
    # The docs' prose also names the benchmarks' and other tools' options: their commands' lines are checked.
    pages = [p.read_text() for p in (ROOT / "docs").rglob("*.md")]
    assert [flag for page in pages for flag in unknown_flags(page, parsers, prose=False)] == []


def test_a_flag_no_command_has_is_found():
    parsers = command_parsers()
    assert unknown_flags("```bash\n.venv/bin/python -m vit.predict m.pt x.png --top-k 3 --maps-out x\n```\n",
                         parsers) == ["vit.predict --maps-out"]
    assert unknown_flags("Pass `--keep-aspect` or `--no-such-flag`.", parsers) == ["--no-such-flag"]


def readme_section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_methods_are_vit_methods_each_linking_its_entry():
    listed = re.findall(r"\[`([^`]+)`\]\(docs/methods\.md#([\w-]+)\)", readme_section("Methods"))
    assert [m for m, _ in listed] and sorted(m for m, _ in listed) == sorted(vit.methods())
    anchor = hooks().method_anchor
    assert all(link == anchor(method) for method, link in listed)


def test_every_readme_method_link_lands_on_its_entry_as_github_shows_the_file():
    """Issue 90, item 6: the methods table was generated only on the built site, so on GitHub each README link
    landed on a page without it. Each link's file, as committed, holds the anchor on a table row that names the
    method, with its description, reference and test."""
    listed = re.findall(r"\[`([^`]+)`\]\(([^)#]+)#([\w-]+)\)", readme_section("Methods"))
    assert len(listed) == len(vit.methods())
    for method, path, anchor in listed:
        text = (ROOT / path).read_text()
        [row] = [line for line in text.splitlines() if f'<a id="{anchor}"></a>' in line]
        cells = [cell.strip() for cell in row.strip("| ").split(" | ")]
        assert cells[0].endswith(f"`{method}`") and all(cells) and "—" not in cells[2:], row


def test_the_committed_methods_table_is_the_registrys():
    """What GitHub shows of docs/methods.md, docs/which-map.md and each Models page is what the site generates: run
    ``python docs/hooks.py`` after a change to the registry."""
    site = hooks()
    for name in site.COMMITTED:
        text = (ROOT / "docs" / name).read_text()
        assert site.refreshed(text) == text, f"docs/{name} is stale: run python docs/hooks.py"


def test_each_models_page_the_readme_links_holds_its_family_table_as_github_shows_the_file():
    """Issue 90, item 8: the README's family links landed on pages whose tables were generated only on the built
    site. Each page, as committed, holds its table between the markers, a row per family of the registry."""
    site = hooks()
    for page in site.PAGES:
        assert f"models/{page}.md" in site.COMMITTED
        text = (ROOT / "docs" / "models" / f"{page}.md").read_text()
        block = text.split(f"<!-- generated: families-{page} -->\n", 1)[1].split(f"<!-- /generated: families-{page}")[0]
        rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| family |")]
        titles = [f"| {site._literal(f.title)}" for f in site.page_families(page)]
        assert [row.split(" | ")[0] for row in rows] == titles, page


def test_which_map_lists_every_method_with_what_the_registry_says_of_it_and_is_linked():
    """Issue 90, item 8: "Which map should I use?", generated from the registry: a row per method, in the explorer's
    order, with its question, class-specific, signed, cost and tolerance; the README and the site's nav link it."""
    from vit import registry

    site = hooks()
    rows = site.which_map_markdown().splitlines()[2:]
    assert len(rows) == len(registry.methods())
    for row, m in zip(rows, registry.methods(), strict=True):
        cells = [cell.strip() for cell in row.strip("| ").split(" | ")]
        assert cells[0] == f"[`{m.name}`](methods.md#{site.method_anchor(m.name)})"
        assert cells[2:4] == ["yes" if m.class_specific else "no", "yes" if m.signed else "no"], row
        assert all(cell != "—" for cell in cells), row  # every built-in says all five
    committed = (ROOT / "docs" / "which-map.md").read_text()
    assert all(f"`{m.name}`" in committed for m in registry.methods())
    assert "(docs/which-map.md)" in readme_section("Methods")
    assert "which-map.md" in (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]


def test_a_method_added_to_the_registry_gets_its_row_in_which_map(monkeypatch):
    from vit import registry

    new = registry.Method("newcam", "NewCAM", ("class",), "every model", "cam", class_specific=True, signed=True,
                          question="Which patches does NewCAM like?", runs="a forward", tolerance="rtol 0, atol 1e-3")
    monkeypatch.setattr(registry, "methods", lambda group=None: (new,))
    assert hooks().which_map_markdown().splitlines()[2] == (
        "| [`newcam`](methods.md#method-newcam) | Which patches does NewCAM like? | yes | yes | a forward | "
        "rtol 0, atol 1e-3 |")


def test_each_methods_tolerance_is_the_one_its_test_asserts():
    """The page's "held to its reference within" is written in the registry beside the test's name: each rtol and
    atol it gives is one its test's file passes (``rtol=1e-5``), so a loosened test and the page cannot disagree
    unseen."""
    from vit import registry

    for m in registry.methods():
        source = (ROOT / m.test.split("::")[0]).read_text()
        assert f"def {m.test.split('::')[1]}" in source, m.name
        for kind, value in re.findall(r"\b(rtol|atol) (\S+?),?(?=\s|$)", m.tolerance):
            assert re.search(rf"\b{kind}={re.escape(value)}\b", source), (m.name, kind, value)


def test_the_site_generates_a_committed_part_again_from_the_registry():
    site = hooks()
    page = "# Methods\n\n<!-- generated: methods -->\n\n| an old table |\n\n<!-- /generated: methods -->\n\nMore.\n"
    built = site.expand(page)
    assert "an old table" not in built and "generated" not in built
    assert built == "# Methods\n\n" + site.methods_markdown() + "\n\nMore.\n"
    assert site.refreshed(page) == site.refreshed(site.refreshed(page))  # written once, whatever was there

def test_every_method_of_vit_methods_has_its_entry_in_the_generated_table():
    site = hooks()
    table = site.methods_markdown()
    for method in vit.methods():  # the registry's, which the table reads
        assert f'<a id="{site.method_anchor(method)}"></a>`{method}`' in table
    assert len(set(map(site.method_anchor, vit.methods()))) == len(vit.methods())  # gradcam++ is not gradcam


def test_a_method_added_to_the_registry_appears_in_the_generated_table_and_a_removed_one_disappears(monkeypatch):
    from vit import registry

    site = hooks()
    new = registry.Method("newcam", "NewCAM (class-specific)", ("class",), "every model", "cam", class_specific=True,
                          paper="Someone et al. 2026", test="tests/test_cam.py::test_newcam")
    kept = [m for m in registry.methods() if m.name != "flow"]
    monkeypatch.setattr(registry, "methods", lambda group=None: (*kept, new))
    table = site.methods_markdown()
    assert f'<a id="{site.method_anchor("newcam")}"></a>`newcam`' in table and "Someone et al. 2026" in table
    assert f'id="{site.method_anchor("flow")}"' not in table


def test_each_methods_test_is_a_file_of_the_repository():
    from vit import registry

    missing = [m.name for m in registry.methods() if not m.test or not (ROOT / m.test.split("::")[0]).is_file()]
    assert missing == []


def test_every_registered_family_is_on_one_models_page_and_the_readme_links_every_page():
    from vit import registry

    site = hooks()
    shown = [f.name for page in site.PAGES for f in site.page_families(page)]
    assert sorted(shown) == sorted(f.name for f in registry.families())  # each once
    for page in site.PAGES:
        rows = site.families_markdown(page)
        assert all(f"| {site._literal(f.title)} |" in rows for f in site.page_families(page))
        assert (ROOT / "docs" / "models" / f"{page}.md").is_file()
        assert f"(docs/models/{page}.md)" in readme_section("What it opens")


def test_a_family_added_to_the_registry_appears_on_its_page_and_a_kind_without_a_page_fails_the_docs(monkeypatch):
    from vit import registry

    site = hooks()
    new = registry.Family("newvit", "NewViT (made up)", "video", "HF newvit folders", "vit.sources.import_newvit",
                          ("newvit",), "attention, rollout")
    every = registry.families()
    monkeypatch.setattr(registry, "families", lambda kind=None: tuple(
        f for f in (*every, new) if kind is None or f.kind == kind))
    assert "| NewViT (made up) |" in site.families_markdown("video")
    assert "NewViT" not in site.families_markdown("image")
    monkeypatch.setattr(registry, "FAMILY_KINDS", (*registry.FAMILY_KINDS, "audio"))
    with pytest.raises(ValueError, match="audio"):
        site.families_markdown("image")


def test_the_readmes_links_name_files_of_the_repository():
    links = [unquote(urlsplit(link).path) for link in re.findall(r"\]\(([^)]+)\)", README)
             if not link.startswith(("http", "#"))]
    assert links and [link for link in links if not (ROOT / link).exists()] == []


def test_the_citation_the_changelog_and_pyproject_agree_on_the_version():
    version = PYPROJECT["project"]["version"]
    assert f"version = {{{version}}}" in code_blocks(README, "bibtex")[0]
    assert f'version: "{version}"' in (ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d\d-\d\d$", (ROOT / "CHANGELOG.md").read_text(),
                     re.MULTILINE)


class _Links(HTMLParser):
    """A page's links (``href``, ``src``) and the ids it defines."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)
            elif name in ("id", "name") and value:
                self.ids.add(value)


def broken_links(site: Path) -> list[str]:
    """Every internal link of the built site whose file, or anchor in it, does not exist."""
    pages = {}
    for page in site.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text(errors="replace"))
        pages[page.resolve()] = parser
    broken = []
    for page, parser in pages.items():
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue
            path = unquote(parts.path)
            # A path from the root (404.html has them: it is served at any depth) is the site's.
            target = ((site.resolve() / path.lstrip("/")) if path.startswith("/") else (page.parent / path)).resolve() \
                if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site.resolve())}: {link}")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{page.relative_to(site.resolve())}: {link} (no such anchor)")
    return broken


def test_the_link_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<a href="a/">A</a><a href="#top">top</a><h1 id="top">x</h1>'
                                         '<a href="b/">B</a><a href="a/#nowhere">x</a><a href="https://x.org/">x</a>')
    (tmp_path / "a" / "index.html").write_text('<a href="../index.html#top">back</a><img src="p.png">')
    assert sorted(broken_links(tmp_path)) == ["a/index.html: p.png", "index.html: a/#nowhere (no such anchor)",
                                              "index.html: b/"]


NAV_PAGES = ("start", "quickstart", "explorer", "train", "sae", "models", "models/image", "models/windowed",
             "models/vlm", "models/vlm-ask", "models/vlm-clips", "models/video", "models/own", "checkpoints",
             "which-map", "methods", "cli", "notebook",
             "benchmarks", "deploy", "architecture", "changelog", *(f"tutorials/{name}" for name in (
                 "compare-methods", "dense-views", "vlm-lens", "video-clip", "sae-features", "benchmarks")))


def test_a_notebooks_links_to_docs_pages_become_the_sites_urls_and_one_to_no_page_fails(tmp_path):
    files = pytest.importorskip("mkdocs.structure.files")
    pages = files.Files([files.File(path, str(ROOT / "docs"), str(tmp_path), use_directory_urls=True)
                         for path in ("sae.md", "models/vlm.md", "tutorials/lens.md", "tutorials/clip.md")])
    html = ('<a href="../sae.md">SAEs</a> <a href="../models/vlm.md#towers">towers</a> <a href="clip.md">clip</a> '
            '<a href="https://x.org/a.md">out</a> <a href="#here">here</a>')
    assert hooks().notebook_links(html, "tutorials/lens.md", pages) == (
        '<a href="../../sae/">SAEs</a> <a href="../../models/vlm/#towers">towers</a> <a href="../clip/">clip</a> '
        '<a href="https://x.org/a.md">out</a> <a href="#here">here</a>')
    with pytest.raises(ValueError, match="links to ../nowhere.md, which is no page of docs/"):
        hooks().notebook_links('<a href="../nowhere.md">x</a>', "tutorials/lens.md", pages)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_site_builds_strict_with_every_page_and_no_broken_internal_link(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (requirements-docs.txt); .ci/run builds the site")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all((site / page / "index.html").is_file() for page in NAV_PAGES)
    assert broken_links(site) == []
    methods = (site / "methods" / "index.html").read_text()
    assert all(f'id="{hooks().method_anchor(m)}"' in methods for m in vit.methods())
    cli = (site / "cli" / "index.html").read_text()
    assert all(script in cli for script in PYPROJECT["project"]["scripts"])
    assert "--save-maps" in cli and "vit.api.explain" in (site / "notebook" / "index.html").read_text()


def test_every_readme_code_block_is_one_these_tests_run_or_check():
    # CPU wheels (test_packaging's pins), the app and the test command, the command line, the notebook, the
    # citation: a new block needs its test here.
    assert [lang for lang, _ in FENCE.findall(README)] == ["bash", "bash", "bash", "bash", "python", "bash", "bibtex"]


def test_the_readme_gives_the_everyday_lane_on_the_test_commands_venv():
    # Issue 112: both lanes in the README; the lane is the option tests/conftest.py defines (test_lanes.py holds
    # what it leaves out), run with the venv the README's test command made.
    lane = [body.strip() for lang, body in FENCE.findall(README) if "--quick" in body]
    assert lane == [".venv/bin/python -m pytest --quick"]
    assert 'addoption("--quick"' in (ROOT / "tests" / "conftest.py").read_text()
    assert ".venv/bin/python -m pytest --quick" in (ROOT / "CONTRIBUTING.md").read_text()


# -- every page reads in short paragraphs, with no raw HTML (issue 116, item 8) ---------------------------------------

MAX_PARAGRAPH_WORDS = 200
FENCE_LINE = re.compile(r"^\s*(```|~~~)")
HTML_TAG = re.compile(r"</?[A-Za-z][\w-]*(\s[^<>]*)?/?>")  # <img>, </img>, <br/>; not <https://...>, not "a < b"
ANCHOR = re.compile(r'<a id="[\w-]+"></a>')  # the generated tables' anchors, on purpose: GitHub shows them too
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.MULTILINE)


def docs_pages() -> dict[str, str]:
    """Every page of the docs as its source reads: README.md, docs/**/*.md and the files they include (the model
    cards, the changelog), by their path in the repository."""
    pages = {"README.md": README}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        pages[str(page.relative_to(ROOT))] = text
        pages.update({path: (ROOT / path).read_text() for path in INCLUDE.findall(text)})
    return pages


def prose(markdown: str) -> list[str]:
    """The page's lines with fenced code blanked and HTML comments (the generators' markers) taken out."""
    lines, fenced = [], False
    for line in re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL).splitlines():
        if FENCE_LINE.match(line):
            fenced = not fenced
            line = ""
        lines.append("" if fenced else line)
    return lines


def paragraphs(markdown: str) -> list[str]:
    """The page's paragraphs, as a reader meets them: blocks between blank lines, each heading and list item its own
    (its indented lines with it), tables and code left out."""
    found, current = [], []
    for line in prose(markdown) + [""]:
        new = re.match(r"\s*(\||#{1,6} |[-*+] |\d+\. )", line)
        if not line.strip() or new:
            found.append(" ".join(current))
            current = [line.strip()] if new and not line.lstrip().startswith("|") else []
        else:
            current.append(line.strip())
    return [p for p in found if p]


def raw_html(markdown: str) -> list[str]:
    """The HTML tags outside code: Markdown passes them to the page as HTML, so ``<img>`` in a sentence is a broken
    image, not text. Code spans and blocks are text, and so are the generated tables' ``<a id>`` anchors."""
    text = re.sub(r"(`+)(.+?)\1", "", "\n".join(prose(markdown)), flags=re.DOTALL)
    return [m[0] for m in HTML_TAG.finditer(ANCHOR.sub("", text))]


def test_the_paragraph_and_html_checkers_find_a_long_paragraph_and_a_raw_tag_and_nothing_in_code():
    words = " ".join(["word"] * MAX_PARAGRAPH_WORDS)
    assert [len(p.split()) for p in paragraphs(f"# A\n\n{words[:300]}\n{words[300:]} more.\n\n- item\n  two\n")] \
        == [2, MAX_PARAGRAPH_WORDS + 1, 3]
    assert all(len(p.split()) <= 3 for p in paragraphs(f"```\n{words} {words}\n```\n| {words} |\n<!-- {words} -->"))
    assert raw_html('InternVL writes "FrameN: <img>...</img>" per frame.') == ["<img>", "</img>"]
    assert raw_html("A line<br/>break, and <span class=x>this</span>.") == ["<br/>", "<span class=x>", "</span>"]
    assert raw_html('`<img>` and ``a <b>``, <!-- generated: x -->, <https://x.org/>, a < b > c and\n```\n<div>\n```'
                    '\n| <a id="method-x"></a>`x` |') == []


def test_no_docs_page_has_a_paragraph_over_200_words_or_a_raw_html_tag_outside_code():
    """Issue 116, item 8: the VLM page ran paragraphs of 400 to 550 words, and an ``<img>`` outside backticks drew a
    broken image. Each page of the docs, README.md and the files the site includes, reads in paragraphs of at most
    200 words, and says a tag in code."""
    long = {path: [p[:80] for p in paragraphs(text) if len(p.split()) > MAX_PARAGRAPH_WORDS]
            for path, text in docs_pages().items()}
    assert {path: found for path, found in long.items() if found} == {}
    tags = {path: raw_html(text) for path, text in docs_pages().items()}
    assert {path: found for path, found in tags.items() if found} == {}


def test_the_readme_names_the_default_checkpoint_and_links_the_newer_pages():
    """Issue 116, item 8: three checkpoints are shipped, and "the shipped CIFAR-10 checkpoint" named two. The README
    names the one the app and ``vit.shipped()`` open, and links the pages of SAM 3's concepts, several images and
    clips, and Ask in words, each anchor a heading of its page."""
    from vit.core.runfiles import DEFAULT_CHECKPOINT

    assert f"the default, which the app and `vit.shipped()` open, is `{DEFAULT_CHECKPOINT}`" in " ".join(README.split())
    assert vit.shipped().name == DEFAULT_CHECKPOINT
    for link in ("docs/models/windowed.md#sam-3-with-concepts", "docs/models/vlm-clips.md",
                 "docs/explorer.md#ask-in-words"):
        assert f"]({link})" in README, link
        path, _, anchor = link.partition("#")
        headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.MULTILINE)
        assert not anchor or anchor in [re.sub(r"[^\w -]", "", h.lower()).replace(" ", "-") for h in headings]


VLM_PAGES = ("models/vlm.md", "models/vlm-ask.md", "models/vlm-clips.md")


def api_misuses(block: str, receivers: dict) -> list[str]:
    """The calls and attributes of a code block that the API does not have: ``vit.NAME(...)`` and ``x.NAME(...)`` for
    each variable ``x`` of ``receivers`` (its class) bound to the function's own signature, and ``x.NAME`` read on
    one of them an attribute the class, its dataclass fields or its ``__init__`` gives."""
    import ast
    import inspect

    found, seen = [], set()
    for node in ast.walk(ast.parse(block)):  # a call first, then its function's attribute: each read once
        call = node if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        target = call.func if call else node
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)) or id(target) in seen:
            continue
        seen.add(id(target))
        owner, name = target.value.id, target.attr
        if owner == "vit":
            if not hasattr(vit, name):
                found.append(f"vit.{name}")
                continue
            function, skip = getattr(vit, name), 0
        elif owner in receivers:
            cls = receivers[owner]
            source = inspect.getsource(cls)
            if not (hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {})
                    or re.search(rf"self\.{name}\b", source)):
                found.append(f"{owner}.{name}")
                continue
            function, skip = getattr(cls, name, None), 1
        else:
            continue
        if call is not None and callable(function):
            try:
                inspect.signature(function).bind(*[None] * (skip + len(call.args)),
                                                 **{k.arg: None for k in call.keywords})
            except TypeError as e:
                found.append(f"{ast.unparse(call)}: {e}")
    return found


def test_the_vlm_pages_code_calls_the_api_as_the_code_has_it():
    """Issue 116, item 8: each section of the VLM pages has a code block; every ``vit.`` name it calls, every method
    of an answer, a word map or a segment attribution, and every keyword exists with those arguments."""
    from vit.api.maps import Explanation
    from vit.checkpoint import Checkpoint
    from vit.explain.language.vlm_answer import VLMAnswer
    from vit.explain.language.vlm_lens import Ablation
    from vit.explain.language.vlm_segments import SegmentAttribution

    receivers = {"answer": VLMAnswer, "tower": Checkpoint, "e": Explanation, "dog": vit.WordMap, "cat": vit.WordMap,
                 "parts": SegmentAttribution, "ablation": Ablation, "patched": Ablation}
    blocks = [b for page in VLM_PAGES for b in code_blocks((ROOT / "docs" / page).read_text(), "python")]
    assert len(blocks) >= 10
    assert [m for b in blocks for m in api_misuses(b, receivers)] == []
    assert api_misuses("vit.ask_vlm(vlm, 'a.jpg', 'Q', max_tokens=3)\nanswer.attention(0, lyr=2)\nanswer.nope\n"
                       "vit.no_such_name()", receivers) == [
        "vit.ask_vlm(vlm, 'a.jpg', 'Q', max_tokens=3): got an unexpected keyword argument 'max_tokens'",
        "answer.attention(0, lyr=2): got an unexpected keyword argument 'lyr'", "answer.nope", "vit.no_such_name"]


CENSUS_VLM = re.compile(r"Of the (\d+) image-text-to-text types transformers ships, the census built (\d+) tiny "
                        r"offline with their processors: (\d+) answer as `generate` does and (\d+) are placed on the "
                        r"image \(`(bench/results/[^`]+/census_vlm\.md)`")


def test_the_vlm_censuss_table_escapes_the_libraries_messages_itself():
    """A refusal naming a token such as ``<image>`` is shown as text by the census's own Markdown (not by the docs'
    hook), and a ``|`` in it does not split the table's row."""
    from bench.census_vlm import markdown

    row = dict(type="x", builder="generic", result="refused", placed=None, message="no <image> token | & more")
    table = markdown([row], dict(types=1, built=1, answered=0, placed=0, eager_equal=0, refused=1),
                     dict(date="d", versions={}, command="c"))
    assert table.splitlines()[-1] == "| `x` | generic | refused |  |  | no &lt;image> token \\| &amp; more |"


def test_the_readmes_vlm_census_figure_is_the_newest_census_and_the_vlm_page_shows_its_table():
    """Issue 113: the README's figure of the VLM census reads its results (the newest ``census_vlm.json``), and the
    VLM page holds the census's table as ``python docs/hooks.py`` writes it."""
    import json

    site = hooks()
    [found] = CENSUS_VLM.findall(" ".join(README.split()))  # the sentence as read, across its lines
    *figures, path = found
    assert (ROOT / path) == site.census_vlm_path()
    totals = json.loads((ROOT / path).with_suffix(".json").read_text())["totals"]
    assert [int(v) for v in figures] == [totals["types"], totals["built"], totals["answered"], totals["placed"]]
    page = (ROOT / "docs" / "models" / "vlm.md").read_text()
    assert page == site.refreshed(page) and site.census_vlm_markdown() in page


CENSUS = re.compile(r"Of the (\d+) vision families of transformers, timm and open_clip it builds, (\d+) have "
                    r"attention\. Of those, (\d+) open, (\d+) draw \((\d+) % of those with attention\) and (\d+) are "
                    r"refused in one line naming why\. (\d+) could not be built tiny "
                    r".*?\(`(bench/results/[^`]+/census\.md)`")


def test_the_readmes_census_figure_is_the_newest_census_and_the_image_page_shows_it():
    """Issue 117: the README's census figure (and the image page's) reads the newest ``census.json``, its share of
    the families with attention that open and draw counted from its totals, not typed."""
    site = hooks()
    [found] = CENSUS.findall(" ".join(README.split()))  # the sentence as read, across its lines
    *figures, path = found
    run = json.loads((ROOT / path).with_suffix(".json").read_text())
    newest = max((json.loads(p.read_text()).get("date", ""), p.as_posix())
                 for p in (ROOT / "bench" / "results").glob("*/census.json"))
    assert ((ROOT / path).with_suffix(".json").as_posix(), run.get("date", "")) == (newest[1], newest[0])
    totals = run["totals"]
    assert [int(v) for v in figures] == [totals["families"], totals["with_attention"], totals["open"],
                                         totals["open_and_draw"],
                                         100 * totals["open_and_draw"] // totals["with_attention"],
                                         totals["refused"], totals["build_failed"]]
    page = (ROOT / "docs" / "models" / "image.md").read_text()
    assert page == site.refreshed(page) and site.census_markdown() in page
