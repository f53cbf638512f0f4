"""Each map's computation from one forward (attention, rollout and flow, gradients and relevance, CAMs, dense
features, stages, SAM's masks, a VLM tower's targets): tensors in, tensors out."""
