"""Chapter 5, fault tolerance: the failure math and checkpoint interval of the profile's plan
(``preflight.models.resilience``), and the measured resume, checkpoint stall and elastic recovery,
as findings.

Every plan finding is computed twice: under the profile's per-node rate (``cluster.node_failure_per_day``),
which decides the verdict, and under the rate Llama 3 reported (``R.LLAMA3_P_NODE_DAY``, 3.8e-3 per
node-day, 38x the field report's 1e-4), which the message shows beside it: a plan that passes only at
the optimistic rate is a plan to re-check with the site's measured one. Young's and Daly's formulas
assume exponential (memoryless) failures.
"""
from __future__ import annotations

import math

import pandas as pd

from preflight.chapters import step as S
from preflight.core.findings import FindingSink, judge
from preflight.core.numfmt import duration, factor, num, pct, percent, plural, sci, seconds
from preflight.core.profile import Profile
from preflight.models import resilience as R

PROFILE_SOURCE = "computed from profile"

# Thresholds (one home).
# Waste: the share of the run lost to checkpoint writes, recomputation and restarts. Under 5 % is what
# a tuned large run achieves; over 15 % is a week of a 30-day run.
WASTE_WARN, WASTE_FAIL = 0.05, 0.15
# The plan's interval against the optimum: extra waste in percentage points of the run.
EXTRA_WARN, EXTRA_FAIL = 0.01, 0.05
# Interval / walltime: > 0.5 fewer than two checkpoints per allocation; > 1 a job can end before its
# first checkpoint, so unless the walltime signal triggers a save, no work survives the allocation.
WALLTIME_WARN, WALLTIME_FAIL = 0.5, 1.0
# Async checkpointing: the stall should be a small fraction of the synchronous one.
STALL_WARN, STALL_FAIL = 0.5, 1.0


def checkpoint_cost(profile: Profile) -> tuple[float, str]:
    """C, seconds the training stalls for one checkpoint, and how it was obtained: with
    ``training.async_checkpoint`` the blocking part only (each GPU staging its share of the state to host
    memory, ``resilience.async_blocking_seconds``); else ``training.checkpoint_write_s`` when the profile gives
    it, else from the state's bytes over ``cluster.checkpoint_write_GBps``, else the field's default."""
    c, t = profile.cluster, profile.training
    if t.async_checkpoint:
        C = R.async_blocking_seconds(profile.model.params, t.framework, profile.gpus)
        return C, (f"asynchronous save: the blocking part, {R.CHECKPOINT_BYTES_PER_PARAM[t.framework]} B/param x "
                   f"{profile.model.params:.3g} params / {profile.gpus:,} GPUs staged to host memory at "
                   f"{R.HOST_STAGING_GBps:g} GB/s each (the write runs in the background)")
    if "checkpoint_write_s" in t.model_fields_set or c.checkpoint_write_GBps is None:
        return t.checkpoint_write_s, ("training.checkpoint_write_s" if "checkpoint_write_s" in t.model_fields_set
                                      else "training.checkpoint_write_s's default (set it, or the write bandwidth)")
    per = R.CHECKPOINT_BYTES_PER_PARAM[t.framework]
    C = R.checkpoint_seconds(profile.model.params, t.framework, c.checkpoint_write_GBps)
    return C, (f"{per} B/param ({t.framework}: 16-bit or fp32 weights and Adam's state, no gradients) x "
               f"{profile.model.params:.3g} params / {c.checkpoint_write_GBps:g} GB/s")


def plan(profile: Profile, p_node_day: float | None = None, gpu_key: str | None = None) -> dict:
    """The plan's failure and checkpoint numbers, in seconds and fractions, under the profile's daily
    per-node failure probability or under ``p_node_day`` (e.g. ``R.LLAMA3_P_NODE_DAY``)."""
    c, t = profile.cluster, profile.training
    C, C_how = checkpoint_cost(profile)
    p_node = c.node_failure_per_day if p_node_day is None else p_node_day
    mtbf_h = R.system_mtbf_h(p_node, c.nodes)
    m_s = mtbf_h * 3600
    young = R.young_interval(C, m_s)
    daly = R.daly_interval(C, m_s)
    # no failures (M infinite): the checkpoint exists for the walltime; free writes (C = 0): every step
    step_s, _ = S.step_seconds(profile, gpu_key)            # the one step model's (a checkpoint per step at most)
    daly = c.walltime_h * 3600 if math.isinf(m_s) else min(max(daly, step_s or 0.0), c.walltime_h * 3600)
    chosen = t.checkpoint_interval_s or daly
    # waiting in the queue after each allocation that ends at the walltime (failures pay it in R above)
    queue = R.queue_waste(c.queue_wait_s, t.run_days * 86400, c.walltime_h)
    return {"p_node_day": p_node, "p_day": R.failure_prob(p_node, c.nodes, 1.0),
            "p_run": R.failure_prob(p_node, c.nodes, t.run_days),
            "failures_run": R.run_failures(p_node, c.nodes, t.run_days),
            "mtbf_h": mtbf_h, "C": C, "C_how": C_how, "R": t.restart_s + c.queue_wait_s,
            "young_s": young, "daly_s": daly, "plan_s": t.checkpoint_interval_s, "interval_s": chosen,
            "waste_opt": R.daly_waste(daly, C, t.restart_s + c.queue_wait_s, m_s) + queue,
            "waste_plan": R.daly_waste(chosen, C, t.restart_s + c.queue_wait_s, m_s) + queue,
            "queue_waste": queue,
            "walltime_ratio": R.walltime_fit(chosen, c.walltime_h)}


def reference_table() -> pd.DataFrame:
    """``resilience.reference_points`` for people: the rates as the chart writes them, shares in %."""
    ref = R.reference_points()
    fmt = {"per-node daily failure probability": sci, "failures per day": num, "P(failure per day)": pct,
           "MTBF (h)": num, "nodes": lambda n: f"{n:,}"}
    return ref.assign(**{k: ref[k].map(f) for k, f in fmt.items()})


def rates_table(p: dict) -> pd.DataFrame:
    """The plan under the profile's rate and under Llama 3's, side by side: ``p`` is what
    :func:`add_plan_findings` returns. The profile's column decides the verdicts."""
    q = p["llama3"]
    rows = [("per-node daily failure probability", sci, "p_node_day"),
            ("P(at least one failure per day)", pct, "p_day"),
            ("P(at least one failure in the run)", pct, "p_run"),
            ("expected failures per run", num, "failures_run"),
            ("system MTBF", _hours, "mtbf_h"),
            ("optimal interval (Daly)", duration, "daly_s"),
            ("interval used", duration, "interval_s"),
            ("expected waste at that interval", pct, "waste_plan")]
    out = [{"quantity": name, "profile's rate": fmt(p[k]), "Llama 3's rate": fmt(q[k])} for name, fmt, k in rows]
    out.append({"quantity": "waste verdict", "profile's rate": _waste_verdict(p)[0],
                "Llama 3's rate": _waste_verdict(q)[0]})
    return pd.DataFrame(out)


def _hours(h: float) -> str:
    """An MTBF in hours, as the finding's unit and the field's sayings state it: ``1,875 h``, ``49.5 h``."""
    return f"{num(h)} h"


def _interval_verdict(p: dict) -> tuple[str, str]:
    """The plan's interval against the optimum: extra waste in points of the run (warn if none is set)."""
    if p["plan_s"] is None:
        return "warn", "the plan names no interval (training.checkpoint_interval_s)"
    v, words = judge(p["waste_plan"] - p["waste_opt"], warn=EXTRA_WARN, fail=EXTRA_FAIL, higher_is_better=False,
                     fmt="{:+.0%}")
    return v, "extra waste of the plan's interval vs the optimum: " + words


def _waste_verdict(p: dict) -> tuple[str, str]:
    return judge(p["waste_plan"], warn=WASTE_WARN, fail=WASTE_FAIL, higher_is_better=False, fmt="{:.0%}")


def _walltime_verdict(p: dict) -> tuple[str, str]:
    return judge(p["walltime_ratio"], warn=WALLTIME_WARN, fail=WALLTIME_FAIL, higher_is_better=False, fmt="{:.2g}")


def add_plan_findings(sink: FindingSink, profile: Profile, gpu_key: str | None = None) -> dict:
    """Failure probability, MTBF, checkpoint interval, waste and walltime fit of the plan.

    Each is computed under the profile's rate (the verdict) and under Llama 3's (in the message, with
    the verdict it would get). Returns the profile's plan, with the Llama 3 one under ``"llama3"``."""
    c, t = profile.cluster, profile.training
    p, q = plan(profile, gpu_key=gpu_key), plan(profile, R.LLAMA3_P_NODE_DAY, gpu_key)
    rate = f"{R.LLAMA3_RATE_PER_NODE_DAY:.1e}".replace("e-0", "e-")          # 3.8e-3
    at_llama, At_llama = (f"{w} Llama 3's {rate} interruptions per node-day" for w in ("at", "At"))
    gpu_h = profile.gpus * t.run_days * 24
    sink.add(id="fault_tolerance/failure_prob_day", value=p["p_day"], unit="probability", verdict="info",
             threshold="recorded for reference (1-(1-p)^N)",
             message=(f"{plural(c.nodes, 'node')} at {sci(c.node_failure_per_day)} failures per node-day: at least one node "
                      f"fails on {pct(p['p_day'])} of days; {at_llama}: {pct(q['p_day'])}. (The field report's "
                      f"case, {sci(R.FIELD['p_node_day'])} on {R.FIELD['nodes']:,} nodes: "
                      f"{pct(R.failure_prob(R.FIELD['p_node_day'], R.FIELD['nodes']))} of days.)"),
             fix="Plan for failure: checkpoint, resume automatically, restart elastically.", source=PROFILE_SOURCE)
    sink.add(id="fault_tolerance/failure_prob_run", value=p["p_run"], unit="probability", verdict="info",
             threshold="recorded for reference",
             message=(f"Over the {t.run_days:g}-day run: {pct(p['p_run'])} chance of at least one failure, "
                      f"{num(p['failures_run'])} failures expected; {at_llama}: {pct(q['p_run'])}, "
                      f"{num(q['failures_run'])} expected."),
             fix="A run that must not fail cannot be planned; a run that resumes can.", source=PROFILE_SOURCE)
    sink.add(id="fault_tolerance/mtbf_h", value=p["mtbf_h"], unit="h", verdict="info",
             threshold="recorded for reference (Llama 3: one interruption every ~3 h on 16k GPUs)",
             message=(f"System mean time between failures: {_hours(p['mtbf_h'])}; {at_llama}: "
                      f"{_hours(q['mtbf_h'])} (exponential failures: MTBF = 24 h / (nodes x rate)). The "
                      "profile's rate counts node failures only; Llama 3's counts every interruption (pre-emption, "
                      "file system, network included)."),
             fix=("Replace the assumed cluster.node_failure_per_day with your site's measured rate (interruptions per "
                  "node-day from the scheduler's and hardware logs); the interval and the waste below follow from it."),
             source=PROFILE_SOURCE)

    extra, extra_q = p["waste_plan"] - p["waste_opt"], q["waste_plan"] - q["waste_opt"]
    v, words = _interval_verdict(p)
    plan_words = (f"the plan's {duration(p['plan_s'])} costs {percent(extra)} of the run ({extra * gpu_h:,.0f} GPU-hours) over it"
                  if p["plan_s"] else "the plan names no interval, so its extra waste is unknown: set "
                  "training.checkpoint_interval_s")
    sink.add(id="fault_tolerance/checkpoint_write_s", value=p["C"], unit="s", verdict="info",
             threshold="recorded for reference (C of Young's and Daly's intervals)",
             message=(f"One checkpoint takes C = {seconds(p['C'])} ({p['C_how']})"
                      + (f"; each requeue waits {seconds(c.queue_wait_s)} in the queue, "
                         f"{pct(p['queue_waste'])} of the run at the walltime's ends alone"
                         if c.queue_wait_s else "") + "."),
             fix=("Give cluster.checkpoint_write_GBps (the file system's aggregate write bandwidth) so C follows "
                  "from the state's bytes, or measure it (chapter 5's checkpoint stall)."
                  if "default" in p["C_how"] else "Nothing to fix here."),
             source=PROFILE_SOURCE)
    sink.add(id="fault_tolerance/checkpoint_interval_opt_s", value=p["daly_s"], unit="s", verdict="info",
             threshold="recorded for reference (Daly's optimum; Young's sqrt(2 C M) beside it)",
             message=(f"Optimal interval for a {p['C']:g} s write and an MTBF of {_hours(p['mtbf_h'])}: "
                      f"{duration(p['daly_s'])} (Daly; Young's sqrt(2 C M) {duration(p['young_s'])}). "
                      f"{At_llama} (MTBF {_hours(q['mtbf_h'])}): {duration(q['daly_s'])}. Both formulas "
                      "assume exponential (memoryless) failures."),
             fix=("Checkpoint at the optimum for your site's measured failure rate; lower C (asynchronous two-stage "
                  "saves) to shorten it."),
             source=PROFILE_SOURCE)
    sink.add(id="fault_tolerance/checkpoint_interval_extra_waste", value=extra if p["plan_s"] else None,
             unit="fraction", verdict=v, threshold=words,
             message=(f"Against the optimum of {duration(p['daly_s'])}, {plan_words}. {At_llama} (optimum "
                      f"{duration(q['daly_s'])})"
                      + (f": the plan's interval costs {percent(extra_q)} over it" if p["plan_s"] else "")
                      + f" (verdict there: {_interval_verdict(q)[0]})."),
             fix=("Set training.checkpoint_interval_s near the optimum (fault_tolerance/checkpoint_interval_opt_s) "
                  "for your site's measured failure rate; lower C (asynchronous two-stage saves) to shorten it."),
             source=PROFILE_SOURCE)
    v, words = _waste_verdict(p)
    sink.add(id="fault_tolerance/expected_waste", value=p["waste_plan"], unit="fraction", verdict=v, threshold=words,
             message=(f"At a {duration(p['interval_s'])} interval, {pct(p['waste_plan'])} of the run goes to checkpoint "
                      f"writes, recomputed work and restarts ({p['R']:g} s each): {p['waste_plan'] * gpu_h:,.0f} "
                      f"of {gpu_h:,.0f} GPU-hours (Daly's exponential model; the chapter checks it by simulation); "
                      f"{at_llama}, at a {duration(q['interval_s'])} interval: {pct(q['waste_plan'])} "
                      f"({q['waste_plan'] * gpu_h:,.0f} GPU-hours, verdict there: {_waste_verdict(q)[0]})."),
             fix="Faster checkpoints (async, local first), faster restarts (elastic, warm spares).",
             source=PROFILE_SOURCE)
    v, words = _walltime_verdict(p)
    sink.add(id="fault_tolerance/walltime_fit", value=p["walltime_ratio"], unit="ratio", verdict=v,
             threshold="interval / walltime: " + words,
             message=(f"Interval {duration(p['interval_s'])} vs a {c.walltime_h:g} h walltime: "
                      + (f"{1 / p['walltime_ratio']:.3g} checkpoints per allocation." if p["walltime_ratio"] > 0 else "")
                      + f" The {t.run_days:g}-day run needs at least {math.ceil(t.run_days * 24 / c.walltime_h)} "
                      f"allocations, each with a restart; the last stretch of each is lost unless the walltime "
                      f"signal triggers a save. {At_llama}: interval {duration(q['interval_s'])}, ratio "
                      f"{num(q['walltime_ratio'])} (verdict there: {_walltime_verdict(q)[0]})."),
             fix="Trap the scheduler's warning (sbatch --signal=B:USR1@<s>), save, requeue: "
                 "preflight/slurm/walltime_requeue.sbatch.", source=PROFILE_SOURCE)
    return {**p, "llama3": q}


def add_measured_findings(sink: FindingSink, resume, stall, elastic,
                          why_missing: str = "plan-only mode (no live measurement)") -> None:
    """``resume``, ``stall``, ``elastic``: ``preflight.runner.chapter.Measured`` or None each."""
    sink.measured("fault_tolerance/resume_bitwise", resume, "bool", _resume_finding, why_missing=why_missing,
                  missing_threshold="pass = bitwise equal",
                  missing_fix="Checkpoint model, optimizer, scheduler, every RNG and the data position.")
    sink.measured("fault_tolerance/async_stall_ratio", stall, "ratio", _stall_finding, why_missing=why_missing,
                  missing_fix="Snapshot to host memory, write in the background.")
    sink.measured("fault_tolerance/elastic_recovery_s", elastic, "s", lambda r: dict(
        value=r["recovery_s"], verdict="info", threshold="recorded for reference",
        message=(f"torchrun --max-restarts=2: rank 1 killed after step {r['killed_after_step']}; training "
                 f"again {r['recovery_s']:.1f} s later from the step {r['resumed_from']} checkpoint "
                 f"({r['steps_lost']} steps lost, back to the kill point after {r['time_to_regain_s']:.1f} s); "
                 "final loss " + ("bitwise equal to" if r["final_loss_equal"] else "DIFFERENT from")
                 + " an uninterrupted run."),
        fix="torchrun --max-restarts with c10d rendezvous; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."),
        why_missing=why_missing, missing_fix="Run under torchrun --max-restarts with a c10d rendezvous.")


def _resume_finding(r: dict) -> dict:
    """Kill-and-resume against the uninterrupted run, and which left-out piece of state breaks it."""
    broken = [x for x in r["rows"][1:] if not x["bitwise_equal"]]
    return dict(value=float(r["resume_bitwise"]), verdict="pass" if r["resume_bitwise"] else "fail",
                threshold="pass = bitwise equal",
                message=(f"Killed with SIGKILL after step {r['killed_after_step']}, resumed from the step "
                         f"{r['checkpoint_step']} checkpoint ({plural(r['steps_lost'], 'step')} recomputed): the "
                         f"{r['rows'][0]['steps_compared']} losses are "
                         + ("bit-for-bit those of the uninterrupted run. " if r["resume_bitwise"] else
                            "NOT those of the uninterrupted run. ")
                         + "Leaving out " + ", ".join(f"{x['variant'].removeprefix('without ')} (max |diff| "
                                                      f"{x['max_abs_diff']:.2g})" for x in broken)
                         + " makes the curve depart."),
                fix="Save and restore every part of the state: preflight.harness.trainloop shows each.")


def stall_table(r: dict) -> pd.DataFrame:
    """Per checkpoint method of a ``ckptstall`` record: the training stall, when it is durable, the slower
    steps while it writes (hidden cost) and the total, in ms: chapter 5's table and chart."""
    st = pd.DataFrame(r["rows"])
    hidden = st["hidden_cost_s"].fillna(0) if "hidden_cost_s" in st else 0.0 * st["stall_s"]
    return pd.DataFrame({"method": st["method"], "training stall (ms)": st["stall_s"] * 1e3,
                         "durable after (ms)": st["durable_s"] * 1e3, "hidden cost (ms)": hidden * 1e3,
                         "total cost (ms)": (st["stall_s"] + hidden) * 1e3})


def stall_chart_data(r: dict) -> pd.DataFrame:
    """:func:`stall_table` in long form for the stacked chart: method, part (stall; slower steps while
    writing), ms."""
    t = stall_table(r)
    return pd.concat([pd.DataFrame({"method": t["method"], "part": "stall", "ms": t["training stall (ms)"]}),
                      pd.DataFrame({"method": t["method"], "part": "slower steps while writing",
                                    "ms": t["hidden cost (ms)"]})], ignore_index=True)


def async_total_ratio(r: dict) -> tuple[float, str]:
    """What an asynchronous two-stage save costs against a synchronous one, and which measure: the total
    (the stall plus the extra time of the steps trained while it writes) where the record has it, else
    the stall alone (records before ``total_cost_s``)."""
    if r.get("async_total_ratio") is not None:
        return r["async_total_ratio"], "total"
    by = {x["method"]: x for x in r["rows"]}
    a, s = by.get("async two-stage"), by.get("sync ckpt.save")
    if a and s and "total_cost_s" in a and s.get("total_cost_s"):
        return a["total_cost_s"] / s["total_cost_s"], "total"
    return r["async_stall_ratio"], "stall"


def _stall_finding(r: dict) -> dict:
    """What an asynchronous save costs training against a synchronous one: its stall plus the slower steps
    while it writes (the total the chart shows), judged."""
    value, what = async_total_ratio(r)
    v, words = judge(value, warn=STALL_WARN, fail=STALL_FAIL, higher_is_better=False, fmt="{:.2g}")
    rows = pd.DataFrame(r["rows"])
    parts = "; ".join(f"{x.method}: {x.stall_s * 1e3:.1f} ms" for x in rows.itertuples()
                      if hasattr(x, "stall_s"))
    two = rows[rows["method"] == "async two-stage"]
    hidden = ""
    if len(two) and "hidden_cost_s" in two:
        x = two.iloc[0]
        hidden = (f" Hidden cost: the steps trained while the background write ran were {factor(x['inflight_slowdown'])} "
                  f"slower ({x['hidden_cost_s'] * 1e3:.0f} ms per checkpoint), as the writer competes for "
                  "the same CPU cores; a GPU-bound step leaves them free.")
    total = (f"In all, the asynchronous save costs training {factor(value)} what the synchronous one does "
             "(stall plus slower steps)" + (": it loses more than it hides on this machine." if value > 1 else ".")
             if what == "total" else "")
    return dict(value=value, verdict=v,
                threshold=("async (stall + slower in-flight steps) / sync stall: " if what == "total" else
                           "async stall / sync stall: ") + words,
                message=(f"Training waits {factor(r['async_stall_ratio'])} as long for an asynchronous two-stage save "
                         f"as for a synchronous one (state {r['config'].get('state_MB', 0):.3g} MB; {parts})."
                         + hidden + (" " + total if total else "")),
                fix=("Nothing to fix here." if v == "pass" else
                     "Where the step is CPU-bound (as here) the background write competes with training: keep the "
                     "synchronous save, or write from a process pinned to spare cores. On a GPU-bound job snapshot "
                     "to host memory and write in the background (TwoStageCheckpointer, DCP async_save)."))


SHRINK_CMD = 'sbatch --nodes=2 --wrap "python -m preflight.bench.elastic --shrink --out results/"'


def add_shrink_finding(sink: FindingSink, shrink,
                       why_missing: str = "no record of a node lost (measured on two nodes, read with --results)") -> None:
    """A node lost under ``torchrun --nnodes=1:2`` (``shrink``: a recorded ``Measured`` or None): the
    field report's case (128 -> 120 nodes), measured: world size before / after, recovery time, steps
    lost, samples lost or repeated, and what stayed bitwise."""
    sink.measured("fault_tolerance/elastic_shrink_recovery_s", shrink, "s", _shrink_finding, why_missing=why_missing,
                  missing_fix=f"Measure a node loss with torchrun --nnodes=MIN:MAX: {SHRINK_CMD}")


def _shrink_finding(r: dict) -> dict:
    intact = r["samples_lost"] == 0 and r["samples_repeated"] == 0 and r["same_order_as_uninterrupted"]
    bitwise = r["before_change_equal"] and r["after_change_equal"]
    return dict(
        value=r["recovery_s"], verdict="pass" if intact and bitwise else "fail",
        threshold="pass = no sample lost or repeated, losses bitwise on both sides of the change",
        message=(f"{r['launcher']}: node {r.get('killed_node')} lost (its torchrun agent SIGKILLed) after step "
                 f"{r['killed_after_step']}; training went on at world size {r['world_after']} (was "
                 f"{r['world_before']}) {r['recovery_s']:.1f} s later from the step {r['resumed_from']} checkpoint "
                 f"({r['steps_lost']} steps lost). Samples: {r['samples_lost']} lost, {r['samples_repeated']} "
                 "repeated, " + ("in the uninterrupted run's order" if r["same_order_as_uninterrupted"] else
                                 "NOT in the uninterrupted run's order")
                 + ". Losses before the change " + ("bitwise equal to" if r["before_change_equal"] else "DIFFERENT from")
                 + " the uninterrupted run, after it " + ("bitwise equal to" if r["after_change_equal"] else
                                                          "DIFFERENT from")
                 + " a 1-rank run from the same checkpoint; not comparable with the uninterrupted run (the global "
                   "batch halves: another trajectory)."),
        fix="Checkpoint the data position in samples (not batches) so any world size resumes it; torchrun "
            "--nnodes=MIN:MAX with a c10d endpoint on a node that stays; tune keep_alive_interval for detection.")
