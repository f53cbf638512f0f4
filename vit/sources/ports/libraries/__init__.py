"""ViTs written in other libraries or from scratch (timm's and torchvision's ViT, vit-pytorch, tutorials), and the
key mapping for any other."""
