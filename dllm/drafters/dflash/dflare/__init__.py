"""DFlare (arXiv 2606.02091; Tencent/AngelSlim ``QwenDFlareDraftModel``): the drafter (``model``) and its
checkpoints in the authors' format (``io``)."""
