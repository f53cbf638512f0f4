"""User-provided text (class names, run names, dataset labels, file names, log lines, error messages that
quote them) made safe to show as plain text in the two places that would otherwise interpret it.

Streamlit renders the body of ``st.markdown``, ``st.caption``, ``st.error`` and friends as Markdown, so a
class name ``![x](http://host/x.png)`` would make every visitor's browser fetch that URL; Plotly reads
a subset of HTML (``<b>``, ``<a href>``, ``<br>``) in its labels and hover texts.
"""

from __future__ import annotations

import html
import re
import string

# CommonMark lets a backslash escape any ASCII punctuation character; escaping all of them means no link,
# image, emphasis, code span, HTML tag, heading or list can start, nor Streamlit's :colour[...] or $math$.
_MARKDOWN_SPECIAL = re.compile("([" + re.escape(string.punctuation) + "])")
_LINE_BREAKS = re.compile(r"[\r\n]+")
# GFM's autolink literals (http://…, www.…, name@host.tld) are found in the text *after* escapes are
# resolved (Streamlit uses mdast-util-gfm-autolink-literal), so escapes cannot stop them; an invisible
# word joiner (U+2060) after "http:" and "www" and before "@" does.
_WORD_JOINER = "\u2060"
_AUTOLINK_TRIGGERS = re.compile(r"(?i)(https?:)(?=//)|(www)(?=\.)|(?=@)")
_TAGS = re.compile(r"<[^>]*>")  # the tags markdown-it writes for emphasis and code; raw HTML is escaped before


def escape_markdown(text: object) -> str:
    """``text`` for a Markdown body, shown exactly as written (line breaks become spaces).

    Leading blanks are dropped (four would start a code block; HTML would not show them anyway), and
    URLs and e-mail addresses carry an invisible word joiner so that they stay text, not links.
    """
    text = _LINE_BREAKS.sub(" ", str(text)).lstrip()
    text = _AUTOLINK_TRIGGERS.sub(lambda m: (m.group(1) or m.group(2) or "") + _WORD_JOINER, text)
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def plain_text(markdown: str) -> str:
    """What a caption of ours written in Markdown (``**`` for emphasis, names escaped by ``escape_markdown``) reads
    as plain text, for an API's text (``Explanation.description``): the emphasis dropped, the escapes resolved, the
    word joiners removed. Nothing in it is interpreted: raw HTML stays the text it is."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": False}).renderInline(markdown)
    return html.unescape(_TAGS.sub("", rendered)).replace(_WORD_JOINER, "")


def escape_plotly(text: object) -> str:
    """``text`` for a Plotly label, legend entry or hover text, shown exactly as written: its tags as text, its
    control characters as their escapes (``visible``; class names come from files, and U+202E in one turned a
    report's axis labels around)."""
    return html.escape(visible(text), quote=False)


def visible(text: object) -> str:
    """``text`` with every character that is not shown as itself written as its escape, as Python's ``repr``
    writes it: control characters, and format ones such as U+202E RIGHT-TO-LEFT OVERRIDE, which would show a
    run folder named 'run-\\u202egpj.exe' as 'run-exe.jpg' ('\\n' -> '\\\\n', U+202E -> '\\\\u202e'). For
    names that come from files and folders (run names), before they are escaped for where they are shown."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def visible_lines(text: str) -> str:
    """``visible`` for each line of ``text`` (a log's tail), its line breaks kept."""
    return "\n".join(visible(line) for line in text.split("\n"))


def format_bytes(count: int) -> str:
    """1_234_567 -> '1.2 MB' (decimal units, as the Hub shows sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def duration(seconds: float) -> str:
    """A duration as a progress line writes it: '42 s', '3 min 05 s', '2 h 07 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def file_name_part(text: str, limit: int = 40) -> str:
    """``text`` as a piece of a file name: runs of anything but letters, digits, ``.``, ``_`` and ``-`` become one
    ``_`` (a class such as "tench, Tinca tinca" or "a/b" would otherwise name folders or need quoting)."""
    return re.sub(r"[^\w.-]+", "_", text, flags=re.ASCII).strip("._-")[:limit].strip("._-")
