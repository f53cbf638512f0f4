# Copied verbatim from https://github.com/adreamwu/SaCo (Wu et al., "On the Faithfulness of Vision Transformer
# Explanations", CVPR 2024), commit b2935279630b704145eef578d000d2f70181319e:
#   compute_SaCo.py <- compute_SaCo.py, unchanged.
# The repository has no licence file; the file is kept only as the tests' reference. It is all the authors published:
# the grouping and the perturbation are left as `...` (s_G, pred_x_G), so tests/test_faithfulness_saco.py runs the
# function's own statements after those two lines (the pairwise loop and the normalisation) unchanged, taken out of
# the file's text with ast, on our s(G_i) and pred(x, G_i).
