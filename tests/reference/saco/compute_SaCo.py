import numpy as np


def compute_SaCo(model, explanation_method, x, K):
    """
    Salience-guided Faithfulness Coefficient (SaCo).

    Parameters:
    - model: Pre-trained model.
    - explanation_method: Explanation method.
    - x: Input image.
    - K: Number of groups G.

    Returns:
    - F: Faithfulness coefficient.
    """

    # initialize F and totalWeight
    F = 0.0
    totalWeight = 0.0

    # Compute the saliency map M(x, ŷ) based on the model, explanation method, and input image
    salience_map = explanation_method(model, x)

    # Generate Gi based on the saliency map M(x, ŷ) and K
    # Then compute the corresponding s(Gi) and ∇pred(x, Gi) for i = 1, 2, ..., K
    s_G = ...  # the list of s(Gi)
    pred_x_G = ...  # the list of ∇pred(x, Gi)

    # Traverse all combinations of Gi and Gj
    for i in range(K - 1):
        for j in range(i + 1, K):
            if pred_x_G[i] >= pred_x_G[j]:
                weight = s_G[i] - s_G[j]
            else:
                weight = -(s_G[i] - s_G[j])

            F += weight
            totalWeight += abs(weight)

    if totalWeight != 0:
        F /= totalWeight
    else:
        raise ValueError("The total weight is zero.")

    return F

