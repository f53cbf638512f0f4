"""ClearCLIP's fork of open_clip, the three files its vision transformer needs (see ``tests/reference/clearclip``)."""
