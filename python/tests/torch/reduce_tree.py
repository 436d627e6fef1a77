"""The reference's model of hsdp's bf16 gradient reduction (docs/design.md, "bf16 gradients: the
reference follows the mesh's reduction tree"), for parity.py --reduce-bf16: every rank rounds its
full gradient to bf16; the intra reduce-scatter sums the intra group's bf16 values in float in
rank order, multiplies by float(1/I) and rounds to bf16; the inter reduce-scatter does the same
over the inter group (one rank of each node, in node order) with 1/J. The layouts modelled: the
shard group's intra level is a whole node (ranks_per_node == I) and there is one replica (world =
I x J), so rank r sits on node r // I at intra index r % I.
"""

from typing import Dict, List

import torch


def rank_gradients(model, loss_fn, x: torch.Tensor, world: int,
                   one_at_a_time: bool = False) -> List[Dict[str, torch.Tensor]]:
    """Each rank's own fp32 gradient of its slice's mean loss, as the sharded model computes it
    (one_at_a_time: one sequence at a time, another summation order for the noise floor)."""
    per = x.shape[0] // world
    out = []
    for r in range(world):
        mine = x[r * per:(r + 1) * per]
        model.zero_grad(set_to_none=True)
        if one_at_a_time:
            for k in range(per):
                (loss_fn(model, mine[k:k + 1]) / per).backward()
        else:
            loss_fn(model, mine).backward()
        out.append({n: p.grad.detach().clone() for n, p in model.named_parameters()
                    if p.grad is not None})
    model.zero_grad(set_to_none=True)
    return out


def _level(values: List[torch.Tensor]) -> torch.Tensor:
    s = values[0].clone()
    for v in values[1:]:
        s = s + v
    return (s * torch.tensor(1.0 / len(values), dtype=torch.float32)).bfloat16().float()


def bf16_tree(grads: List[Dict[str, torch.Tensor]], intra: int, inter: int
              ) -> Dict[str, torch.Tensor]:
    """The averaged gradient hsdp's hierarchical bf16 reduction produces from `grads` (one dict
    per rank), as fp32 tensors holding bf16 values."""
    assert len(grads) == intra * inter, (len(grads), intra, inter)
    out = {}
    for name in grads[0]:
        b = [g[name].bfloat16().float() for g in grads]
        nodes = [_level(b[n * intra:(n + 1) * intra]) for n in range(inter)]
        out[name] = _level(nodes)
    return out
