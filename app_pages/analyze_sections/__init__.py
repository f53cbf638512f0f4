"""Sections of the Analyse page that stand on their own: each a function the page calls where it is shown."""
