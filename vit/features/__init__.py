"""Sparse autoencoders on a layer's residual stream: the model and its SAELens files (``sae.py``), activations
streamed from images (``harvest.py``), training and the held-out pass (``train.py``), and what the explorer's
"Features" view reads (``explore.py``)."""
