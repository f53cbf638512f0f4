# Copied from https://github.com/rachtibat/LRP-eXplains-Transformers
# commit f04344177551bfcc3665e88afe96501f43fe560b, file lxt/efficient/models/gemma3.py, Clear BSD licence (see LICENSE
# here). Only changes: this header; the imports of patches and rules made relative.
import torch
from functools import partial
from torch.nn import Dropout
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP, Gemma3RMSNorm

from .patches import patch_method, patch_attention, patch_cp_attention
from .patches import gated_mlp_forward, cp_gated_mlp_forward, dropout_forward
from .rules import stop_gradient

def gemma3_norm(self, x):
    return x * stop_gradient(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

attnLRP = {
    Gemma3MLP: partial(patch_method, gated_mlp_forward),
    Gemma3RMSNorm: partial(patch_method, gemma3_norm, method_name="_norm"),
    Dropout: partial(patch_method, dropout_forward),
    modeling_gemma3: patch_attention,
}

cp_LRP = {
    Gemma3MLP: partial(patch_method, cp_gated_mlp_forward),
    Gemma3RMSNorm: partial(patch_method, gemma3_norm, method_name="_norm"),
    Dropout: partial(patch_method, dropout_forward),
    modeling_gemma3: patch_cp_attention,
}