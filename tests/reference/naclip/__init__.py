"""NACLIP (Hajimiri et al. 2025, sinahmr/NACLIP @ 0cac3a6, MIT licence in LICENSE): ``model.py`` (its clip/model.py:
the last block's neighbourhood attention and its "reduced" architecture, ``set_params``) and ``naclip.py`` (the
``NACLIP`` segmentor, whose ``forward_feature`` is the dense map before post-processing), verbatim but for the
imports named in each header."""
