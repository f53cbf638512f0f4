"""CLIP Surgery (Li et al. 2025, xmed-lab/CLIP_Surgery @ d4696d4): ``clip_surgery_model.py`` (its
clip/clip_surgery_model.py: the v-v attention on the last six blocks' second path) and ``clip_feature_surgery`` of
its clip/clip.py (``feature_surgery.py``), verbatim; demo.py's similarity before ``get_similarity_map`` is the dense map
before post-processing. The repository states no licence: quoted for testing only, with attribution."""
