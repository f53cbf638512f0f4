"""ClearCLIP (Lan et al. 2024, mc-lan/ClearCLIP @ ad68a40): its fork of open_clip's ``transformer.py`` (with the
``utils.py`` and ``pos_embed.py`` it imports, as a package so its relative imports stay as written), ``encode_image``
of its ``model.py`` and ``clearclip_segmentor.py`` (``ClearCLIPSegmentation.forward_feature``, the dense map before
post-processing), verbatim but for what each header names. The repository's licence is its "S-Lab License 1.0"
(a .doc file there); quoted for testing only, with attribution."""
