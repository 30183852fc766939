"""Test-side transcriptions of the official model files (``*_modeling.py``), restated from the public
code for ``dllm``'s tests (the originals need flash_attn, veomni, liger_kernel or remote code, so they
cannot be imported on a CPU machine); ``tests/models/families/`` compares ``dllm``'s families with them,
and the transcribed decoders in ``tests/reference/decoders/`` run on them.
"""
