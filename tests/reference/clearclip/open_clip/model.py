# Verbatim from https://github.com/mc-lan/ClearCLIP @ ad68a404d55d48d27330b93554eb64a234ff717f, open_clip/model.py: the method encode_image (lines 265-267) of
# `class CLIP(nn.Module):`, unchanged, in its class with nothing else of it (the rest of model.py imports HF, timm and
# ResNet towers the test does not build)
import torch.nn.functional as F
from torch import nn


class CLIP(nn.Module):
    def encode_image(self, image, model_type, ignore_residual: bool = False, normalize: bool = False):
        features = self.visual(image, model_type, ignore_residual)
        return F.normalize(features, dim=-1) if normalize else features
