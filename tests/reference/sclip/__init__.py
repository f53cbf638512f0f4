"""SCLIP (Wang et al. 2024, wangf3014/SCLIP @ b56bd30): ``model.py`` (its clip/model.py, OpenAI's CLIP with the last
block's correlative self-attention, ``custom_attn(csa=True)``) and ``clip_segmentor.py`` (``CLIPForSegmentation``,
whose ``forward_feature`` is the dense map before post-processing), verbatim but for the imports named in each
header. The repository states no licence: quoted for testing only, with attribution."""
