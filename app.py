"""ViT Attention Explorer: ``streamlit run app.py``.

Page setup and navigation only; each page is a short script in ``pages/``. The explorer is
the default page, so the app opens on the shipped checkpoint.
"""

import streamlit as st

st.set_page_config(page_title="ViT Attention Explorer", page_icon=":material/visibility:", layout="wide")

navigation = st.navigation([
    st.Page("pages/explorer.py", title="Explore attention", icon=":material/visibility:", default=True),
    st.Page("pages/training.py", title="Train", icon=":material/model_training:"),
    st.Page("pages/analyze.py", title="Analyse a dataset", icon=":material/query_stats:"),
])
navigation.run()
