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


def test_a_block_whose_earlier_step_committed_the_mask_token_still_finishes():
    """On this random model an arg-max at T = 0 is the mask token at one step of the third block: the
    official loop "commits" it and its last quota is then one short. The last step commits every mask
    left (before: the block ended with a mask and the call raised)."""
    from dllm.models.tiny import tiny

    model = tiny("llada2", seed=0)
    seen = []
    out = dllm.generate(model, [list(range(7, 17))], "sdar", gen_length=10, block_length=4,
                        callback=lambda st: seen.append(st.x[0, 10:].clone()))
    assert not (out.sequences == model.mask_id).any()
    masks_left = [int((x == model.mask_id).sum()) for x in seen]
    assert any(b - a == 0 for a, b in zip(masks_left[1:], masks_left)), masks_left  # a step committed nothing
