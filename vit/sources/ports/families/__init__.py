"""One importer per model family (HF transformers and timm layouts) into our ViT."""
