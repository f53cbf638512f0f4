"""The library road's views (a model transformers, timm or open_clip runs as it builds it, or a module in hand): its
maps (``road_maps``: attention, rollout, the class map and every method the registry lists for it), their gradients'
methods (``road_gradients``) and captum's attributions (``road_attributions``)."""
