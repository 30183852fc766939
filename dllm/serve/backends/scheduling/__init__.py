"""The one scheduler every serving backend runs on (``scheduler``: the queue, admission, the running
batch, its step loop), its admission policies (``policy``: continuous, static, serial), the batch's
merged forwards (``batcher``, grouped by ``packing``'s cost model) and continuous mode's running
decodes that requests join (``joined``)."""
