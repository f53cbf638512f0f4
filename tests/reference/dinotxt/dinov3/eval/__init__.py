# Verbatim from https://github.com/facebookresearch/dinov3 @ 6876159a11b4df116f30f667f8c9888617df0751, dinov3/eval/__init__.py
# (DINOv3 License, ../LICENSE.md); run unchanged by tests/test_dinotxt.py
