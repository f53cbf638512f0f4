"""saev's SAE code, vendored for the parity tests of ``vit/features/formats.py`` (MIT, see LICENSE): ``modeling``
as saev is today (schema 5 checkpoints), ``nn_legacy`` as it was before checkpoints had a schema."""
