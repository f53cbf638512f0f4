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


def escape_markdown(text: object) -> str:
    """``text`` for a Markdown body, shown exactly as written (line breaks become spaces).

    Leading blanks are dropped (four would start a code block; HTML would not show them anyway).
    """
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _LINE_BREAKS.sub(" ", str(text)).lstrip())


def escape_plotly(text: object) -> str:
    """``text`` for a Plotly label, legend entry or hover text, shown exactly as written."""
    return html.escape(str(text), quote=False)
