"""Library-road maps (``vit.explain.views.library_maps``'s wing): none yet."""

from __future__ import annotations

METHODS: tuple = ()  # the LibraryMethod's this wing adds, in the explorer's order
