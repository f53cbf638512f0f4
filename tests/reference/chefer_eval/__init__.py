# Copied verbatim from https://github.com/hila-chefer/Transformer-Explainability
# commit c3e578f76b954e8528afeaaee26de3f07e3fe559, MIT licence (see LICENSE here, copied from the repository's root):
#   metrices.py                  <- utils/metrices.py (the segmentation metrics; imports scikit-learn)
#   imagenet_seg_eval.py         <- baselines/ViT/imagenet_seg_eval.py (the ImageNet-segmentation test)
#   pertubation_eval_from_hdf5.py <- baselines/ViT/pertubation_eval_from_hdf5.py (the positive/negative perturbation test)
#   Imagenet.py                  <- data/Imagenet.py (Imagenet_Segmentation: how imagenet_seg_eval.py reads
#                                   gtsegs_ijcv.mat; imports h5py)
# No changes, but Imagenet.py's 'import cv2' commented out (OpenCV is not a dependency, and no class the tests use
# calls it). The two scripts parse arguments and load pretrained CUDA models when imported, so the tests
# (tests/test_faithfulness_chefer.py) never import them: they take eval_batch / normalize / eval out of the file's
# text with ast and run those functions unchanged, with stand-ins for the globals they read (args, the model, the
# data loader; Tensor.cuda as the identity on a CPU).
