# Copied verbatim from https://github.com/facebookresearch/deit (Touvron et al., "Training data-efficient image
# transformers & distillation through attention", ICML 2021), commit 7e160fe43f0252d17191b71cbb5826254114ea5b:
#   samplers.py <- samplers.py, unchanged (its RASampler: repeated augmentation over processes).
# LICENSE is the repository's (Apache 2.0). tests/test_train_sampling.py holds vit.training.sampling equal to it.
