"""The augmentation policies a run can name, without torch: the parser lists them for ``--help`` and the Train page
offers them; ``vit.training.data.BatchAugment`` implements each."""

AUGMENTATIONS = ("none", "crop", "flip-crop", "trivialaugment", "randaugment", "autoaugment", "seed")
MAX_MAGNITUDE = 30  # RandAugment's default 31 magnitude bins are 0..30
