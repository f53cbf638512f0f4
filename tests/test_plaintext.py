"""Markdown escaping of user-provided names, checked against a real Markdown renderer."""

from markdown_it import MarkdownIt

from vit.plaintext import escape_markdown


def rendered_text(markdown: str) -> str:
    html = MarkdownIt("commonmark").render(markdown)
    return html.removeprefix("<p>").removesuffix("</p>\n")


def test_names_with_markdown_render_as_written():
    for name in ("![x](http://evil.example/a.png)", "[click](http://x)", "**bold** _it_", "a\\b", "`code`",
                 "# heading", "1. item", "- item", "<b>html</b>", ":red[alarm] :material/home:", "$x^2$",
                 "cat_1", "plain"):
        shown = rendered_text(escape_markdown(name))
        assert "<a" not in shown and "<img" not in shown and "<strong" not in shown and "<em" not in shown
        expected = name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        assert shown == expected, (name, shown)
