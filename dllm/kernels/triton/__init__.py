"""The Triton kernels (``attention``, ``fused``, ``stats``, ``lopa``), their launch rules and observers
(``launch``) and their compilation for NVIDIA targets without a GPU (``ahead``). Importing a module
here imports triton; the dispatching modules one level up import them lazily."""
