"""Stand-ins for what the dense CLIP segmentors import but this environment does not install (mmseg, mmengine,
PAMR, the repositories' own clip packages and prompt lists, BLIP, GEM): only their ``forward_feature`` methods are
run, on a namespace holding the network and the text features, so nothing here is ever called."""

import torch


class BaseSegmentor(torch.nn.Module):
    """mmseg's segmentor base class: its constructor and data preprocessing are never run here."""


class _Registry:
    def register_module(self):
        return lambda cls: cls


MODELS = _Registry()
SegDataPreProcessor = PixelData = PAMR = clip = tokenizer = create_model = blip_retrieval = gem = None
openai_imagenet_template = []
