"""Mixture-of-experts: total vs active parameters, where the experts sit, and the all-to-alls they cost.

A mixture-of-experts (MoE) layer replaces the dense MLP with ``E`` expert MLPs (each of hidden size
``f_e``) and a router that sends each token to ``k`` of them (top-k), plus ``s`` shared experts every
token goes through. A model with ``L_moe`` such layers holds all experts' weights but **computes with
the active ones only**::

    expert MLP       m_e = (3 if SwiGLU else 2) h f_e
    N_total          = the profile's params (every expert counted)
    N_active         = N_total - L_moe (E - k) m_e          (the routed experts a token does not visit)
    FLOPs per token  = 6 N_active + 12 L h s                (Kaplan's 6N on the active parameters)

Checked on the published counts (tests/test_moe.py): DeepSeek-V3, 671B total and 37B active (61 layers,
58 MoE, 256 routed + 1 shared expert, top-8, f_e = 2048, h = 7168; DeepSeek-V3 technical report, sec.
4.2); Mixtral 8x7B, 46.7B total and 12.9B active (32 layers, 8 experts, top-2, f_e = 14336; Mistral AI's
release).

**Expert parallelism (EP)**: the ``E`` experts of a layer are spread over ``ep`` GPUs (``E / ep`` each),
carved out of the data-parallel ranks: the dense part is replicated over ``dp``, the experts over
``dp / ep`` (their gradients reduce over that smaller group). Each MoE layer moves every token's hidden
state to the GPUs of its ``k`` experts and back: two **all-to-alls** forward (dispatch, combine) and two
backward, each of ``tokens x h x k`` 16-bit values, of which ``(ep - 1) / ep`` leave the GPU. Inside one
NVLink domain (``ep <= gpus per node``, with tp 1) they run at NVLink speed; across nodes on the GPU's
share of the NICs, which is why DeepSeek-V3 limits each token to 4 nodes (node-limited routing) and
overlaps the all-to-alls with compute (DualPipe): counted blocking here, an upper bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MOE_DISPATCH_BYTES = 2             # 16-bit hidden states on the wire (DeepSeek-V3 dispatches in fp8: 1)


@dataclass(frozen=True)
class Experts:
    experts: int                   # routed experts per MoE layer
    top_k: int
    expert_ffn: int                # f_e
    moe_layers: int
    shared: int = 0                # shared experts (every token)
    swiglu: bool = True

    def mlp_params(self, hidden: int) -> float:
        """Weights of one expert MLP: ``(3 or 2) h f_e``."""
        return (3 if self.swiglu else 2) * hidden * self.expert_ffn

    def routed_params(self, hidden: int) -> float:
        """Every routed expert of every MoE layer: the part EP shards."""
        return self.moe_layers * self.experts * self.mlp_params(hidden)


def active_params(total: float, hidden: int, e: Experts | None) -> float:
    """``N_active = N_total - L_moe (E - k) m_e`` (the module's formula); ``total`` for a dense model."""
    if e is None:
        return total
    return total - e.moe_layers * (e.experts - e.top_k) * e.mlp_params(hidden)


def params_per_gpu(total: float, hidden: int, e: Experts | None, tp: int, pp: int, ep: int,
                   etp: int = 1) -> tuple[float, float]:
    """(dense parameters, routed-expert parameters) one GPU holds: the dense part split by tp x pp, the
    routed experts by pp x ep x etp (expert tensor parallelism splits each expert's matrices ``etp`` ways;
    Megatron's ``--expert-tensor-parallel-size`` defaults to tp)."""
    if e is None:
        return total / (tp * pp), 0.0
    routed = e.routed_params(hidden)
    return (total - routed) / (tp * pp), routed / (pp * ep * etp)


FP8_DISPATCH_BYTES = 1 + 4 / 128   # DeepSeek-V3 / DeepEP: e4m3 values and one fp32 scale per 128 (sec. 3.3)


@dataclass(frozen=True)
class A2A:
    """The all-to-alls of one MoE layer and micro-batch on one GPU (``a2a_layer``)."""
    count: int                     # all-to-alls: dispatch + combine forward and backward (4), again with recompute (6)
    inter_bytes: float             # bytes that cross the network, all of them together
    intra_bytes: float             # bytes that stay inside the NVLink domain
    seconds: float                 # the time, both links at once (the slower sets it)
    network_copies: float = 0.0    # copies of a token one all-to-all sends across the network
    nvlink_copies: float = 0.0     # ... and inside NVLink domains (incl. node-limited routing's forwarding)


def a2a_layer(tokens: int, hidden: int, top_k: int, ep: int, *, ep_per_domain: int, nic_GBps: float,
              nvlink_GBps: float, nic_latency_s: float, nvlink_latency_s: float, fp8_dispatch: bool = False,
              node_limit: int | None = None, full_recompute: bool = False) -> A2A:
    """Dispatch and combine of one MoE layer, forward and backward, for ``tokens`` on one GPU.

    Each token goes to ``top_k`` experts spread over ``ep`` GPUs, ``ep_per_domain`` of them inside this GPU's
    NVLink domain (``d = ep / ep_per_domain`` domains). Without a limit, a copy lands in another domain
    with probability ``(d - 1) / d``: ``k (d - 1) / d`` copies of each token cross the network and
    ``k (ep_per_domain - 1) / ep`` stay inside. **Node-limited routing** (DeepSeek-V3: at most 4 nodes per
    token; Megatron's ``--moe-router-num-groups`` / ``--moe-router-group-topk``) with DeepEP's dispatch sends a
    token once to each remote domain its experts sit in, and forwards it there over NVLink: at most
    ``min(k, M, d) (d - 1) / d`` network copies (a token cannot reach more domains than there are), the rest
    of the ``k (d - 1) / d`` remote copies on NVLink at the receiving end. Bytes per value: the forward
    dispatch in fp8 where chosen (``FP8_DISPATCH_BYTES``), everything else bf16 (DeepSeek-V3 combines and runs
    the backward in bf16).
    Full recompute runs the forward dispatch and combine again: six all-to-alls, not four."""
    if ep <= 1:
        return A2A(0, 0.0, 0.0, 0.0)
    d = max(1, ep // max(1, ep_per_domain))
    copies_inter = (min(top_k, node_limit, d) if node_limit else top_k) * (d - 1) / d
    copies_intra = top_k * (min(ep, ep_per_domain) - 1) / ep
    if node_limit:             # the remote copies not sent over the network are forwarded over NVLink there
        copies_intra += top_k * (d - 1) / d - copies_inter
    fwd_dispatch = FP8_DISPATCH_BYTES if fp8_dispatch else MOE_DISPATCH_BYTES
    per_value = [fwd_dispatch, MOE_DISPATCH_BYTES, MOE_DISPATCH_BYTES, MOE_DISPATCH_BYTES]   # fwd d, fwd c, bwd x2
    if full_recompute:
        per_value += [fwd_dispatch, MOE_DISPATCH_BYTES]
    values = tokens * hidden
    inter = sum(b * values * copies_inter for b in per_value)
    intra = sum(b * values * copies_intra for b in per_value)
    n = len(per_value)
    t_inter = inter / (nic_GBps * 1e9) + (n * (d - 1) * nic_latency_s if d > 1 else 0.0)
    t_intra = intra / (nvlink_GBps * 1e9) + n * (min(ep, ep_per_domain) - 1) * nvlink_latency_s
    return A2A(n, inter, intra, max(t_inter, t_intra), copies_inter, copies_intra)


def all_to_all_bytes(tokens: int, hidden: int, top_k: int, ep: int) -> float:
    """Bytes one GPU sends in one all-to-all of one MoE layer: ``tokens x h x k x 2 B x (ep-1)/ep``."""
    return tokens * hidden * top_k * MOE_DISPATCH_BYTES * (ep - 1) / ep


def all_to_all_s(tokens: int, hidden: int, top_k: int, ep: int, bw_GBps: float, latency_s: float) -> float:
    """One all-to-all: its bytes over the link, plus ``ep - 1`` message latencies."""
    if ep <= 1:
        return 0.0
    return all_to_all_bytes(tokens, hidden, top_k, ep) / (bw_GBps * 1e9) + (ep - 1) * latency_s


def busiest_rank_load(tokens_per_rank: float, ep: int, top_k: int, capacity_factor: float | None = None) -> dict:
    """The busiest expert-parallel rank of one MoE layer, at the granularity a layer waits on.

    Each of the ``ep`` ranks sends ``tokens_per_rank`` tokens, ``top_k`` copies each, spread uniformly over the
    ranks' experts: a rank receives ``tokens_per_rank x top_k`` copies on average, binomially spread, and the
    layer's all-to-all and expert GEMMs wait for the busiest, ``1 + sqrt(2 ln ep) / sqrt(mean)`` times the mean
    (the normal approximation of the maximum of ``ep`` binomials; a balanced router balances the mean, not this
    spread). A **capacity factor** ``c`` (GShard, Megatron's ``--moe-expert-capacity-factor``) caps each rank at
    ``c`` times the mean and drops the rest: the wait is then ``min(load, c)``, and the busiest rank drops
    ``1 - c / load`` of what it received. ``None``: dropless (Megatron's default, DeepSeek-V3)."""
    if ep <= 1:
        return {"load": 1.0, "wait": 1.0, "dropped": 0.0, "mean_tokens": tokens_per_rank * top_k}
    mean = tokens_per_rank * top_k
    load = 1.0 + math.sqrt(2 * math.log(ep)) / math.sqrt(mean) if mean > 0 else 1.0
    wait = load if capacity_factor is None else min(load, capacity_factor)
    dropped = 0.0 if capacity_factor is None or load <= capacity_factor else 1.0 - capacity_factor / load
    return {"load": load, "wait": wait, "dropped": dropped, "mean_tokens": mean}


def busiest_expert_load(tokens: int, experts: int, top_k: int) -> float:
    """The busiest expert's load over the mean under uniform random routing (a binomial maximum, the
    normal approximation ``1 + sqrt(2 ln E) / sqrt(mean)``): what a layer waits for when the router is
    balanced on average. Auxiliary losses and DeepSeek-V3's loss-free bias balance the mean, not this
    spread; a capacity factor caps it by dropping tokens."""
    import math

    mean = tokens * top_k / experts
    return 1.0 + math.sqrt(2 * math.log(experts)) / math.sqrt(mean) if mean > 0 and experts > 1 else 1.0
