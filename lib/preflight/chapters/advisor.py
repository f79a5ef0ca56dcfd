"""The layout advisor (``python -m preflight advise PROFILE``): which plan would pass, and which is fastest.

It searches with the chapters' own models, so it is only as good as they are:

* **enumerate** every layout the profile's cluster allows: tp dividing the GPUs per node, the heads
  and the key/value heads; pp dividing the layers; dp = GPUs / (tp pp); the framework's ZeRO stages
  (``preflight.models.states.STAGES``); recompute none / selective / full; sequence parallelism with
  tp > 1; micro-batch sizes 1, 2, 4, 8 and the micro-batches per step that keep the global batch
  (``--global-batch``, else the profile's ``micro_batch_size x microbatches x dp`` sequences);
  interleaving v = 2, 4 with pp > 1 where v pp divides the layers and pp divides m;
* **keep** those whose memory per GPU (``preflight.models.memory``, the chapter's planner) passes the
  chapter's verdict: plan / GPU memory <= ``memory_plan.FIT_WARN`` (90 %);
* **rank** them by predicted tokens/s per GPU (``preflight.models.throughput.step_time``: compute at
  the efficiency, bubble, exposed tp / pp / dp communication, recompute's extra forward), MFU with it.

The efficiency is ``--efficiency`` if given, or ``--mfu-from AUDIT`` (chapter 1's measured MFU in an
audit's findings.json, the reference model's or the team's own workload's: ``measured_efficiency``),
else ``throughput.DEFAULT_EFFICIENCY`` (the source is stated in every output). When no layout fits, ``advise``
says by how much the closest one misses and what would close it (``no_fit``).
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from preflight.chapters import memory_plan as MP
from preflight.chapters.load_balance import BUBBLE_FAIL, BUBBLE_WARN
from preflight.core import hardware
from preflight.core.findings import judge
from preflight.core.numfmt import factor, percent
from preflight.core.profile import Profile
from preflight.models import EFFICIENCY_RANGE
from preflight.models import memory as M
from preflight.models import throughput as T
from preflight.models.pipeline import bubble_fraction
from preflight.models.states import STAGES

MICRO_BATCH_SIZES = (1, 2, 4, 8)
INTERLEAVES = (2, 4)
RECOMPUTE = ("none", "selective", "full")
GLOBAL_BATCH_MAX = 10_000_000
TOP_MAX = 1000


def global_batch(profile: Profile) -> int:
    """Sequences per optimizer step that the profile implies: micro_batch_size x microbatches x dp."""
    t = profile.training
    return t.micro_batch_size * t.microbatches * profile.dp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(profile: Profile, batch: int):
    """Every ``throughput.Layout`` the cluster and the model allow for a global batch of ``batch``."""
    m, c, t = profile.model, profile.cluster, profile.training
    gpus = profile.gpus
    tps = [x for x in _divisors(c.gpus_per_node) if m.n_heads % x == 0 and m.n_kv_heads % x == 0]
    for tp, pp in itertools.product(tps, _divisors(m.layers)):
        if gpus % (tp * pp):
            continue
        dp = gpus // (tp * pp)
        for mbs in MICRO_BATCH_SIZES:
            if batch % (dp * mbs):
                continue
            mb = batch // (dp * mbs)
            vs = [1] + [v for v in INTERLEAVES if pp > 1 and m.layers % (pp * v) == 0 and mb % pp == 0]
            for z, rc, sp, v in itertools.product(STAGES[t.framework], RECOMPUTE, (False, True), vs):
                if sp and tp == 1:
                    continue
                yield T.Layout(tp=tp, pp=pp, dp=dp, zero_stage=z, activation_recompute=rc, sequence_parallel=sp,
                               micro_batch_size=mbs, microbatches=mb, interleave=v)


def _cluster(profile: Profile, gpu_key: str | None) -> T.Cluster:
    peak = hardware.peak_tflops(gpu_key, "bf16")
    if peak is None:
        raise ValueError(f"cluster.gpu = {profile.cluster.gpu!r}: no known bf16 peak, so no compute time; "
                         "name a GPU of `python -m preflight chips`")
    c = profile.cluster
    return T.Cluster(peak_tflops=peak, gpus_per_node=c.gpus_per_node, intra_node_GBps=c.intra_node_GBps,
                     inter_node_Gbps=c.inter_node_Gbps, nics_per_node=profile.nics_per_node)


def memory_plan(profile: Profile, lay: T.Layout) -> M.Plan:
    """The chapter's planner input for ``lay`` (``memory_plan.plan_of`` with the layout's fields)."""
    return MP.plan_of(profile, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage,
                      recompute=lay.activation_recompute, sequence_parallel=lay.sequence_parallel,
                      micro_batch_size=lay.micro_batch_size, microbatches=lay.microbatches,
                      schedule=("interleaved" if lay.interleave > 1 else "1f1b"), interleave=lay.interleave)


def _step(profile: Profile, lay: T.Layout, cluster: T.Cluster, efficiency: float) -> dict:
    return T.step_time(lay, params=profile.model.params, layers=profile.model.layers, hidden=profile.model.hidden,
                       seq_len=profile.model.seq_len, cluster=cluster, efficiency=efficiency,
                       grad_dtype=profile.training.grad_dtype, serial_s=profile.training.step_serial_s).as_dict()


def evaluate(profile: Profile, lay: T.Layout, capacity: float, cluster: T.Cluster, efficiency: float) -> dict:
    """One candidate: the layout, its memory and step time, and its verdicts (memory, bubble)."""
    mem = M.total_bytes(memory_plan(profile, lay))
    ratio = mem / capacity
    mem_v, _ = judge(ratio, warn=MP.FIT_WARN, fail=MP.FIT_FAIL, higher_is_better=False)
    bub = bubble_fraction(lay.pp, lay.microbatches, lay.interleave)
    bub_v, _ = judge(bub, warn=BUBBLE_WARN, fail=BUBBLE_FAIL, higher_is_better=False)
    return {**dict(lay.__dict__), "memory_per_gpu_bytes": mem, "memory_ratio": ratio, "fits": ratio <= MP.FIT_WARN,
            **_step(profile, lay, cluster, efficiency), "bubble_fraction": bub,
            "verdicts": {"baseline/memory_fits": mem_v, "load_balance/bubble_fraction": bub_v}}


def at_efficiency(profile: Profile, result: dict, efficiency: float, gpu_key: str | None = None) -> list[dict]:
    """``result``'s fitting candidates (from :func:`advise`) re-timed and re-ranked at another efficiency:
    memory does not depend on it, the ranking can (a faster kernel leaves less compute to hide the
    communication behind). For the chapter's slider; the same step model as ``advise``."""
    cluster = _cluster(profile, _gpu_key(profile, gpu_key))          # once, not per candidate
    return sorted((_retimed(profile, c, cluster, efficiency) for c in result["candidates"] if c["fits"]),
                  key=_rank_key)


def retime(profile: Profile, c: dict, efficiency: float, gpu_key: str | None = None) -> dict:
    """Candidate ``c`` with its step re-timed at ``efficiency`` (its memory and verdicts unchanged)."""
    return _retimed(profile, c, _cluster(profile, _gpu_key(profile, gpu_key)), efficiency)


def _retimed(profile: Profile, c: dict, cluster: T.Cluster, efficiency: float) -> dict:
    return c | _step(profile, T.Layout(**{k: c[k] for k in T.Layout.__dataclass_fields__}), cluster, efficiency)


def _gpu_key(profile: Profile, gpu_key: str | None) -> str | None:
    """The GPU to plan for: ``gpu_key`` (the probed one under ``gpu: auto``), else the profile's."""
    return gpu_key or (None if profile.cluster.gpu == "auto" else profile.cluster.gpu)


def usable_efficiency(value: float) -> bool:
    """Whether a measured MFU can stand for the kernels' efficiency (``models.EFFICIENCY_RANGE``)."""
    return EFFICIENCY_RANGE[0] <= value <= EFFICIENCY_RANGE[1]


def efficiency_gap(implied: float | None, efficiency: float, tolerance: float = 0.05) -> str | None:
    """A line when the profile's own step time implies another share of the peak (``implied``: the
    finding ``baseline/implied_mfu``) than the advisor ranks at (``efficiency``), more than ``tolerance``
    apart; else None. The advisor's compute times scale as 1 / efficiency: ranked at a higher efficiency
    than the step shows they are too short by efficiency / implied, at a lower one too long."""
    if not implied or abs(implied - efficiency) <= tolerance:
        return None
    way, k = ("short", efficiency / implied) if efficiency > implied else ("long", implied / efficiency)
    return (f"The profile's own step time implies {percent(implied)} of the peak while computing "
            f"(baseline/implied_mfu), not {percent(efficiency)}: the advisor's compute times are then "
            f"{factor(k)} too {way}. To rank at your step's efficiency: "
            f"python -m preflight advise PROFILE --efficiency {implied:.2f}")


def measured_efficiency(audit: str | Path, profile: Profile | None = None) -> tuple[float, str]:
    """Chapter 1's measured MFU (``baseline/mfu``) from an audit's findings.json (or its folder), with
    where it comes from. ValueError, naming ``--mfu-from``, when there is none: a plan-only audit, a CPU
    (no datasheet peak, so MFU is left empty), a finding outside 1-100 %. A GPU other than the profile's
    is said in the source, not refused: the ratio often carries over between chips of one generation."""
    path = Path(audit)
    path = path / "findings.json" if path.is_dir() else path
    try:
        summary = json.loads(path.read_text())
        found = {f["id"]: f for f in summary["findings"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--mfu-from = {str(audit)!r}: not an audit's findings.json ({type(err).__name__}: "
                         f"{err})") from None
    f = found.get("baseline/mfu")
    t = found.get("baseline/trace_mfu")
    if (f is None or f.get("value") is None) and t is not None and t.get("value") is not None:
        return _trace_efficiency(audit, path, summary, t)
    if f is None or f.get("value") is None:
        why = f["message"] if f else "no baseline/mfu finding (chapter 1 did not run)"
        why += f"; baseline/trace_mfu: {t['message']}" if t else ""
        raise ValueError(f"--mfu-from = {str(audit)!r}: no MFU from chapter 1 there ({why}); MFU needs a "
                         "measure-mode audit on a GPU with a datasheet peak (or pass --efficiency)")
    value = float(f["value"])
    if not usable_efficiency(value):
        raise ValueError(f"--mfu-from = {str(audit)!r}: baseline/mfu = {value:g}, outside the accepted "
                         f"{EFFICIENCY_RANGE[0]:g}-{EFFICIENCY_RANGE[1]:g} of the peak")
    machine = summary.get("machine") or {}
    on = machine.get("label") or machine.get("name") or "an unnamed device"
    w = summary.get("workload")
    what = f"workload {w['class']}" if isinstance(w, dict) and w.get("class") else "the reference model"
    other = (profile is not None and machine.get("table_key") and profile.cluster.gpu not in ("auto", machine["table_key"]))
    return value, (f"chapter 1's measured MFU of {what} on {on} ({path}, {str(summary.get('date', ''))[:10]})"
                   + (f"; measured on {machine['table_key']}, planned for {profile.cluster.gpu}" if other else ""))


def _trace_efficiency(audit, path: Path, summary: dict, f: dict) -> tuple[float, str]:
    """The MFU a job's traces show (``baseline/trace_mfu``), from ``traces --json`` or ``audit --traces``:
    the median over the ranks (the finding's value is the worst rank's, the one a verdict judges)."""
    import statistics

    per = [v for v in (f.get("per_rank") or {}).values() if v is not None] or [float(f["value"])]
    value = statistics.median(per)
    if not usable_efficiency(value):
        raise ValueError(f"--mfu-from = {str(audit)!r}: baseline/trace_mfu = {value:g} (median of {len(per)} ranks), "
                         f"outside the accepted {EFFICIENCY_RANGE[0]:g}-{EFFICIENCY_RANGE[1]:g} of the peak")
    folder = (summary.get("traces") or {}).get("folder") or summary.get("folder") or path
    return value, (f"the MFU your job's traces show, the median of {len(per)} rank(s) ({folder}; "
                   f"{f['message'].split(',')[0]} on the worst rank)")


def advise(profile: Profile, *, batch: int | None = None, efficiency: float | None = None,
           gpu_key: str | None = None, capacity: float | None = None, efficiency_source: str | None = None) -> dict:
    """Every candidate layout, best first (fitting ones by tokens/s per GPU, then the rest by memory).

    Returns {"candidates", "fitting", "global_batch", "efficiency", "efficiency_source", "capacity",
    "no_fit"}; ``no_fit`` is None when a layout fits (else ``no_fit``'s advice). ``gpu_key`` and
    ``capacity`` default to the profile's GPU (the hardware table, or ``cluster.gpu_memory_GB``).
    ValueError when the global batch fits no layout or the GPU has no known peak."""
    batch = global_batch(profile) if batch is None else batch
    gpu_key = _gpu_key(profile, gpu_key)
    if capacity is None:
        capacity, _ = MP.capacity_bytes(profile)
    if capacity is None:
        raise ValueError("cluster.gpu = 'auto': name the GPU (or set cluster.gpu_memory_GB) to plan its memory")
    source = efficiency_source or "--efficiency" if efficiency is not None else (
        "the stated default; measure yours: chapter 1's MFU on a GPU, then advise --mfu-from")
    efficiency = T.DEFAULT_EFFICIENCY if efficiency is None else efficiency
    cluster = _cluster(profile, gpu_key)
    cands = [evaluate(profile, lay, capacity, cluster, efficiency) for lay in layouts(profile, batch)]
    if not cands:
        raise ValueError(f"global batch (--global-batch, or the profile's micro_batch_size x microbatches x dp) = {batch} "
                         f"sequences: no layout divides it (dp x micro-batch size must "
                         f"divide it, dp = {profile.gpus} GPUs / (tp pp)); choose a multiple of the data-parallel "
                         "sizes, e.g. a multiple of " + str(profile.gpus))
    fitting = sorted((c for c in cands if c["fits"]), key=_rank_key)
    rest = sorted((c for c in cands if not c["fits"]), key=lambda c: c["memory_ratio"])
    return {"candidates": fitting + rest, "fitting": len(fitting), "global_batch": batch, "efficiency": efficiency,
            "efficiency_source": source, "capacity": capacity,
            "no_fit": None if fitting else no_fit(profile, rest[0], capacity, batch)}


def _rank_key(c: dict) -> tuple:
    """Fastest first; among equally fast layouts (to 4 digits) the simpler one: lower ZeRO stage, less
    recompute, no sequence parallelism, no interleaving, then the one with more memory left."""
    return (-float(f"{c['tokens_per_s_per_gpu']:.4g}"), c["zero_stage"], RECOMPUTE.index(c["activation_recompute"]),
            c["sequence_parallel"], c["interleave"], c["memory_ratio"])


def no_fit(profile: Profile, closest: dict, capacity: float, batch: int) -> dict:
    """Why nothing fits, and what would: the closest layout's shortfall (bytes over 90 % of the GPU), the
    smallest GPU of the hardware table that would hold it, and the fewest nodes (doubling) with a fit."""
    need = closest["memory_per_gpu_bytes"] / MP.FIT_WARN
    chips = sorted((c for c in hardware.CHIPS.values() if c.memory_GB * MP.GiB >= need), key=lambda c: c.memory_GB)
    nodes = None
    for k in (2, 4, 8, 16):
        bigger = profile.model_copy(update={"cluster": profile.cluster.model_copy(
            update={"nodes": profile.cluster.nodes * k})})
        big_batch = batch * k if batch % global_batch(profile) == 0 else batch
        if any(M.total_bytes(memory_plan(bigger, lay)) / capacity <= MP.FIT_WARN
               for lay in layouts(bigger, big_batch)):
            nodes = profile.cluster.nodes * k
            break
    return {"closest": closest, "shortfall_bytes": closest["memory_per_gpu_bytes"] - MP.FIT_WARN * capacity,
            "larger_gpu": chips[0].name if chips else None, "nodes_that_fit": nodes,
            "uses_full_recompute": closest["activation_recompute"] == "full"}


def profile_with(profile: Profile, lay: dict, step_compute_s: float | None = None) -> dict:
    """The profile as a plain dict with its ``training`` layout replaced by ``lay`` (an ``advise``
    candidate); ``step_compute_s`` the predicted compute of that layout. Validated by the caller."""
    d = profile.model_dump()
    t = d["training"]
    t.update(tp=lay["tp"], pp=lay["pp"], zero_stage=lay["zero_stage"], activation_recompute=lay["activation_recompute"],
             sequence_parallel=lay["sequence_parallel"], micro_batch_size=lay["micro_batch_size"],
             microbatches=lay["microbatches"], interleave=lay["interleave"],
             pipeline_schedule="interleaved" if lay["interleave"] > 1 else "1f1b")
    if step_compute_s is not None:
        t["step_compute_s"] = float(f"{step_compute_s:.4g}")
    return d


def write_profile(profile: Profile, lay: dict, out: Path) -> Path:
    """Write the profile with ``lay`` as its plan (validated first: nothing is written if it fails)."""
    import yaml

    from preflight.core.fsutil import atomic_write_text
    from preflight.core.profile import parse_profile

    d = profile_with(profile, lay, lay["compute_s"])
    parse_profile(d, str(out))
    header = (f"# Written by `preflight advise`: the top layout (tp={lay['tp']}, pp={lay['pp']}, dp={lay['dp']}), "
              f"predicted {lay['tokens_per_s_per_gpu']:.4g} tokens/s per GPU, MFU {lay['mfu']:.1%}.\n")
    atomic_write_text(out, header + yaml.safe_dump(d, sort_keys=False))
    return out


def label(c: dict) -> str:
    """One layout in one line: ``tp=2 pp=1 dp=512 ZeRO-1 rc=selective sp mbs=1 m=1``."""
    return (f"tp={c['tp']} pp={c['pp']} dp={c['dp']} ZeRO-{c['zero_stage']} rc={c['activation_recompute']}"
            + (" sp" if c["sequence_parallel"] else "") + f" mbs={c['micro_batch_size']} m={c['microbatches']}"
            + (f" v={c['interleave']}" if c["interleave"] > 1 else ""))


def own_plan(profile: Profile, candidates: list[dict]) -> dict | None:
    """The candidate that is the profile's own plan (None if the enumeration does not hold it)."""
    t = profile.training
    mine = (t.tp, t.pp, t.zero_stage, t.activation_recompute, t.sequence_parallel, t.micro_batch_size,
            t.interleave if t.pipeline_schedule == "interleaved" else 1)
    return next((x for x in candidates if (x["tp"], x["pp"], x["zero_stage"], x["activation_recompute"],
                                           x["sequence_parallel"], x["micro_batch_size"], x["interleave"]) == mine), None)


def table(profile: Profile, candidates: list[dict], top: int = 5):
    """The ``top`` layouts, best first, and the profile's own plan (marked) with their deciding numbers,
    as a DataFrame: rank, layout, memory per GPU (and share of the GPU), bubble, exposed communication,
    step, tokens/s per GPU, MFU."""
    import pandas as pd

    from preflight.core.numfmt import gib

    mine = own_plan(profile, candidates)
    shown = candidates[:top] + ([mine] if mine is not None and mine not in candidates[:top] else [])
    return pd.DataFrame([{
        "rank": f"{candidates.index(c) + 1:,}" if c["fits"] else "— (does not fit)",
        "layout": label(c) + ("  (the profile's plan)" if c is mine else ""),
        "memory per GPU": f"{gib(c['memory_per_gpu_bytes'])} ({c['memory_ratio']:.0%})" + ("" if c["fits"] else ", does not fit"),
        "bubble": f"{c['bubble_fraction']:.1%}",
        "exposed comm (s)": f"{c['tp_comm_s'] + c['pp_comm_s'] + c['dp_exposed_s']:.3g}",
        "step (s)": f"{c['step_s']:.3g}",
        "tokens/s per GPU": f"{c['tokens_per_s_per_gpu']:,.0f}",
        "MFU": f"{c['mfu']:.1%}"} for c in shown])


def _row(c: dict) -> str:
    from preflight.core.numfmt import gib

    lay = label(c)
    return (f"{lay:<58} {gib(c['memory_per_gpu_bytes']):>10} {c['memory_ratio']:>5.0%} {c['bubble_fraction']:>6.1%} "
            f"{c['tp_comm_s'] + c['pp_comm_s'] + c['dp_exposed_s']:>8.3g} {c['step_s']:>8.3g} "
            f"{c['tokens_per_s_per_gpu']:>9.4g} {c['mfu']:>5.1%}")


def text_report(profile: Profile, result: dict, top: int) -> str:
    """The ranking for people: one line per layout with its deciding numbers."""
    from preflight.core.numfmt import gib

    c = result["candidates"]
    lines = [f"{profile.project}: {profile.gpus} GPUs, global batch {result['global_batch']} sequences of "
             f"{profile.model.seq_len} tokens; efficiency {result['efficiency']:.0%} ({result['efficiency_source']})",
             f"{len(c)} layouts, {result['fitting']} fit (memory <= {MP.FIT_WARN:.0%} of {gib(result['capacity'])})",
             f"{'layout':<58} {'memory':>10} {'ratio':>5} {'bubble':>6} {'comm s':>8} {'step s':>8} "
             f"{'tok/s/GPU':>9} {'MFU':>5}"]
    if result["no_fit"]:
        nf = result["no_fit"]
        lines.append("NO LAYOUT FITS. Closest:")
        lines.append(_row(nf["closest"]))
        fixes = [f"a GPU with more memory ({nf['larger_gpu']})" if nf["larger_gpu"] else None,
                 f"{nf['nodes_that_fit']} nodes instead of {profile.cluster.nodes}" if nf["nodes_that_fit"] else None]
        lines.append(f"short by {gib(nf['shortfall_bytes'])} per GPU"
                     + ("" if nf["uses_full_recompute"] else " (full recompute does not close it)")
                     + "; would close it: " + (", or ".join(x for x in fixes if x) or
                                               "nothing in the hardware table, up to 16x the nodes"))
        return "\n".join(lines) + "\n"
    lines += [_row(x) for x in c[:min(top, result["fitting"])]]
    mine = own_plan(profile, c)
    if mine is not None:
        rank = c.index(mine) + 1
        lines.append(f"the profile's own plan: rank {rank} of {len(c)}"
                     + ("" if mine["fits"] else " (does not fit)") + ":")
        lines.append(_row(mine))
    return "\n".join(lines) + "\n"

