"""Where a recorded model's tokens sit: the layer kinds the recorder keeps or names (windows, channels, learnt
queries), the places of each layer's tokens on the image, the towers' extra tokens, and the bounded probe forward that
reads them where the meta device cannot trace."""
