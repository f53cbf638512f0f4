"""The cost model: what a view of an input costs (tokens, working memory, FLOPs) and whether it may run.

``plan`` holds the views' ``estimate``s and ``decide``; ``memory`` the bytes each holds; the token gate and the
attention layouts' memory are ``vit.costs.bounds`` (the model asks it before its first block).
"""
