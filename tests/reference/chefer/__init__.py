# Chefer, Gur & Wolf (CVPR 2021)'s code, from https://github.com/hila-chefer/Transformer-Explainability
# commit c3e578f76b954e8528afeaaee26de3f07e3fe559, MIT licence (see LICENSE here):
#   ViT_LRP.py, layers_ours.py     <- baselines/ViT/ViT_LRP.py, modules/layers_ours.py (changes: in their headers)
#   ViT_orig_LRP.py, layers_lrp.py <- baselines/ViT/ViT_orig_LRP.py, modules/layers_lrp.py (plain LRP: "full",
#                                     "last_layer"); only change: ViT_orig_LRP.py's imports (relative layers_lrp,
#                                     torch's trunc_normal_, ViT_LRP's to_2tuple; helpers' load_pretrained dropped)
#   ViT_new.py                     <- baselines/ViT/ViT_new.py (the model generate_cam_attn explains); only change:
#                                     its imports, as ViT_orig_LRP.py's
#   ViT_explanation_generator.py   <- baselines/ViT/ViT_explanation_generator.py, unchanged (its .cuda() calls
#                                     run on a CPU under the tests' Tensor.cuda stand-in; generate_cam_attn's
#                                     14 x 14 grid is the tests' model's)
