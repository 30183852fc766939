"""The views a cached forward runs through (``dllm.models.core.kv`` holds the buffers they view).

``CacheView``: the forward's query rows are canvas columns ``[start, start + T)`` (after ``extra``
columns); in every layer their fresh K/V overwrite those buffer rows and the queries attend to buffer
rows ``[0, key_end)``. ``StaticView``: the same with the written columns given as a tensor (CUDA
graphs). ``RowsView``: a forward over copies of some buffer rows (verification variants), the call's
buffers untouched; ``StackedView``: the same with each row's variants as one sequence of queries.
``HeldView``: a forward of the rows of a decode still held (``dllm.rows``). ``PackedView``: no
cache, a padded batch's real tokens packed into one row, attention run on the padded layout.
The views reach the buffers through ``view.kv`` (a ``KVCache``); this package imports none of it.
"""

from dllm.models.core.views.base import CacheView, StaticView, canvas_columns
from dllm.models.core.views.packed import PackedView
from dllm.models.core.views.rows import (HeldView, RowsView, StackedView, StaticStackedView, grouped_backend,
                                         stack_groups, unstack_groups)

__all__ = ["CacheView", "HeldView", "PackedView", "RowsView", "StackedView", "StaticStackedView", "StaticView",
           "canvas_columns", "grouped_backend", "stack_groups", "unstack_groups"]
