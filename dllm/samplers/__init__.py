"""Samplers: every parallel-decoding rule is a registered class (see ``base.py``).

Importing this package registers the built-in samplers.
"""

from dllm.samplers.base import Sampler, make_sampler, register_sampler, samplers
from dllm.samplers import low_confidence as _low_confidence  # noqa: F401  (registration side effect)
from dllm.samplers import dream as _dream  # noqa: F401
from dllm.samplers import threshold as _threshold  # noqa: F401
from dllm.samplers import eb as _eb  # noqa: F401
from dllm.samplers import klass as _klass  # noqa: F401
from dllm.samplers import localleap as _localleap  # noqa: F401
from dllm.samplers import dus as _dus  # noqa: F401
from dllm.samplers import hierarchy as _hierarchy  # noqa: F401
from dllm.samplers import credit as _credit  # noqa: F401
from dllm.samplers import prophet as _prophet  # noqa: F401
from dllm.samplers import dawn as _dawn  # noqa: F401
from dllm.samplers import ssd as _ssd  # noqa: F401
from dllm.samplers import lopa as _lopa  # noqa: F401
from dllm.samplers import wino as _wino  # noqa: F401
from dllm.samplers import spec_threshold as _spec_threshold  # noqa: F401
from dllm.samplers import sdar as _sdar  # noqa: F401
from dllm.samplers import fastdllm_v2 as _fastdllm_v2  # noqa: F401
from dllm.samplers import apd as _apd  # noqa: F401
from dllm.samplers import cover as _cover  # noqa: F401
from dllm.samplers import learn2pd as _learn2pd  # noqa: F401
from dllm.samplers import dmax as _dmax  # noqa: F401
from dllm.samplers import fast as _fast  # noqa: F401  (after the samplers it may point at)


def list_samplers() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered sampler, aliases noted."""
    return samplers.describe()


__all__ = ["Sampler", "make_sampler", "register_sampler", "samplers", "list_samplers"]
