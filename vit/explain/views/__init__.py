"""What the explorer, the notebook and the dataset report show: one image's analysis, the maps drawn from it, their
captions and overlays, the dense, mechanism and clip views, a dataset's report."""
