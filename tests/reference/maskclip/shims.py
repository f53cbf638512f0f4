"""Stand-ins for what MaskCLIP's ``vit.py`` and ``maskclip_head.py`` import from mmcv and mmseg, not installed here:
only their ``forward`` methods are run, on namespaces holding open_clip's modules, so nothing here is ever called."""

import torch

from tests.reference.mmseg_shims import _Registry


class BaseModule(torch.nn.Module):
    """mmcv's module base class: the constructors are never run here."""


BaseDecodeHead = BaseModule  # mmseg's decode head base class
BACKBONES = HEADS = _Registry()
build_norm_layer = FFN = MultiheadAttention = constant_init = kaiming_init = trunc_normal_ = None
ModuleList = _load_checkpoint = resize = get_root_logger = PatchEmbed = print_log = None
