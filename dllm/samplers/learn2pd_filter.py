"""Learn2PD's filter (``dllm.samplers.learn2pd``; Bao et al., arXiv 2509.25188, the ``LogisticRegression``
of ims-kdks/Learning-to-Parallel-Decoding ``model/small_model.py``): the module, its files
(``filter.json`` + ``filter.safetensors``), the shipped filters, loading by name or directory, and the
folded form the decode step runs (the same logits, bit for bit, in fewer calls)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn as nn

from dllm.options import SettingError

FILTER_CONFIG = "filter.json"
FILTER_WEIGHTS = "filter.safetensors"
DEFAULT_FILTER = "learn2pd-tiny-surprisal"


INPUTS = ("confidence", "surprisal")  # what the filter reads: c (the authors'), or -log(1 - c) (ours)
SURPRISAL_CAP = 1 - 2 ** -24  # c is clamped below 1 before -log(1 - c): at most 16.6 nats


class Learn2PDFilter(nn.Module):
    """The block's confidences [R, W] -> one logit per position [R, W] ("is this prediction final").

    The authors' two-layer filter: ``Linear(width, hidden) -> ReLU -> Linear(hidden, width)``
    (their ``hidden = width = 32``: 2,112 parameters). A block narrower than ``width`` is
    zero-padded on the right and the first W logits are returned; a wider one is refused.
    ``input``: ``"confidence"`` reads ``c`` as the authors' filter does; ``"surprisal"`` (ours) reads
    ``-log(1 - c)``, which spreads the confidences of a model that is almost always near-certain
    (the tiny models: 42 % of the positions at ``c >= 0.99``) over a usable range; both map 0 to 0,
    so the padding means "confidence 0" either way."""

    def __init__(self, width: int = 32, hidden: Optional[int] = None, meta: Optional[dict] = None,
                 input: str = "confidence") -> None:
        super().__init__()
        hidden = width if hidden is None else hidden
        for name, value in (("width", width), ("hidden", hidden)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Learn2PDFilter {name} must be a positive integer, got {value!r}")
        if input not in INPUTS:
            raise ValueError(f"Learn2PDFilter input must be one of {', '.join(map(repr, INPUTS))}, got {input!r}")
        self.width, self.hidden, self.input, self.meta = width, hidden, input, dict(meta or {})
        self.linear1 = nn.Linear(width, hidden)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(hidden, width)

    def features(self, conf: torch.Tensor) -> torch.Tensor:
        """What the layers read: c (float32), or -log(1 - c)."""
        x = conf.float()
        return x if self.input == "confidence" else -torch.log1p(-x.clamp(max=SURPRISAL_CAP))

    def forward(self, conf: torch.Tensor) -> torch.Tensor:
        w = conf.shape[-1]
        if w > self.width:
            raise ValueError(f"the Learn2PD filter reads blocks of at most {self.width} positions, got {w}: "
                             f"decode with block_length <= {self.width}, or train a wider filter "
                             f"(dllm/train/learn2pd.py, width=)")
        x = self.features(conf)
        if w < self.width:
            x = nn.functional.pad(x, (0, self.width - w))  # [R, N]: zeros right of the block
        return self.linear2(self.relu(self.linear1(x)))[..., :w]  # [R, W]

    def save(self, directory: Union[str, Path]) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = {"width": self.width, "hidden": self.hidden, "input": self.input, **self.meta}
        (directory / FILTER_CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(directory / FILTER_WEIGHTS))
        return directory


def shipped_filters() -> list[str]:
    """Names of the filters shipped in ``dllm/models/embedded``."""
    from dllm.models.loading import EMBEDDED_DIR

    if not EMBEDDED_DIR.is_dir():
        return []
    return sorted(p.name for p in EMBEDDED_DIR.iterdir() if (p / FILTER_CONFIG).is_file())


def filter_directory(spec: str) -> Path:
    """The directory of a filter: an embedded name, else a path. SettingError naming ``filter``."""
    from dllm.models.loading import EMBEDDED_DIR

    if spec in shipped_filters():
        return EMBEDDED_DIR / spec
    path = Path(spec).expanduser()
    if (path / FILTER_CONFIG).is_file():
        return path
    raise SettingError("filter", f"filter {spec!r} is neither a shipped Learn2PD filter ({', '.join(shipped_filters())})"
                                 f" nor a directory holding {FILTER_CONFIG} and {FILTER_WEIGHTS}")


_LOADED: dict[str, Learn2PDFilter] = {}  # resolved directory -> filter (CPU), loaded once per process


def load_filter(spec: Union[str, Path, Learn2PDFilter]) -> Learn2PDFilter:
    """A filter from an embedded name or a directory (read once per process), or the module itself."""
    if isinstance(spec, Learn2PDFilter):
        return spec
    from dllm.models.heads import build_head, read_head_files

    directory = filter_directory(str(spec))
    key = str(directory.resolve())
    if key not in _LOADED:
        cfg, tensors = read_head_files(directory, FILTER_CONFIG, FILTER_WEIGHTS, "Learn2PD filter")

        def make(c: dict) -> Learn2PDFilter:
            meta = {k: v for k, v in c.items() if k not in ("width", "hidden", "input")}
            return Learn2PDFilter(c["width"], c["hidden"], meta, c.get("input", "confidence"))

        _LOADED[key] = build_head(make, cfg, tensors, directory, FILTER_CONFIG, FILTER_WEIGHTS, "Learn2PD filter")
    return _LOADED[key]


_NARROW = (torch.bfloat16, torch.float16, torch.float32)  # widened to float32 exactly by a multiply


@dataclass(frozen=True)
class FoldedFilter:
    """A filter's layers as the decode step runs them: ``Learn2PDFilter.forward``'s logits, bit for bit,
    in fewer calls. For ``input="surprisal"`` the layers read ``log1p(-c)`` and ``linear1``'s weight
    carries the sign of ``-log1p(-c)``: IEEE negation is exact, so every product of the matmul (the
    padding's too, -0.0 times -w) is the same float. ``-c`` is one multiply by a float32 ``[-1]``, which
    widens c to float32 as well (a 1-d operand takes part in type promotion)."""

    width: int
    w1: torch.Tensor  # [H, N]: linear1's weight, negated for surprisal
    b1: torch.Tensor  # [H]
    w2: torch.Tensor  # [N, H]
    b2: torch.Tensor  # [N]
    minus_one: Optional[torch.Tensor]  # float32 [1] (surprisal); None: the layers read c

    def __call__(self, conf: torch.Tensor) -> torch.Tensor:
        """conf [R, W] (W <= width) -> [R, W] logits."""
        w = conf.shape[-1]
        if self.minus_one is None:
            x, pad = conf.float(), 0.0
        else:
            neg = conf * self.minus_one if conf.dtype in _NARROW else -conf.float()  # -c: [R, W] float32
            x, pad = torch.log1p(neg.clamp_(min=-SURPRISAL_CAP)), -0.0  # log1p(-min(c, cap))
        if w < self.width:
            x = nn.functional.pad(x, (0, self.width - w), value=pad)  # [R, N]
        h = torch.relu(nn.functional.linear(x, self.w1, self.b1))  # [R, H]
        return nn.functional.linear(h, self.w2, self.b2)[..., :w]  # [R, W]


def fold_filter(f: Learn2PDFilter) -> FoldedFilter:
    """``f``'s weights for ``FoldedFilter`` (on f's device)."""
    with torch.no_grad():
        w1, minus_one = f.linear1.weight, None
        if f.input == "surprisal":
            w1 = -w1
            minus_one = torch.full((1,), -1.0, dtype=torch.float32, device=w1.device)
    return FoldedFilter(f.width, w1, f.linear1.bias, f.linear2.weight, f.linear2.bias, minus_one)


def copy_filter_to(f: Learn2PDFilter, device: torch.device) -> Learn2PDFilter:
    """A copy of ``f`` on ``device`` (eval mode)."""
    g = Learn2PDFilter(f.width, f.hidden, f.meta, f.input)
    g.load_state_dict(f.state_dict())
    return g.to(device).eval()


__all__ = ["DEFAULT_FILTER", "FILTER_CONFIG", "FILTER_WEIGHTS", "INPUTS", "SURPRISAL_CAP", "FoldedFilter",
           "Learn2PDFilter", "copy_filter_to", "filter_directory", "fold_filter", "load_filter", "shipped_filters"]
