"""The ports: each family's weights mapped, by strict key maps, onto our own ``ViT`` (``vit.model``).

``families/``: the Hugging Face families (and their timm twins), one importer each (``import_*.py``, ``hf.py`` for
the plain ViTs); ``libraries/``: timm's, torchvision's and vit-pytorch's ViTs, the tutorials' from-scratch ViTs and
any layout through a mapping file. A VLM's tower ports live with the VLM (``vit.sources.vlm.import_*``). The library
road beside them (``vit.sources.library_road``) runs the library's own modules instead.
"""
