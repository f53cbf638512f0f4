"""The explorer from a notebook (issue 117, item 5): ``in_hand`` holds the models ``vit.explore`` serves and runs
Streamlit's server in the notebook's own process."""
