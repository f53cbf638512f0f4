"""MaskCLIP (Zhou, Loy & Dai, ECCV 2022, chongzhou96/MaskCLIP @ 245d31f, Apache-2.0 licence in LICENSE): its mmseg
fork's ``mmseg/models/backbones/vit.py`` (``VisionTransformer`` and ``TransformerEncoderLayer``: the last layer's
value embeddings through the attention's output projection, the residual and the FFN, ``return_qkv``) and
``mmseg/models/decode_heads/maskclip_head.py`` (``MaskClipHead``: the visual projection as a 1x1 conv, then the
normalised features against the text embeddings), verbatim but for the imports named in each header."""
