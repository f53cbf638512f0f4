"""ViT Attention Explorer: ``streamlit run app.py``.

Page setup and navigation only; each page is a short script in ``app_pages/``. The explorer is
the default page, so the app opens on the shipped checkpoint.
"""

from pathlib import Path

# pandas whole before any page runs. plotly tells pandas objects apart by reading sys.modules without importing
# (get_module("pandas", should_load=False)): while one script thread was still importing pandas (Streamlit's
# tables import it lazily), a figure built in another thread got the half-initialised module and the page died
# ("partially initialized module 'pandas' has no attribute 'Series'"). An import statement waits for it.
import pandas  # noqa: F401
import streamlit as st

import vit
from app_pages.explorer_sections import plotly_preload, starting, uploader

ICON = Path(__file__).resolve().parent / "app_pages" / "icon.png"

# Before anything is drawn: the first of the two runs Streamlit's uploader asks for when a new file replaces the last
# one (a run without any file) waits here for the second, and stops there having sent nothing (issue 51).
uploader.settle_replacements()
# The icon is a file of ours: a Material icon as page_icon makes every browser fetch it from fonts.gstatic.com, which
# an offline machine cannot reach (and which tells Google who opens the app).
st.set_page_config(page_title="ViT Attention Explorer", page_icon=str(ICON), layout="wide")

explorer = st.Page("app_pages/explorer.py", title="Explore attention", icon=":material/visibility:", default=True)
navigation = st.navigation([
    explorer,
    st.Page("app_pages/training.py", title="Train", icon=":material/model_training:"),
    st.Page("app_pages/analyze.py", title="Analyse a dataset", icon=":material/query_stats:"),
])
st.sidebar.caption(f"ViT Attention Explorer {vit.__version__}")  # which release a screenshot or a report shows
if navigation is explorer:
    starting.start()  # a fresh server: the title and "loading the model" while the page imports torch
    plotly_preload.start()  # the browser loads Plotly while the page imports torch and runs the model
try:
    navigation.run()
finally:  # the page clears them before its own title and first chart; this, when it stopped before them
    starting.clear()
    plotly_preload.clear()
