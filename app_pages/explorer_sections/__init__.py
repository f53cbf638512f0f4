"""The explorer page's sections, one module each: the page (``app_pages/explorer.py``) is their outline.

Each section is a function that takes the one frozen ``Shown`` of this run (the checkpoint, the image, the input
size and the map settings; ``state.py``) and what else it needs, and returns what a later section reads. Sections
whose widgets change only themselves are ``st.fragment``s: a click there reruns that section alone, while one that
changes what every section shows (a head picked in the grid, labels that a feature model's prediction reads) asks
for a rerun of the whole page. Their widget keys are named in the module, as constants the tests read.
"""
