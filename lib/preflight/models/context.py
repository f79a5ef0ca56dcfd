"""Context parallelism (CP): one sequence split over ``cp`` GPUs, and the key/value exchange it costs.

Why it exists. Activation memory grows with the tokens a GPU holds (``preflight.models.activations``:
every term is per token, ``s b h``), and at 128K tokens one layer of a 405B model keeps gigabytes even
split 8 ways by tensor parallelism. Context parallelism gives each of ``cp`` GPUs ``s / cp`` of the
sequence, so **every per-token activation term, the logits included, divides by cp**; the weights do
not (each CP rank holds the same ones as its data-parallel peers, and the gradients reduce, and ZeRO
shards, over ``dp x cp`` ranks: Megatron-Core's ``data_parallel_group(with_context_parallel=True)``).
Llama 3 405B trained its 128K stage at TP 8, CP 16, PP 16, DP 8 on 16,384 H100s (Llama 3 paper,
arXiv 2407.21783, Table 4, 380 TFLOPs/GPU, 38 % MFU).

What it costs. Attention needs every earlier key: a GPU's ``s / cp`` queries must meet all ``s`` keys
and values. Two ways to bring them:

* **ring** (Megatron-Core / Transformer Engine's ``cp_comm_type="p2p"``, ring attention): ``cp`` steps;
  in each the GPU computes attention of its queries against one chunk of K and V while it sends that
  chunk on and receives the next. Forward: ``cp - 1`` transfers of one chunk's K and V,
  ``2 b (s/cp) h_kv / tp`` 16-bit values (``h_kv = h kv_heads / heads``: grouped-query attention makes
  them small); backward passes K, V and their gradients: twice the bytes, against twice the compute.
  Each transfer **hides behind one step's attention** when ``t_kv <= t_attn / cp``;
* **all-gather** (Llama 3, sec. 3.3.2; Megatron's ``cp_comm_type="all_gather"``): all of K and V
  gathered once per layer, then attention of the local queries: the same bytes, blocking, cheap because
  GQA keeps K and V small.

Per step, with load-balanced causal chunks (each GPU holds chunks ``i`` and ``2 cp - 1 - i``, so every
ring step computes about the same half block)::

    t_kv   = 2 b (s/cp) h_kv / tp x 2 B / B_link  + latency
    t_attn = 4 b (s/cp)^2 h / tp x 1/2 (causal) / (peak x efficiency)       forward; backward 2x

    t_kv / t_attn  ~  2 h_kv cp rate / (h s B_link)       (bandwidth term; hides when <= 1)

The ratio **falls as 1/s at a given cp**: attention's work per chunk grows as (s/cp)^2, the chunk's
bytes as s/cp. That is why CP is a long-context tool: at 128K tokens and cp 16 the exchange is a few
percent of attention; at 8K with the same cp it is exposed. The link is NVLink when ``tp x cp`` fits in
a node (CP ranks sit next to the TP ranks in Megatron's order tp-cp-ep-dp-pp), else the GPU's share of
the node's NICs.

Left out: the DeepSpeed-Ulysses alternative (all-to-all of heads, bounded by the heads); TE's
per-step kernel launch overheads; attention run at the GEMMs' efficiency (one efficiency per step).
"""
from __future__ import annotations

from dataclasses import dataclass

KV_BYTES = 2                       # 16-bit keys and values on the wire
CP_BACKWARD = 2.0                  # backward: K, V and dK, dV on the ring, against ~2x the forward attention


@dataclass(frozen=True)
class Exchange:
    """The key/value exchange of one layer and one micro-batch on one GPU, forward and backward."""
    cp: int
    chunk_bytes: float             # one chunk's K and V on one GPU (what one ring step sends)
    step_s: float                  # one forward transfer
    attn_step_s: float             # one forward ring step's attention compute
    comm_s: float                  # all transfers of the layer, forward and backward
    ring_exposed_s: float          # what the ring leaves exposed (per step: the transfer beyond its compute)
    allgather_s: float             # the all-gather variant: the same bytes, blocking

    @property
    def ratio(self) -> float:
        """One transfer over one step's attention: <= 1 hides behind it."""
        return self.step_s / self.attn_step_s if self.attn_step_s > 0 else float("inf")


def kv_chunk_bytes(micro_batch_size: int, seq_len: int, hidden: int, heads: int, kv_heads: int, tp: int,
                   cp: int) -> float:
    """One GPU's chunk of K and V: ``2 b (s/cp) h_kv / tp x 2 B``."""
    return 2.0 * micro_batch_size * seq_len / cp * hidden * kv_heads / heads / tp * KV_BYTES


def attention_forward_flops(micro_batch_size: int, seq_len: int, hidden: int, tp: int, cp: int,
                            causal: bool = True) -> float:
    """One GPU's attention forward FLOPs of one layer: ``4 b (s/cp) s h / tp``, halved when causal."""
    return 4.0 * micro_batch_size * seq_len / cp * seq_len * hidden / tp * (0.5 if causal else 1.0)


def exchange(micro_batch_size: int, seq_len: int, hidden: int, heads: int, kv_heads: int, tp: int, cp: int,
             link_GBps: float, latency_s: float, rate_flops: float, causal: bool = True) -> Exchange:
    """The module's formulas for one layer and one micro-batch. ``rate_flops``: the attention's
    achieved FLOP/s (peak x efficiency); ``link_GBps``: the CP neighbours' link, one direction."""
    if cp <= 1:
        return Exchange(cp=1, chunk_bytes=0.0, step_s=0.0, attn_step_s=0.0, comm_s=0.0, ring_exposed_s=0.0,
                        allgather_s=0.0)
    chunk = kv_chunk_bytes(micro_batch_size, seq_len, hidden, heads, kv_heads, tp, cp)
    t_kv = chunk / (link_GBps * 1e9) + latency_s
    t_attn = attention_forward_flops(micro_batch_size, seq_len, hidden, tp, cp, causal) / rate_flops / cp
    hops = cp - 1
    comm = hops * t_kv * (1 + CP_BACKWARD)
    exposed = hops * max(0.0, t_kv - t_attn) * (1 + CP_BACKWARD)
    # all-gather: (cp-1) chunks in, once per layer forward; backward gathers again and reduce-scatters dK, dV
    gather = hops * chunk / (link_GBps * 1e9) + hops * latency_s
    return Exchange(cp=cp, chunk_bytes=chunk, step_s=t_kv, attn_step_s=t_attn, comm_s=comm, ring_exposed_s=exposed,
                    allgather_s=gather * (1 + CP_BACKWARD))
