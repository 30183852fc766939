"""dllm/engine/graph_check.py: a replay that a CUDA graph would get wrong is refused, naming what and where;
a replayable step passes; and generate(cuda_graphs="check") finds every family's captured forwards replayable."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dllm
from dllm.engine.graph_check import CheckedRunner, GraphReplayError, is_host_read, traced
from dllm.engine.graphs import GRAPHS_KEY
from dllm.models.tiny import tiny

W = torch.randn(4, 4)
MASK, TWO = torch.tensor([True, False, True]), torch.tensor([1.0, 2.0])


def test_a_replayable_step_passes_and_replays_its_static_inputs():
    x = torch.zeros(2, 4)  # the static input buffer
    runner = CheckedRunner()
    out = runner.capture(lambda: torch.relu(x @ W).sum(dim=1))
    assert torch.equal(out, torch.zeros(2))
    x.copy_(torch.ones(2, 4))  # new inputs, written into the same memory
    runner.replay()
    runner.replay()
    assert torch.equal(runner.out, torch.relu(torch.ones(2, 4) @ W).sum(dim=1)) and runner.replays == 2


def test_a_python_scalar_that_changes_is_named():
    n = {"rows": 2}
    x = torch.randn(4, 4)
    runner = CheckedRunner()
    runner.capture(lambda: x[: n["rows"]].sum(dim=0))
    n["rows"] = 3  # a graph would still slice 2 rows
    with pytest.raises(GraphReplayError, match=r"aten.slice.Tensor at .*test_graph_check.py:\d+\), argument 3: "
                                                r"captured 2, replayed 3"):
        runner.replay()


def test_a_new_input_tensor_is_named():
    box = {"x": torch.randn(2, 4)}
    runner = CheckedRunner()
    runner.capture(lambda: box["x"] * 2)
    box["x"] = torch.randn(2, 4)  # another tensor: a graph reads the captured one's memory
    with pytest.raises(GraphReplayError, match=r"aten.mul.Tensor .*argument 0: captured \('external'"):
        runner.replay()


def test_another_path_through_the_python_is_named():
    flag = {"on": True}
    x = torch.randn(3)
    runner = CheckedRunner()
    runner.capture(lambda: x.exp() if flag["on"] else x.sin())
    flag["on"] = False
    with pytest.raises(GraphReplayError, match=r"operator 0: the capture issued aten.exp.default .* the replay "
                                                r"aten.sin.default"):
        runner.replay()


@pytest.mark.parametrize("step,what", [
    (lambda x: x + x.sum().item(), "_local_scalar_dense"),
    (lambda x: x[x > 0], "index"),
    (lambda x: x.masked_fill(x > 0, 0.0) + len(x.tolist()), "Tensor.tolist"),
    (lambda x: x + torch.tensor([1.0, 2.0, 3.0]), "torch.tensor"),
    (lambda x: x.index_put_((MASK,), TWO), "index_put_"),  # several values at a mask: a nonzero
])
def test_a_host_read_or_upload_in_the_step_is_refused_at_capture(step, what):
    x = torch.randn(3)
    with pytest.raises(GraphReplayError, match=rf"\({what}.* at .*test_graph_check.py|{what} at"):
        CheckedRunner().capture(lambda: step(x))


def test_a_python_scalar_written_into_a_tensor_is_a_constant():
    x = torch.zeros(4)
    cols = torch.tensor([1, 2])
    runner = CheckedRunner()
    runner.capture(lambda: x.clone().index_fill_(0, cols, 5.0) + 0.5)  # scalars baked into the kernels
    runner.replay()
    assert torch.equal(runner.out, torch.tensor([0.5, 5.5, 5.5, 0.5]))


def test_host_reads_include_boolean_mask_writes():
    assert is_host_read(torch.ops.aten.index_put_.default, (torch.zeros(3), [MASK], TWO))
    assert not is_host_read(torch.ops.aten.index_put_.default, (torch.zeros(3), [torch.tensor([0, 2])], TWO))
    one = torch.tensor([1])
    _, entries = traced(lambda: torch.zeros(2).index_fill_(0, one, 1.0))  # an index tensor: no read
    assert [e.op for e in entries][-1] == "aten.index_fill_.int_Scalar"


_RUNS = [("llada", "dual"), ("llada", "prefix"), ("dream", "dual"), ("sdar", "block"), ("fastdllm_v2", "block"),
         ("llada2", "block")]


@pytest.mark.parametrize("sampler", ["threshold", "fast:compact=False"])
@pytest.mark.parametrize("family,cache", _RUNS)
def test_every_familys_captured_forwards_would_replay(family, cache, sampler):
    """bfloat16 (grouped expert matmuls for LLaDA 2's MoE, as on an H100/H200), ragged left-padded rows.
    A shape is captured at its second forward: under a block cache, whose shape changes every block,
    ``threshold`` commits one token a step so that each block takes several cached steps."""
    model = tiny(family, dtype=torch.bfloat16)
    block = 4 if family in ("sdar", "llada2") else 8
    if cache == "block" and sampler == "threshold":
        sampler = "threshold:threshold=1.0"
    prompts = [list(range(10, 22)), list(range(22 - 12 + block, 22))]
    kw = dict(sampler=sampler, cache=cache, gen_length=16, block_length=block)
    eager = dllm.generate(model, prompts, **kw)
    seen = {}
    checked = dllm.generate(model, prompts, cuda_graphs="check",
                            callback=lambda st: seen.setdefault("g", st.extras.get(GRAPHS_KEY)), **kw)
    assert torch.equal(eager.sequences, checked.sequences)
    g = seen["g"]
    assert g.refused is None and g.first_runs >= 1
    if cache == "block" and sampler.startswith("fast"):  # one plain cached forward a block (later steps read the
        assert g.captures == 0  # variants' logits, not captured under a block-causal mask): none repeats
    else:
        assert g.captures >= 1 and sum(c.runner.replays for c in g._graphs.values()) >= 1
    if cache == "dual":  # one shape for every block: its later forwards are checked replays
        assert sum(c.runner.replays for c in g._graphs.values()) >= 4


def test_a_moe_model_whose_experts_read_back_is_not_captured():
    """float32 experts loop over the experts, sized by a read of their counts: nothing is captured, and
    the call says why (a CUDA graph could not hold that read)."""
    model = tiny("llada2", dtype=torch.float32)
    seen = {}
    out = dllm.generate(model, [list(range(10, 22))], cache="block", gen_length=8, block_length=4, cuda_graphs="check",
                        callback=lambda st: seen.setdefault("g", st.extras.get(GRAPHS_KEY)))
    g = seen["g"]
    assert g.captures == 0 and "mixture-of-experts layers loop over the experts" in g.refused
    eager = dllm.generate(model, [list(range(10, 22))], cache="block", gen_length=8, block_length=4)
    assert torch.equal(out.sequences, eager.sequences)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_recommended_setting_replays_right(family):
    """fast + auto (a dual cache with a window of recomputed columns), fast as CUDA runs it (static
    variant batches), ragged rows, several blocks: checked replays, the eager tokens."""
    model = tiny(family, dtype=torch.bfloat16)
    prompts = [list(range(10, 60)), list(range(20, 60))]
    kw = dict(sampler="fast:compact=False", cache="auto", gen_length=96, block_length=16)
    eager = dllm.generate(model, prompts, **kw)
    seen = {}
    checked = dllm.generate(model, prompts, cuda_graphs="check",
                            callback=lambda st: seen.setdefault("g", st.extras.get(GRAPHS_KEY)), **kw)
    assert torch.equal(eager.sequences, checked.sequences)
    assert seen["g"].captures >= 1 and sum(c.runner.replays for c in seen["g"]._graphs.values()) >= 20


def test_a_split_moe_model_is_not_captured_and_never_stacks_absent_experts():
    """Expert parallelism: a rank's ParallelMoE holds AbsentExperts (no projections) and always runs the
    experts' loop; the refusal says so without stacking them (an AttributeError before)."""
    from dllm.models.core.layer.moe import MoEConfig, experts_read_back
    from dllm.models.parallel.layers import AbsentExpert, ParallelMoE

    layer = ParallelMoE(16, MoEConfig(n_experts=4, top_k=2, expert_hidden=8), 0, None, range(0, 2), 8, False)
    assert isinstance(layer.experts[3], AbsentExpert)
    model = torch.nn.Sequential(layer).to(torch.bfloat16)
    with torch.inference_mode():
        assert "loop over the experts" in experts_read_back(model, torch.zeros(1, 16, dtype=torch.bfloat16))


def test_counting_experts_is_named_as_the_reason():
    from dllm.models.core.layer.moe import count_experts, experts_read_back

    model = tiny("llada2", dtype=torch.bfloat16)
    hidden = torch.zeros(1, model.config.d_model, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert experts_read_back(model, hidden) is None  # grouped matmuls (bfloat16 on a CPU)
        with count_experts(model):
            assert "being counted" in experts_read_back(model, hidden)


@pytest.mark.parametrize("write,reads", [
    (lambda x, m: x.index_put_((m,), torch.tensor(0.0)), False),  # x[mask] = 0.0: a masked_fill on CUDA
    (lambda x, m: x.index_put_((m,), torch.ones(int(m.sum()))), True),  # several values: a nonzero
    (lambda x, m: x.index_put_((m,), torch.tensor(1.0), accumulate=True), True),
])
def test_boolean_mask_writes_read_back_unless_one_value(write, reads):
    x, m = torch.zeros(4), torch.tensor([True, False, True, False])
    with _HostReads() as seen:
        write(x, m)
    assert seen.any == reads


def test_sizes_given_or_read():
    r = torch.tensor([1, 2])
    with _HostReads() as seen:
        torch.repeat_interleave(torch.tensor([5, 6]), r, output_size=3)
    assert not seen.any
    with _HostReads() as seen:
        torch.repeat_interleave(torch.tensor([5, 6]), r)
    assert seen.any
    with _HostReads() as seen:
        torch.bincount(r)
    assert seen.any


def test_numpy_asarray_is_a_read():
    import numpy as np

    x = torch.zeros(3)
    with pytest.raises(GraphReplayError, match="__array__"):
        CheckedRunner().capture(lambda: x + float(np.asarray(x).sum()))


class _HostReads(TorchDispatchMode):
    """Whether any operator inside was a host read (``is_host_read``)."""

    any = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.any = self.any or is_host_read(func, args, kwargs)
        return func(*args, **(kwargs or {}))
