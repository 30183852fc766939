"""The checkpoint families: ``TransformerLM`` (``pretrained.py``: a DiffusionLM over the shared
transformer and an official format), the official <-> internal key names (``keymap.py``), the Qwen2/3
key map and config fields shared by Dream, Fast-dLLM v2 and SDAR (``qwen.py``), one module per family
(``llada.py``, ``dream.py``, ``sdar.py``, ``fastdllm_v2.py``, ``llada2.py``), the registry by family name
and ``model_type`` (``registry.py``) and the tiny models' deterministic init (``init.py``).

This file imports nothing (each module imports its siblings).
"""
