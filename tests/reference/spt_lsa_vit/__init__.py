# Copied verbatim from https://github.com/aanna0701/SPT_LSA_ViT (Lee, Lee and Song, "Vision Transformer for
# Small-Size Datasets", 2021), commit 54bd796acd28fa11deac21a97b14b154379b34e7:
#   sampler.py <- utils/sampler.py, unchanged (its RASampler, a batch sampler; main.py builds it as
#   RASampler(len(train_dataset), args.batch_size, 1, args.ra, shuffle=True, drop_last=True)).
# The repository has no licence file; the file's own header names Facebook's CC-BY-NC licence, whose text the
# repository does not carry. It is kept only as the tests' reference (tests/test_train_sampling.py).
