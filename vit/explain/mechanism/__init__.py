"""Which component does what: logit lens, direct logit attribution, ablation and patching, and TextSpan's
descriptions of heads."""
