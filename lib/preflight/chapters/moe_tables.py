"""What a mixture-of-experts layer costs beyond its FLOPs: the all-to-alls (chapter 3) and the busiest
expert-parallel rank (chapter 4), as tables the notebooks, explorers and exercises read.

No formula lives here. The bytes and seconds of the all-to-alls are ``preflight.models.moe.a2a_layer``'s
(node-limited routing, fp8 dispatch, recompute), what a step exposes of them is the step model's
(``preflight.chapters.step.plan_step``: ``a2a_comm_s`` all of them, ``a2a_s`` what compute does not hide,
``training.moe_a2a_overlap`` for DualPipe-style overlap), and the busiest rank's load is
``preflight.models.moe.busiest_rank_load``. This module changes one training field at a time on a copy of
the profile and reads those functions, so a table row and the chapters' verdicts say the same thing.

**The all-to-all in one paragraph.** Each MoE layer sends every token's hidden state (``h`` values) to the
GPUs of its ``k`` experts and back: dispatch and combine forward, the same two backward (again forward with
full recompute). With ``ep`` expert-parallel GPUs in ``d`` NVLink domains a copy leaves the domain with
probability ``(d-1)/d``: ``k (d-1)/d`` network copies per token. Node-limited routing (DeepSeek-V3: at most
4 nodes per token) sends a token once per remote domain and forwards it there over NVLink: ``min(k, M, d)
(d-1)/d`` copies. DeepSeek-V3's 64-way EP over 8 nodes, top-8: 8 x 7/8 = 7 copies, 4 x 7/8 = 3.5 with M = 4.
fp8 dispatch halves the forward dispatch's bytes (1 + 4/128 B per value, not 2); overlap hides the rest
behind another micro-batch's compute.

**The busiest rank.** Routing balanced on average still leaves a binomial spread: the busiest of ``ep``
ranks receives ``1 + sqrt(2 ln ep) / sqrt(tokens x k)`` times the mean, and every rank waits for it. It
shrinks as 1/sqrt of the tokens per rank; a capacity factor caps the wait and drops the excess.
"""
from __future__ import annotations

import math

import pandas as pd

from preflight import REPO
from preflight.chapters import step as S
from preflight.core.profile import Profile, load_profile
from preflight.models import moe
from preflight.models import throughput as T
from preflight.models.activations import recomputed
from preflight.models.comm import gbps_to_GBps

EXAMPLE_MOE = REPO / "data" / "profiles" / "moe" / "deepseek-v3.yaml"
DEEPSEEK_NODE_LIMIT = 4            # DeepSeek-V3 sec. 2.1.2: each token's experts on at most 4 nodes
PROFILE = "profile"                # an argument left at the profile's own value
NODE_LIMIT_MAX = 100_000           # the profile's accepted range (training.moe_node_limit)
CAPACITY_RANGE = (1.0, 100.0)      # the profile's accepted range (training.moe_capacity_factor)
CAPACITY_FACTORS = (None, 1.1, 1.25, 1.5)
TOKEN_SCALES = (1 / 256, 1 / 64, 1 / 16, 1 / 4, 1)


def moe_profile(profile: Profile) -> tuple[Profile, str]:
    """The profile itself when it has experts on more than one expert-parallel GPU, else the DeepSeek-V3 profile
    of ``data/profiles/moe/``; and a sentence saying which (a dense plan has no all-to-all to show)."""
    if profile.model.expert_spec is not None and profile.training.ep > 1:
        return profile, f"your plan ({profile.project})"
    why = ("your plan has no experts (model.experts: 0)" if profile.model.expert_spec is None else
           "your plan keeps every expert on each GPU (training.ep: 1)")
    return load_profile(EXAMPLE_MOE), f"DeepSeek-V3's pre-training (data/profiles/moe/deepseek-v3.yaml; {why})"


def valid_eps(profile: Profile) -> list[int]:
    """Expert-parallel sizes the profile's layout admits: ``ep`` divides the routed experts and ``ep x etp``
    the ``tp x dp x cp`` ranks of a stage (the profile's own rule, Megatron's MoE parallel folding)."""
    e, t = profile.model.expert_spec, profile.training
    if e is None:
        return [1]
    ranks, etp = t.tp * profile.dp * t.cp, t.etp or t.tp
    return [n for n in range(1, e.experts + 1) if e.experts % n == 0 and ranks % (n * etp) == 0]


def _check_ep(profile: Profile, ep: int) -> None:
    ok = valid_eps(profile)
    if not isinstance(ep, int) or isinstance(ep, bool) or ep not in ok:
        raise ValueError(f"training.ep = {ep!r}: accepted for this plan {', '.join(map(str, ok))} (divides "
                         f"model.experts = {profile.model.experts} and, times etp, the tp x dp x cp ranks of a stage)")


def _check_node_limit(node_limit) -> None:
    if node_limit is not None and (not isinstance(node_limit, int) or isinstance(node_limit, bool)
                                   or not 1 <= node_limit <= NODE_LIMIT_MAX):
        raise ValueError(f"training.moe_node_limit = {node_limit!r}: accepted None (no limit) or an integer from 1 "
                         f"to {NODE_LIMIT_MAX:,}")


def _with(profile: Profile, **training) -> Profile:
    """A copy of the profile with training fields changed (validated by the callers)."""
    return profile.model_copy(update={"training": profile.training.model_copy(update=training)})


def _ep_per_domain(profile: Profile, ep: int) -> int:
    """Expert-parallel GPUs inside one NVLink domain (``throughput.step_time``'s: the domain's GPUs over etp)."""
    c, t = profile.cluster, profile.training
    return max(1, min(ep, (c.nvlink_domain or c.gpus_per_node) // (t.etp or t.tp)))


def domains(profile: Profile, ep: int) -> int:
    """NVLink domains ``ep`` expert-parallel GPUs span, ``d = ep / (GPUs of ep in one domain)``."""
    return max(1, ep // _ep_per_domain(profile, ep))


def _layer(profile: Profile) -> moe.A2A:
    """``moe.a2a_layer`` with the inputs the step model gives it for this profile (``throughput.step_time``):
    one GPU's tokens of a micro-batch, the domain's expert-parallel GPUs, the GPU's share of the NICs."""
    m, t, c = profile.model, profile.training, profile.cluster
    e = m.expert_spec
    return moe.a2a_layer(t.micro_batch_size * m.seq_len // t.cp, m.hidden, e.top_k, t.ep,
                         ep_per_domain=_ep_per_domain(profile, t.ep),
                         nic_GBps=gbps_to_GBps(c.inter_node_Gbps) * min(1.0, profile.nics_per_node / c.gpus_per_node),
                         nvlink_GBps=c.intra_node_GBps, nic_latency_s=T.NIC_LATENCY_S,
                         nvlink_latency_s=T.NVLINK_LATENCY_S, fp8_dispatch=t.moe_dispatch_fp8,
                         node_limit=t.moe_node_limit,
                         full_recompute="moe" in recomputed(t.activation_recompute, t.recompute_modules))


def a2a_row(profile: Profile, *, ep: int | str = PROFILE, node_limit: int | None | str = PROFILE,
            fp8_dispatch: bool | str = PROFILE, overlap: bool | str = PROFILE, gpu_key: str | None = None) -> dict:
    """One configuration's all-to-alls: per MoE layer and micro-batch on one GPU (copies of a token, bytes
    across the network and inside the NVLink domain, seconds), and per step from the step model (all of
    them, what compute leaves exposed, the step). Each argument left at ``PROFILE`` keeps the profile's
    value. ValueError for a dense profile or a value outside the accepted range."""
    if profile.model.expert_spec is None:
        raise ValueError("model.experts = 0: a dense model has no all-to-all (moe_profile gives an MoE example)")
    t = profile.training
    ep = t.ep if ep == PROFILE else ep
    node_limit = t.moe_node_limit if node_limit == PROFILE else node_limit
    fp8_dispatch = t.moe_dispatch_fp8 if fp8_dispatch == PROFILE else fp8_dispatch
    overlap = t.moe_a2a_overlap if overlap == PROFILE else overlap
    _check_ep(profile, ep)
    _check_node_limit(node_limit)
    for name, v in (("moe_dispatch_fp8", fp8_dispatch), ("moe_a2a_overlap", overlap)):
        if not isinstance(v, bool):
            raise ValueError(f"training.{name} = {v!r}: accepted true or false")
    q = _with(profile, ep=ep, moe_node_limit=node_limit, moe_dispatch_fp8=fp8_dispatch, moe_a2a_overlap=overlap)
    x = _layer(q)
    ep_per_domain = _ep_per_domain(q, ep)
    ps = S.plan_step(q, gpu_key)
    row = {"ep": ep, "domains": domains(q, ep), "gpus_per_domain": ep_per_domain,
           "node_limit": node_limit, "routing": "every node" if node_limit is None else f"at most {node_limit} nodes",
           "fp8_dispatch": fp8_dispatch, "overlap": overlap,
           "a2a_per_layer": x.count, "network_copies": x.network_copies, "nvlink_copies": x.nvlink_copies,
           "network_MB": x.inter_bytes / 1e6, "nvlink_MB": x.intra_bytes / 1e6, "layer_ms": x.seconds * 1e3,
           "a2a_all_s": None, "a2a_exposed_s": None, "compute_s": None, "step_s": None, "exposed_share": None}
    if ps is not None:
        row.update(a2a_all_s=ps.terms["a2a_comm_s"], a2a_exposed_s=ps.terms["a2a_s"], compute_s=ps.terms["compute_s"],
                   step_s=ps.step_s, exposed_share=ps.terms["a2a_s"] / ps.step_s)
    return row


def a2a_table(profile: Profile, eps=None, node_limits=(PROFILE,), fp8_dispatch=(PROFILE,), overlap=(PROFILE,),
              gpu_key: str | None = None) -> pd.DataFrame:
    """:func:`a2a_row` over every combination (``eps`` None: every ep the layout admits above 1)."""
    eps = [n for n in valid_eps(profile) if n > 1] if eps is None else list(eps)
    return pd.DataFrame([a2a_row(profile, ep=n, node_limit=lim, fp8_dispatch=f, overlap=o, gpu_key=gpu_key)
                         for n in eps for lim in node_limits for f in fp8_dispatch for o in overlap])


def ladder_limit(profile: Profile) -> int:
    """The node limit the ladder shows: the profile's, else DeepSeek-V3's 4."""
    return profile.training.moe_node_limit or DEEPSEEK_NODE_LIMIT


def a2a_ladder(profile: Profile, gpu_key: str | None = None) -> pd.DataFrame:
    """DeepSeek-V3's three levers added one at a time at the profile's ep: bf16 and no limit, then
    node-limited routing, then fp8 dispatch, then overlap. Each row says what it changed."""
    lim = ladder_limit(profile)
    steps = [("bf16 dispatch, every node, blocking", dict(node_limit=None, fp8_dispatch=False, overlap=False)),
             (f"+ node-limited routing (at most {lim} nodes per token)", dict(node_limit=lim, fp8_dispatch=False,
                                                                             overlap=False)),
             ("+ fp8 dispatch (combine and backward stay bf16)", dict(node_limit=lim, fp8_dispatch=True, overlap=False)),
             ("+ overlap with another micro-batch's compute", dict(node_limit=lim, fp8_dispatch=True, overlap=True))]
    return pd.DataFrame([{"lever": words, **a2a_row(profile, gpu_key=gpu_key, **kw)} for words, kw in steps])


# -- the busiest expert-parallel rank (chapter 4) ---------------------------------------------------------------

def tokens_per_rank(profile: Profile) -> float:
    """Tokens one expert-parallel rank routes per layer and micro-batch, ``b s / cp`` (the
    ``load_balance/busiest_expert`` finding's)."""
    return profile.training.micro_batch_size * profile.model.seq_len / profile.training.cp


def busiest_row(tokens: float, ep: int, top_k: int, capacity_factor: float | None = None) -> dict:
    """``moe.busiest_rank_load`` with its inputs checked: ``tokens`` per rank (> 0), ``ep`` ranks, ``top_k``
    copies per token, ``capacity_factor`` None (dropless) or in the profile's range 1-100."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not math.isfinite(tokens) or tokens <= 0:
        raise ValueError(f"tokens per rank = {tokens!r}: accepted a finite number above 0 (b s / cp)")
    for name, v in (("training.ep", ep), ("model.top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= NODE_LIMIT_MAX:
            raise ValueError(f"{name} = {v!r}: accepted an integer from 1 to {NODE_LIMIT_MAX:,}")
    lo, hi = CAPACITY_RANGE
    if capacity_factor is not None and (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float))
                                        or not lo <= capacity_factor <= hi):
        raise ValueError(f"training.moe_capacity_factor = {capacity_factor!r}: accepted None (dropless) or "
                         f"{lo:g} to {hi:g}")
    b = moe.busiest_rank_load(tokens, ep, top_k, capacity_factor)
    return {"tokens_per_rank": tokens, "ep": ep, "top_k": top_k, "capacity_factor": capacity_factor, **b}


def busiest_table(profile: Profile, scales=TOKEN_SCALES, capacity_factors=CAPACITY_FACTORS) -> pd.DataFrame:
    """The busiest rank at the profile's ep and top-k, over tokens per rank (``scales`` of the profile's) and
    capacity factors. ValueError for a dense profile."""
    e = profile.model.expert_spec
    if e is None:
        raise ValueError("model.experts = 0: a dense model has no experts to balance (moe_profile gives an example)")
    base = tokens_per_rank(profile)
    return pd.DataFrame([busiest_row(base * s, profile.training.ep, e.top_k, c)
                         for s in scales for c in capacity_factors])


def busiest_wide(profile: Profile, scales=TOKEN_SCALES, capacity_factors=CAPACITY_FACTORS) -> pd.DataFrame:
    """One row per tokens-per-rank (``scales`` of the profile's): the mean copies a rank receives, the busiest
    rank's load (what a dropless layer waits for), and the share it drops under each capacity factor."""
    long = busiest_table(profile, scales, [None] + [c for c in capacity_factors if c is not None])
    rows = []
    for tokens, g in long.groupby("tokens_per_rank", sort=True):
        free = g[g["capacity_factor"].isna()].iloc[0]
        row = {"tokens per rank": tokens, "mean copies per rank": free["mean_tokens"],
               "busiest / mean (dropless wait)": free["load"]}
        row.update({f"dropped at capacity {r.capacity_factor:g}": r.dropped
                    for r in g[g["capacity_factor"].notna()].itertuples()})
        rows.append(row)
    return pd.DataFrame(rows)


def tokens_for_load(load: float, ep: int, top_k: int) -> float:
    """The fewest tokens per rank whose busiest rank carries at most ``load`` times the mean (bisection over
    ``busiest_rank_load``, which falls as the tokens grow): where a capacity factor ``load`` stops dropping."""
    if not isinstance(load, (int, float)) or not 1.0 < load <= CAPACITY_RANGE[1]:
        raise ValueError(f"load = {load!r}: accepted above 1 and at most {CAPACITY_RANGE[1]:g}")
    busiest_row(1.0, ep, top_k)                                   # checks ep and top_k
    if ep < 2:
        raise ValueError(f"training.ep = {ep}: one rank has no busiest rank; accepted 2 or more")
    lo, hi = 1e-9, 1e15
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if moe.busiest_rank_load(mid, ep, top_k)["load"] <= load:
            hi = mid
        else:
            lo = mid
    return hi
