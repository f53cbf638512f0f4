"""User-provided text is shown as written: never as Markdown in Streamlit's text elements, never as HTML in Plotly.

The reference for what a Markdown body shows is markdown-it, a CommonMark parser with HTML enabled
(as GitHub-flavoured Markdown has it).
"""

import re

import pytest
from markdown_it import MarkdownIt

from vit.core.text import escape_markdown, escape_plotly, plain_text, visible, visible_lines

HOSTILE = [
    "![x](http://example.invalid/x.png)",
    "<b>x</b>",
    "[click me](http://example.invalid)",
    "<http://example.invalid>",
    "**bold** _it_ `code` ~~gone~~",
    "# heading",
    "- item",
    "1. first",
    "> quoted",
    "a | b\n--|--\nc | d",
    "&lt;b&gt; &amp; &#60;",
    ":red[coloured] $x^2$ :material/home:",
    "back\\slash\\",
    "[ref]\n\n[ref]: http://example.invalid",
    "    indented code",
]


WORD_JOINER = "\u2060"  # invisible; keeps GFM from finding URLs and e-mail addresses in the text


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_markdown_renders_as_the_literal_text(text):
    rendered = MarkdownIt("commonmark").render(escape_markdown(text)).replace(WORD_JOINER, "")
    literal = re.sub(r"\n+", " ", text).strip().replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert rendered == f"<p>{literal}</p>\n"


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_markdown_embedded_in_a_sentence_makes_no_link_image_or_tag(text):
    rendered = MarkdownIt("commonmark").render(f"**Data** cifar; classes: {escape_markdown(text)}.")
    assert "<img" not in rendered and "<a " not in rendered and "<b>" not in rendered and "<code>" not in rendered


def test_plain_text_is_left_readable():
    assert escape_markdown("cat 1") == "cat 1"


@pytest.mark.parametrize("text", HOSTILE)
def test_a_markdown_caption_read_as_plain_text_keeps_a_name_as_written_and_drops_our_emphasis(text):
    """``plain_text`` of our caption (``**`` around our words, a name escaped): the words without the emphasis and
    the name exactly as written, whatever Markdown or HTML it holds."""
    assert plain_text(f"**Layer 2 of 2**: the class “{escape_markdown(text)}”.") == \
        f"Layer 2 of 2: the class “{' '.join(text.split())}”."


def test_plotly_text_escapes_tags_and_entities():
    assert escape_plotly("<b>x</b> & <a href='http://example.invalid'>y</a>") == \
        "&lt;b&gt;x&lt;/b&gt; &amp; &lt;a href='http://example.invalid'&gt;y&lt;/a&gt;"
    assert escape_plotly("airplane") == "airplane"
    assert escape_plotly("cat\u202egod <i>") == "cat\\u202egod &lt;i&gt;"  # shown as written, not turned around


# GFM's autolink literals as Streamlit's Markdown renderer finds them: in text nodes, after escapes are
# resolved (mdast-util-gfm-autolink-literal, MIT; the regexes as bundled in streamlit/static StreamlitMarkdown).
GFM_URL = re.compile(r"(https?://|www(?=\.))([-.\w]+)([^ \t\r\n]*)", re.IGNORECASE | re.ASCII)
GFM_EMAIL = re.compile(r"(?:(?<=^)|(?<=[\s\W]))([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)", re.ASCII)


@pytest.mark.parametrize("text", ["see http://example.invalid/x.png", "HTTPS://example.invalid", "www.example.invalid",
                                  "mail me@example.invalid", "![x](http://example.invalid/x.png)"])
def test_urls_and_addresses_are_not_turned_into_links_after_escapes_resolve(text):
    rendered = MarkdownIt("commonmark").render(escape_markdown(text))  # escapes resolved, as GFM's transform sees it
    visible = rendered.replace(WORD_JOINER, "")
    assert GFM_URL.search(visible) or GFM_EMAIL.search(visible), "the reference regexes find the original"
    assert not GFM_URL.search(rendered) and not GFM_EMAIL.search(rendered)


def test_control_and_format_characters_of_a_name_are_made_visible():
    """Issue 20, item 9: U+202E RIGHT-TO-LEFT OVERRIDE in a run folder's name showed 'evil\u202egpj.exe' as
    'evilexe.jpg'; such characters are written as their escapes, printable ones (accents, CJK) as they are."""
    assert visible("evil\u202egpj.exe") == "evil\\u202egpj.exe"
    assert visible("a\u2066b\u200fc\u061cd\x1b[31m\ne\u00a0f") == "a\\u2066b\\u200fc\\u061cd\\x1b[31m\\ne\\xa0f"
    assert visible("café 日本 run-1") == "café 日本 run-1"
    assert visible_lines("one\u202e\ntwo") == "one\\u202e\ntwo"
