"""Reference transcription of JetSpec's greedy tree decoding (Hu et al., arXiv 2606.18394), restated
from the authors' code (hao-ai-lab/JetSpec): the draft head's causal mask
(``jetflow/models/draft_head.py``, ``_build_dflash_causal_attention_mask`` with ``causal_head``),
the head call (``jetflow/draft_head_adapter.py``, ``_DraftHeadForward._forward_head``: block
``[anchor, mask x (B-1)]`` embedded with the target's table, positions ``0 .. ctx_len + B - 1``,
logits of block positions 1..B-1 through the target's LM head, ``draft_shift`` off), the tree
(``jetflow/tree/baselines/accum_logp.py``, ``_build_from_topk``: the budget counts the root) and the
walk (``jetflow/tree/_core/accept.py``, ``tree_accept`` at temperature 0); no code copied. One row,
no KV caches: every round re-runs the head over all context features and the target over the
committed prefix plus the tree (the authors' caches only avoid recomputation). The head's layers are
``dllm``'s ``DFlashDrafter`` (tested against z-lab's DFlash elsewhere) driven with the authors' mask,
built here by key INDEX (``key <= cached + ctx_len + i``), not by position.

``build_tree`` is the authors' tree builder on one row's per-depth logits; ``jetspec_generate``
returns (generated ids, tokens committed per round).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch
import torch.nn.functional as F


def build_tree(root_token: int, draft_logits: torch.Tensor, width: int, budget: int) -> tuple[list[int], list[int], list[int]]:
    """(tokens, parents, depths) of ``[root, nodes]``; draft_logits [D, V]; ``budget`` counts the root."""
    log_probs = torch.log_softmax(draft_logits, dim=-1)  # [D, V]
    top_lp, top_tok = torch.topk(log_probs, width, dim=-1)  # [D, width]
    top_lp, top_tok = top_lp.tolist(), top_tok.tolist()
    depth_count = len(top_tok)
    tokens, parents, depths = [root_token], [-1], [0]
    heap = [(0.0, 0, 0)]  # (-cumulative log-prob, insertion counter, node)
    counter = 0
    while heap and len(tokens) < budget:
        neg, _, node = heapq.heappop(heap)
        d = depths[node]
        if d >= depth_count:
            continue
        for j in range(min(width, budget - len(tokens))):
            cum = -neg + top_lp[d][j]
            tokens.append(top_tok[d][j])
            parents.append(node)
            depths.append(d + 1)
            counter += 1
            heapq.heappush(heap, (-cum, counter, len(tokens) - 1))
    return tokens, parents, depths


def tree_accept(tokens: list[int], parents: list[int], target_tokens: list[int]) -> tuple[list[int], int]:
    """(accepted path of node indices, root first; the correction token): follow the child carrying
    the target's arg-max until there is none."""
    children: list[dict[int, int]] = [dict() for _ in tokens]
    for i in range(1, len(tokens)):
        children[parents[i]][tokens[i]] = i
    path, cur = [0], 0
    while target_tokens[cur] in children[cur]:
        cur = children[cur][target_tokens[cur]]
        path.append(cur)
    return path, target_tokens[cur]


def head_logits(head, target, features: torch.Tensor, anchor: int) -> torch.Tensor:
    """[B-1, V] draft logits of the block after ``anchor``; features [1, C, taps * D] of the C tokens before it."""
    block = head.block_size
    c = features.shape[1]
    ids = torch.tensor([[anchor] + [head.mask_token_id] * (block - 1)])
    embeds = F.embedding(ids, target.get_input_embeddings().weight)
    key_index = torch.arange(c + block)
    query_index = c + torch.arange(block)  # cached (0) + ctx_len + i
    mask = (key_index[None, :] <= query_index[:, None])[None, None]  # [1, 1, B, C + B]
    hidden = head(embeds, features, feature_positions=torch.arange(c)[None],
                  block_positions=torch.arange(c, c + block)[None], attn_mask=mask)
    return head.compute_logits(hidden[0, 1:], target.lm_head)


@torch.no_grad()
def jetspec_generate(target, head, prompt: Sequence[int], max_new_tokens: int, *, budget: int, width: int,
                     eos_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    taps = head.target_layer_ids
    out = target(input_ids=torch.tensor([list(prompt)]), output_hidden_states=True)
    features = torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1)  # [1, Lp, taps * D]
    generated = [int(out.logits[0, -1].argmax())]
    commits: list[int] = []
    while len(generated) < max_new_tokens and generated[-1] not in eos_ids:
        seq = list(prompt) + generated
        c = len(seq) - 1  # context tokens (the anchor has no features yet)
        logits = head_logits(head, target, features, seq[-1])
        tokens, parents, depths = build_tree(seq[-1], logits, width, budget)
        n = len(tokens)
        allowed = torch.zeros((c + n, c + n), dtype=torch.bool)
        allowed[:, :c] = torch.tril(torch.ones((c + n, c), dtype=torch.bool))  # prefix: causal
        allowed[c:, :c] = True
        for i in range(n):  # tree rows: ancestors and itself
            j = i
            while j >= 0:
                allowed[c + i, c + j] = True
                j = parents[j]
        positions = torch.tensor([list(range(c)) + [c + d for d in depths]])
        ver = target(input_ids=torch.tensor([seq[:-1] + tokens]), attention_mask=allowed[None, None],
                     position_ids=positions, output_hidden_states=True)
        path, correction = tree_accept(tokens, parents, ver.logits[0, c:].argmax(-1).tolist())
        hidden = torch.cat([ver.hidden_states[i + 1] for i in taps], dim=-1)[:, c:]  # [1, N, taps * D]
        features = torch.cat([features, hidden[:, path]], dim=1)
        new = [tokens[i] for i in path[1:]] + [correction]
        room = max_new_tokens - len(generated)
        cut = next((k + 1 for k, t in enumerate(new) if t in eos_ids), len(new))
        new = new[:min(cut, room)]
        generated += new
        commits.append(len(new))
    return generated, commits


__all__ = ["build_tree", "head_logits", "jetspec_generate", "tree_accept"]
