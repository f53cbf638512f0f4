"""The library road: a model no port reads, run as its own library builds it, its attention recorded.

``transformers_models``: a transformers vision model whose attention runs through transformers' attention interface
(``vit.core.recording_attention``); ``timm_models``: a timm architecture, or an open_clip tower with a timm trunk,
whose blocks use timm's attention (its explicit path run for the asked layers); ``module_road``: a live module in the
user's hands (``vit.load(module, ...)``), a transformers or timm object on its library's road, any other under the
recorder at the attention function (``vit.core.attention_recorder``). Each places the tokens on the image with a
``LibraryLayout`` and gives ``vit.load`` a ``Checkpoint`` with ``road == "library"``.
"""
