"""Which rank hung the job, and at which collective: PyTorch Flight Recorder dumps, every rank's.

A collective finishes only when every member of its process group has launched it. When one rank stops
(a GPU error, a held GIL, a dead process, a code path the others did not take), its peers launch the
next collective and wait in it, and everything behind them waits too, until the watchdog's timeout
dumps each rank's recorder (:mod:`preflight.diagnose.flight_recorder_dump` reads the files). Each dump
says, per process group, the last collective the rank **enqueued** (its CPU launched it) and the last
its watchdog saw **completed** (``pg_status``), and its recent collectives with sequence ids, ops,
shapes and dtypes (``entries``). Method (docs/flight-recorder.md):

1. **Rebuild every group** from ``pg_config`` (global names, members) and read each member's counters.
2. **Where each group stopped**: its leaders are the members that enqueued the most; the first collective
   a leader has not completed is the one the group waits in (``stuck``). Members that never enqueued it
   are *missing*; members that enqueued it and did not complete it are waiting.
3. **Line up** each group's collectives by sequence id across its members (non-p2p entries, by
   ``collective_seq_id``): the same id must be the same op with the same dtypes, and the same input
   sizes except for all-to-all, whose splits may differ by design. A rank that differs from the
   majority is a desync.
4. **Where the job stopped**: each rank's oldest outstanding entry (lowest ``record_id`` not completed)
   is where it waits; the group's stuck collective that most ranks wait in is the headline.
5. **Blame**: a rank waiting for someone is *ahead* of that someone in some group. A rank that is behind
   in a group and ahead of nobody in any group is where the waiting starts (the root of the wait); it is
   blamed, with high confidence when it is behind in every group of its that shows a difference, or
   when its recorder is also empty. A missing dump, a desync, or (when nobody lags in launches) a rank
   that completed less than its peers add suspects. Nothing is blamed when no collective is outstanding.

Assumes the dumps were taken at the hang (on timeout): a dump taken on demand from a running job shows
ranks a few collectives apart by design.
"""
from __future__ import annotations

from collections import Counter

from preflight.diagnose.flight_recorder_dump import Dump, _name_key, read_dumps

SCORE = {"high": 0.9, "medium": 0.6, "low": 0.3}


def _seq(e: dict) -> int:
    return e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"]


def _shape(sizes) -> str:
    return "x".join(str(d) for d in sizes[0]) if sizes and sizes[0] else "scalar" if sizes else "?"


def _status(dumps: dict[int, Dump]) -> dict[str, dict[int, tuple[int, int]]]:
    """pg name -> {rank: (last enqueued, last completed)} for every dumped member whose local id is named."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for r, d in dumps.items():
        for lid, name in d.local.items():
            out.setdefault(name, {})[r] = d.status[lid]
    return out


def _op_of(dumps, name: str, ranks, seq: int) -> dict | None:
    """The entry of group ``name`` with sequence id ``seq`` on the first of ``ranks`` that holds it."""
    for r in ranks:
        for e in dumps[r].entries:
            if e["process_group"][0] == name and _seq(e) == seq:
                return {"op": e["profiling_name"], "size": _shape(e["input_sizes"]),
                        "dtype": (e["input_dtypes"] or ["?"])[0], "p2p": e["is_p2p"], "seen_on": r}
    return None


def _mismatches(dumps, name: str, members) -> list[dict]:
    """Collectives of group ``name`` held by several ranks under one sequence id whose op, dtypes or (all-to-all
    excepted) input sizes differ; ``odd``: the ranks outside the majority (empty when there is none)."""
    by_seq: dict[int, dict[int, dict]] = {}
    for r in members:
        for e in dumps[r].entries if r in dumps else ():
            if e["process_group"][0] == name and not e["is_p2p"]:
                by_seq.setdefault(e["collective_seq_id"], {})[r] = e
    out = []
    for seq, held in sorted(by_seq.items()):
        if len(held) < 2:
            continue
        fields = {"op": lambda e: e["profiling_name"], "dtype": lambda e: "/".join(e["input_dtypes"] + e["output_dtypes"])}
        if not any("all_to_all" in e["profiling_name"] for e in held.values()):
            fields["size"] = lambda e: " ".join(_shape([s]) for s in e["input_sizes"])
        for what, get in fields.items():
            vals = {r: get(e) for r, e in held.items()}
            counts = Counter(vals.values()).most_common()
            if len(counts) < 2:
                continue
            top = counts[0][1] if counts[0][1] > counts[1][1] else None
            odd = sorted(r for r, v in vals.items() if top and v != counts[0][0])
            out.append({"group": name, "seq": seq, "field": what, "values": {str(r): v for r, v in sorted(vals.items())},
                        "odd": odd})
            break                   # one difference per collective: an op mismatch explains its dtypes
    return out


def _groups(dumps, status) -> list[dict]:
    names = {}
    for d in dumps.values():
        for name, (desc, ranks) in d.groups.items():
            names.setdefault(name, (desc, ranks))
    out = []
    for name in sorted(names, key=_name_key):
        desc, members = names[name]
        known = status.get(name, {})
        g = {"name": name, "desc": desc, "ranks": list(members), "status": {str(r): list(v) for r, v in sorted(known.items())},
             "no_dump": [r for r in members if r not in dumps],
             "unmapped": [r for r in members if r in dumps and r not in known],
             "stuck": None, "op": None, "not_enqueued": [], "not_completed": [], "lag": {},
             "mismatches": _mismatches(dumps, name, members)}
        if known:
            top = max(v[0] for v in known.values())
            leaders = [r for r, v in known.items() if v[0] == top]
            stuck = min(known[r][1] for r in leaders) + 1
            g["lag"] = {str(r): top - v[0] for r, v in sorted(known.items()) if v[0] < top}
            if stuck <= top:
                g["stuck"] = stuck
                g["op"] = _op_of(dumps, name, leaders, stuck)
                g["not_enqueued"] = sorted(r for r, v in known.items() if v[0] < stuck)
                g["not_completed"] = sorted(r for r, v in known.items() if v[0] >= stuck and v[1] < stuck)
        out.append(g)
    return out


def _waiting(dumps) -> dict[int, tuple[str, int]]:
    """rank -> (group, sequence id) of its oldest outstanding entry (enqueued, not completed)."""
    out = {}
    for r, d in dumps.items():
        names = {name: lid for lid, name in d.local.items()}
        pending = [e for e in d.entries if _seq(e) > d.status[names[e["process_group"][0]]][1]]
        if pending:
            e = min(pending, key=lambda e: e["record_id"])
            out[r] = (e["process_group"][0], _seq(e))
    return out


def _stopped_at(groups, waiting, likely) -> dict | None:
    """The stuck collective that a likely faulty rank never launched (or, none, one stuck inside: see
    :func:`inside_roots`) and most ranks wait in first."""
    waits = Counter(waiting.values())
    hung = [g for g in groups if g["stuck"] is not None]
    if not hung:
        return None
    roots = inside_roots(groups, waiting)
    g = max(hung, key=lambda g: (bool(set(g["not_enqueued"]) & set(likely)), g["name"] in roots,
                                 waits[(g["name"], g["stuck"])],
                                 bool(g["not_enqueued"]), len(g["ranks"]), -_name_key(g["name"])[1]))
    return {"group": g["name"], "desc": g["desc"], "seq": g["stuck"], **(g["op"] or {"op": None}),
            "waiting": sorted(r for r, w in waiting.items() if w == (g["name"], g["stuck"])),
            "not_enqueued": g["not_enqueued"], "not_completed": g["not_completed"], "no_dump": g["no_dump"]}


def inside_roots(groups, waiting) -> set[str]:
    """Groups stuck in a collective every member launched and none completed, which no member's wait elsewhere
    explains: no member waits first in a group where someone never launched. Their members are stuck inside
    (a GPU or the network stopped), not behind; a member's lag in other groups is not its fault."""
    missing = {g["name"] for g in groups if g["stuck"] is not None and g["not_enqueued"]}
    return {g["name"] for g in groups if g["stuck"] is not None and not g["not_enqueued"]
            and not any(waiting.get(r, ("",))[0] in missing for r in g["ranks"])}


def _blame(dumps, groups, waiting) -> list[dict]:
    ahead, behind, spread, lagging = {}, {}, {}, {}
    roots = inside_roots(groups, waiting)
    inside = {r for g in groups if g["name"] in roots for r in g["not_completed"]}
    for g in groups:
        st = {int(r): v for r, v in g["status"].items()}
        if g["no_dump"] or g["unmapped"]:        # launched and waiting with a member we cannot see: maybe for it
            for r, (enq, comp) in st.items():
                if enq > comp:
                    ahead.setdefault(r, []).append(g)
        if len({v[0] for v in st.values()}) > 1:
            low, top = min(v[0] for v in st.values()), max(v[0] for v in st.values())
            for r, (enq, _) in st.items():
                spread.setdefault(r, []).append(g)
                if enq > low:
                    ahead.setdefault(r, []).append(g)
                if enq < top:
                    behind.setdefault(r, []).append((g, enq, top))
        elif len({v[1] for v in st.values()}) > 1:        # same launches, different completions
            top = max(v[1] for v in st.values())
            for r, (_, comp) in st.items():
                lagging.setdefault(r, []).append(comp < top)
    sus: dict[int, dict] = {}

    def add(r, level, why):
        s = sus.setdefault(r, {"rank": r, "confidence": level, "reasons": []})
        if SCORE[level] > SCORE[s["confidence"]]:
            s["confidence"] = level
        s["reasons"].append(why)

    busy = max((len(d.entries) for d in dumps.values()), default=0)
    for r in sorted(behind):
        if r in ahead or r in inside:
            continue
        g, enq, top = min(behind[r], key=lambda x: x[1] - x[2])
        every = len(behind[r]) == len(spread[r])
        add(r, "high" if every and len(behind[r]) >= 2 else "medium",
            f"behind its peers in {len(behind[r])} of its {len(spread[r])} groups whose members differ, ahead of "
            f"nobody anywhere (most: group {g['name']} {g['desc']}, last enqueued {enq} against {top})")
        if not dumps[r].entries and busy:
            add(r, "high", f"its recorder holds no entries (peers hold up to {busy}) though its counters show "
                           "collectives ran: the process stopped recording")
    hung = any(g["stuck"] is not None for g in groups)
    for g in groups:
        for m in g["mismatches"]:
            for r in m["odd"]:
                add(r, "high" if m["field"] != "size" else "medium",
                    f"desync in group {g['name']} {g['desc']} at collective {m['seq']}: its {m['field']} is "
                    f"{m['values'][str(r)]!r} where the others' is {Counter(m['values'].values()).most_common(1)[0][0]!r}")
    if hung and not sus:
        for r, flags in sorted(lagging.items()):
            if all(flags):
                add(r, "medium", "launched the same collectives as its peers but completed fewer, in every group "
                                 "where completions differ: its GPU (or its NCCL kernel) did not finish its work")
    if hung:
        strong = any(s["confidence"] == "high" for s in sus.values())
        for r in sorted({r for g in groups for r in g["no_dump"]}):
            add(r, "low" if strong else "medium", "no dump file: the process may have died before the dump (a crash, "
                                                  "a lost node) or its file was not collected")
    order = sorted(sus.values(), key=lambda s: (-SCORE[s["confidence"]], -len(behind.get(s["rank"], ())), s["rank"]))
    return [{**s, "score": SCORE[s["confidence"]]} for s in order]


def analyse(dumps: dict[int, Dump], skipped: list[str] | None = None, folder: str = "") -> dict:
    """The whole analysis as plain data (the ``--json`` output): groups, where the job stopped, suspects."""
    status = _status(dumps)
    groups = _groups(dumps, status)
    waiting = _waiting(dumps)
    suspects = _blame(dumps, groups, waiting)
    likely = sorted(s["rank"] for s in suspects if s["confidence"] != "low")
    stopped = _stopped_at(groups, waiting, likely)
    world = sorted({r for g in groups for r in g["ranks"]} | set(dumps))
    mapped = Counter(how for d in dumps.values() for how in d.mapping.values())
    return {"folder": folder, "files": {str(r): d.path.name for r, d in dumps.items()}, "skipped": skipped or [],
            "versions": sorted({d.version for d in dumps.values()}), "world": world,
            "missing_dumps": [r for r in world if r not in dumps],
            "empty_dumps": [r for r, d in dumps.items() if not d.entries],
            "entries": {str(r): len(d.entries) for r, d in dumps.items()},
            "local_ids_named_by": dict(mapped),
            "state": (("desync" if likely else "healthy") if stopped is None else
                      "hung" if likely else "hung, not attributed"),
            "stopped_at": stopped, "waiting": {str(r): {"group": g, "seq": s} for r, (g, s) in sorted(waiting.items())},
            "likely_faulty": likely, "suspects": suspects, "groups": groups}


def analyse_folder(folder) -> dict:
    """Read (:func:`read_dumps`, raises ``DumpError``) and analyse a folder of dumps."""
    dumps, skipped = read_dumps(folder)
    return analyse(dumps, skipped, str(folder))


def ranks_text(ranks) -> str:
    """[8, 10, 11, 12, 13, 15] -> '8, 10-13, 15'."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out) or "none"


def where_text(s: dict) -> str:
    """'group 72 EXPERT_MODEL_PARALLEL_GROUP, collective 44791 (nccl:all_to_all 2048x5120 BFloat16)'."""
    op = f" ({s['op']} {s['size']} {s['dtype']})" if s.get("op") else " (not in the dumps' buffers)"
    return f"group {s['group']} {s['desc']}, {'p2p op' if s.get('p2p') else 'collective'} {s['seq']}{op}"


def finding_of(a: dict) -> dict:
    """The finding ``fault_tolerance/hang_attribution`` of an analysis (:func:`analyse`), as
    ``preflight.core.findings.Finding``'s fields. ``value``: how many ranks are named; the schema's value
    is a number, so the ranks themselves are ``per_rank``'s keys, each with its confidence (0.9 high, 0.6
    medium, 0.3 low), and the message names them."""
    n, s, likely = len(a["files"]), a["stopped_at"], a["likely_faulty"]
    source = (f"Flight Recorder dumps of {n} rank{'s' * (n != 1)} in {a['folder']} (version {', '.join(a['versions'])})"
              + (f"; no dump for rank(s) {ranks_text(a['missing_dumps'])}" if a["missing_dumps"] else ""))
    base = {"id": "fault_tolerance/hang_attribution", "unit": "ranks", "value": float(len(likely)), "source": source,
            "threshold": "pass: no collective outstanding; warn: hung, no rank named; fail: the ranks that hung it named",
            "per_rank": {str(x["rank"]): x["score"] for x in a["suspects"]} or None}
    if s is None and likely:
        return {**base, "verdict": "fail", "message": f"no collective outstanding, but rank(s) {ranks_text(likely)} "
                f"called collectives their peers did not: {a['suspects'][0]['reasons'][0]}",
                "fix": "Make every rank of a group call the same collectives in the same order with the same shapes "
                       "and dtypes (a rank-dependent branch, or uneven data, skips or adds one)."}
    if s is None:
        return {**base, "verdict": "pass", "fix": "Nothing to fix here.",
                "message": f"no collective outstanding in any of {len(a['groups'])} process groups of {len(a['world'])} "
                           "ranks: the job was not hung when the dumps were taken"}
    where = where_text(s)
    if not likely:
        return {**base, "verdict": "warn",
                "message": (f"stopped at {where}: every member launched it and none completed it, no rank is behind: "
                            "the fault is below the ranks (network, NCCL, a GPU that stopped mid-collective)"),
                "fix": (f"Check the fabric and the GPUs of group {s['group']}'s ranks {ranks_text(s['not_completed'])} "
                        "(NCCL_DEBUG=INFO logs, Xid errors in dmesg, ibstat), then restart from the last checkpoint.")}
    first = next(x for x in a["suspects"] if x["rank"] == likely[0])
    return {**base, "verdict": "fail",
            "message": (f"rank{'s' * (len(likely) > 1)} {ranks_text(likely)} hung the job: stopped at {where}, never "
                        f"launched by {ranks_text(s['not_enqueued'])}, waited in by {ranks_text(s['waiting'])}; "
                        f"rank {first['rank']} ({first['confidence']} confidence): {first['reasons'][0]}"),
            "fix": (f"Restart from the last checkpoint without the node(s) of rank{'s' * (len(likely) > 1)} "
                    f"{ranks_text(likely)}; their logs say why (Xid errors in dmesg or nvidia-smi for a GPU fault, "
                    "py-spy dump for a Python thread holding the GIL).")}


def hang_finding(folder) -> dict:
    """``fault_tolerance/hang_attribution`` for a folder of dumps (``audit --flight-recorder DIR``):
    ``Finding(**hang_finding(folder))``. Raises ``DumpError`` (file and field named) for unusable input."""
    return finding_of(analyse_folder(folder))
