import os

# Tests share two cores with whatever else runs; one thread each keeps them predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
