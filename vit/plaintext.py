"""User-provided text (class names, run names, file names) shown through Streamlit's Markdown as plain text.

Streamlit renders captions, labels and messages as Markdown: a class name such as
``![x](http://host/)`` would make every visitor's browser fetch that address, ``:red[...]``
recolours, ``$...$`` typesets. A backslash before every ASCII punctuation mark (CommonMark
lets any of them be escaped) shows the text exactly as written.
"""

from __future__ import annotations

import re

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character


def escape_markdown(text: object) -> str:
    """``text`` with its Markdown (and Streamlit's :icon:/:colour[]/$LaTeX$ syntax) made literal."""
    return _PUNCTUATION.sub(r"\\\1", str(text))
