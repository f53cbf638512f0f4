# Copied from https://github.com/jacobgil/pytorch-grad-cam
# commit 084273b3f30b54ad0c64cf8020a4337d979a66e0, file pytorch_grad_cam/utils/image.py, MIT licence (see LICENSE here).
# Only changes: scale_cam_image alone, and cv2 / scipy imported where it resizes (opencv is not a dependency; the tests compare on the token grid, target_size None).
import numpy as np


def scale_cam_image(cam, target_size=None):
    result = []
    for img in cam:
        img = img - np.min(img)
        img = img / (1e-7 + np.max(img))
        if target_size is not None:
            import cv2
            from scipy.ndimage import zoom
            if len(img.shape) > 2:
                img = zoom(np.float32(img), [
                           (t_s / i_s) for i_s, t_s in zip(img.shape, target_size[::-1])])
            else:
                img = cv2.resize(np.float32(img), target_size)

        result.append(img)
    result = np.float32(result)

    return result
