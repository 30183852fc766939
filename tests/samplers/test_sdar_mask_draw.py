"""The sdar sampler never commits the mask token (the official loop may draw it at T > 0)."""

import torch

import dllm
from dllm.samplers.sdar import never_mask


def test_never_mask_replaces_only_mask_draws():
    logits = torch.tensor([[[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 9.0, 1.0]]])  # [1, 2, 4]; mask id 2
    x0 = torch.tensor([[2, 1]])
    assert never_mask(x0, logits, mask_id=2).tolist() == [[1, 1]]  # row 0 drew the mask: its best other


class MaskLover:
    """The model, with the mask token made (nearly) certain in every forward's logits."""

    def __init__(self, model):
        self.__dict__["_m"] = model

    def __getattr__(self, name):
        return getattr(self._m, name)

    def __call__(self, *args, **kwargs):
        out = self._m(*args, **kwargs)
        out.logits[..., self._m.mask_id] += 30.0
        return out


def test_a_model_that_always_predicts_the_mask_still_finishes():
    model = MaskLover(dllm.load("tiny-random-sdar"))
    bs = model.config.block_size
    for t in (0.0, 1.0):
        out = dllm.generate(model, [[5, 6, 7]], "sdar", gen_length=2 * bs, cache="block", temperature=t, seed=0)
        gen = out.sequences[0, out.prompt_length:]
        assert not (gen == model.mask_id).any() and gen.numel() == 2 * bs
