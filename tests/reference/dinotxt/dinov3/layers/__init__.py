# Verbatim from https://github.com/facebookresearch/dinov3 @ 6876159a11b4df116f30f667f8c9888617df0751, dinov3/layers/__init__.py
# (DINOv3 License, ../LICENSE.md); run unchanged by tests/test_dinotxt.py
# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This software may be used and distributed in accordance with
# the terms of the DINOv3 License Agreement.

from .attention import CausalSelfAttention, LinearKMaskedBias, SelfAttention
from .block import CausalSelfAttentionBlock, SelfAttentionBlock
from .ffn_layers import Mlp, SwiGLUFFN
from .fp8_linear import convert_linears_to_fp8
from .layer_scale import LayerScale
from .patch_embed import PatchEmbed
from .rms_norm import RMSNorm
from .rope_position_encoding import RopePositionEmbedding
