"""vit-pytorch 1.0.0 (lucidrains, MIT; the PyPI wheel vit_pytorch-1.0.0): vit.py verbatim, the PreNorm layout
(``transformer.layers.0.0.fn.to_qkv``) that older vit-pytorch checkpoints have; the installed vit-pytorch has another."""
