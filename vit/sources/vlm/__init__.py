"""Vision-language models and text towers: a VLM's vision tower and projector, the whole VLM, its word embeddings,
CLIP's and SigLIP's text side."""
