"""A selectbox whose options hold None says what None is (issue 116, item 11): Streamlit shows a selectbox whose
value is None as its placeholder, "Choose an option" unless one is given, whatever ``format_func`` says of None (the
VLM's Head box showed "Choose an option" for the heads fused). Every page's such box gives its placeholder."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def none_option_boxes(path: Path) -> list[tuple[int, bool]]:
    """(line, whether it gives a placeholder) of each ``selectbox(label, options)`` in ``path`` whose options hold a
    list with None in it (``[None, *range(H)]``, or such a list in one branch of a condition)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "selectbox"
                and len(node.args) > 1):
            continue
        lists = [n for n in ast.walk(node.args[1]) if isinstance(n, ast.List)]
        if any(isinstance(e, ast.Constant) and e.value is None for n in lists for e in n.elts):
            found.append((node.lineno, any(k.arg == "placeholder" for k in node.keywords)))
    return found


def test_the_collector_sees_a_box_with_none_among_its_options(tmp_path):
    page = tmp_path / "page.py"
    page.write_text('st.selectbox("Head", [None, *range(4)], key="h")\n'
                    'st.selectbox("Query", t if p else [None, *t], key="q", placeholder="what it reads")\n'
                    'st.selectbox("Class", [-1, 0, 1], key="c")\n')
    assert none_option_boxes(page) == [(1, False), (2, True)]


def test_every_selectbox_with_a_none_option_gives_its_placeholder():
    pages = [ROOT / "app.py", *sorted((ROOT / "app_pages").rglob("*.py"))]
    missing = [f"{path.relative_to(ROOT)}:{line}" for path in pages for line, given in none_option_boxes(path)
               if not given]
    assert not missing, f"a selectbox with None among its options and no placeholder: {missing}"
