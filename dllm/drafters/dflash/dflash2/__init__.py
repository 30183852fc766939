"""DFlash 2 (z-lab/dflash ``dflash/model.py``, ``DFlash2DraftModel``): the drafter (``model``) and its
checkpoints (``io``, with ``load_any_dflash``, which reads the architecture from config.json)."""
