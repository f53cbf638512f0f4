# Copied from https://github.com/jacobgil/pytorch-grad-cam
# commit 084273b3f30b54ad0c64cf8020a4337d979a66e0, file pytorch_grad_cam/grad_cam.py, MIT licence (see LICENSE here).
# Only changes: imports (relative; utils/ flattened here).
import numpy as np

from .base_cam import BaseCAM


class GradCAM(BaseCAM):
    def __init__(self, model, target_layers,
                 reshape_transform=None):
        super(
            GradCAM,
            self).__init__(
            model,
            target_layers,
            reshape_transform)

    def get_cam_weights(self,
                        input_tensor,
                        target_layer,
                        target_category,
                        activations,
                        grads):
        # 2D image
        if len(grads.shape) == 4:
            return np.mean(grads, axis=(2, 3))
        
        # 3D image
        elif len(grads.shape) == 5:
            return np.mean(grads, axis=(2, 3, 4))
        
        else:
            raise ValueError("Invalid grads shape." 
                             "Shape of grads should be 4 (2D image) or 5 (3D image).")