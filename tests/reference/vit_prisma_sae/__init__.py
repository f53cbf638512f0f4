"""ViT-Prisma's SAE code, vendored for the parity tests of ``vit/features/formats.py`` (MIT, see LICENSE)."""
