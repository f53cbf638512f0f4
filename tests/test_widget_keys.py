"""Streamlit's session state is one dictionary for every page: a widget key spelled in two modules is two
widgets of possibly different meaning (a number on one page, a folder on another) overwriting each other.

Read statically from the pages' source, so every widget counts, drawn by default or not.
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_FILES = [ROOT / "app.py", *sorted((ROOT / "app_pages").rglob("*.py"))]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def constants(tree: ast.Module) -> dict[str, str]:
    """The module-level names bound to a string, tuple assignments included."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts, strict=False))
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found[name.id] = value.value
    return found


def widget_keys(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each literal widget key (``key=`` a string or a module constant) -> the modules that spell it."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    consts = {name: constants(tree) for name, tree in trees.items()}
    spelled = defaultdict(set)

    def resolve(module: str, expr: ast.expr, imports: dict[str, tuple[str, str | None]]) -> tuple[str, str] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return module, expr.value
        if isinstance(expr, ast.Name):
            if expr.id in consts[module]:
                return module, consts[module][expr.id]
            origin, attr = imports.get(expr.id, (None, None))
            if origin in consts and attr in consts[origin]:
                return origin, consts[origin][attr]
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            origin, attr = imports.get(expr.value.id, (None, None))
            if attr is None and origin in consts and expr.attr in consts[origin]:
                return origin, consts[origin][expr.attr]
        return None  # a key built at run time (an f-string, a parameter): not checked here

    for module, tree in trees.items():
        imports = {}  # local name -> (module, attribute or None for a module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    imports[alias.asname or alias.name] = (whole, None) if whole in trees else (node.module, alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "key" and (found := resolve(module, keyword.value, imports)):
                        spelled[found[1]].add(found[0])
    return spelled


def test_the_collector_sees_a_key_spelled_in_two_modules():
    sources = {"pages.a": 'import streamlit as st\nIMAGES_KEY = "images"\nst.text_input("Folder", key=IMAGES_KEY)\n',
               "pages.b": 'import streamlit as st\nst.number_input("Images", key="images")\n',
               "pages.c": 'from pages.a import IMAGES_KEY\nimport streamlit as st\nst.text_input("", key=IMAGES_KEY)\n'}
    assert widget_keys(sources) == {"images": {"pages.a", "pages.b"}}  # pages.c reuses a's key: one meaning


def test_no_widget_key_is_spelled_in_two_modules():
    spelled = widget_keys({module_name(p): p.read_text(encoding="utf-8") for p in PAGE_FILES})
    assert "train_name" in spelled  # the collector reads the pages
    assert {key: sorted(modules) for key, modules in spelled.items() if len(modules) > 1} == {}
