"""The video families' ports: plain tubelet ViTs (VideoMAE, ViViT), divided attention (TimeSformer) and V-JEPA 2."""
