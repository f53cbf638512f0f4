"""Asking in words: a CLIP's or SigLIP's prompts and labels, and where a vision-language model looked for each word
of its answer."""
