"""Evidence a team already has, beside its traces: Flight Recorder dumps and a per-op straggler trace.

``audit --flight-recorder DIR`` (chapter 5, :mod:`preflight.diagnose.flight_recorder`) and
``audit --stragglers DIR`` (chapter 4, :mod:`preflight.diagnose.stragglers_whatif`) go through here three
times: the CLI reads each folder before anything is written (bad input raises ``DumpError`` or
``StragglerTraceError``, the file named: exit 2), the chapter notebook shows it and adds its finding
(:mod:`preflight.runner.evidence_section`), and the audit puts one row per source in the report's quality
table (:func:`flight_recorder_row`, :func:`stragglers_row`: what the source holds, what it can support,
its limits, and what it told).

Each analysis is kept in this process, keyed by the folder and its files' names, sizes and modification
times: a plan-only audit runs the notebooks in the CLI's own process, so a folder is read once there; a
changed file is read again.
"""
from __future__ import annotations

from pathlib import Path

from preflight import REPO

# The public cases the chapters teach with when no folder is given (../shared beside the clone; absent: not shown).
SHARED = REPO.parent / "shared"
HANG_CASE = SHARED / "flight-recorder" / "gpu_error_2nd"
STRAGGLER_CASE = SHARED / "stragglers" / "AR"
_CACHE: dict[tuple, dict] = {}
_CACHE_SIZE = 4


def _stamp(folder: Path) -> tuple:
    return tuple(sorted((p.name, s.st_size, s.st_mtime_ns) for p in folder.iterdir() if p.is_file()
                        for s in (p.stat(),)))


def _cached(kind: str, folder, read) -> dict:
    folder = Path(folder)
    if not folder.is_dir():         # the reader says what is wrong (no such folder, a file given)
        return read(folder)
    key = (kind, str(folder.resolve()), _stamp(folder))
    if key not in _CACHE:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = read(folder)
    return _CACHE[key]


def hang(folder) -> dict:
    """The Flight Recorder analysis of ``folder`` (``flight_recorder.analyse_folder``); raises ``DumpError``."""
    from preflight.diagnose.flight_recorder import analyse_folder

    return _cached("flight_recorder", folder, analyse_folder)


def stragglers(folder) -> dict:
    """The what-if of the per-op trace in ``folder`` (``stragglers_whatif.analyze``); raises
    ``StragglerTraceError``."""
    from preflight.diagnose.stragglers_whatif import analyze

    return _cached("stragglers", folder, analyze)


def _told(f: dict) -> str:
    return f"{f['id']}: {f['verdict']}"


def flight_recorder_row(a: dict) -> dict:
    """The quality table's row for a folder of dumps: what it holds, supports and could not say."""
    from preflight.diagnose.flight_recorder import finding_of, ranks_text, where_text

    per_rank = sorted(a["entries"].values())
    limits = []
    if a["missing_dumps"]:
        limits.append(f"no dump for rank(s) {ranks_text(a['missing_dumps'])} of the {len(a['world'])} in the groups: "
                      "where they stand is read from their peers only")
    if a["empty_dumps"]:
        limits.append(f"empty recorder on rank(s) {ranks_text(a['empty_dumps'])}: only their counters (pg_status) "
                      "are read, no op, size or dtype")
    if per_rank:
        limits.append(f"each rank's ring buffer holds its last {per_rank[0]}-{per_rank[-1]} collectives: ops, sizes "
                      "and dtypes are compared over those only")
    unnamed = sum(len(g["unmapped"]) for g in a["groups"])
    if unnamed:
        limits.append(f"{unnamed} (rank, group) counter(s) whose local group id could not be named: not read")
    if a["skipped"]:
        limits.append(f"not a dump, not read: {', '.join(a['skipped'][:5])}{' ...' if len(a['skipped']) > 5 else ''}")
    f, s = finding_of(a), a["stopped_at"]
    told = (f"{a['state']}; " + (f"stopped at {where_text(s)}; " if s else "")
            + f"likely faulty ranks: {ranks_text(a['likely_faulty'])} ({_told(f)})")
    return {"source": "Flight Recorder dumps", "folder": a["folder"], "ranks": ranks_text(int(r) for r in a["files"]),
            "files": len(a["files"]),
            "holds": (f"{len(a['files'])} dumps (format {', '.join(a['versions'])}), {len(a['groups'])} process groups, "
                      f"{sum(per_rank):,} collectives recorded"),
            "supports": ["fault_tolerance"], "limits": limits, "told": told, "findings": [f["id"]]}


def stragglers_row(res: dict) -> dict:
    """The quality table's row for a per-op straggler trace: what it holds, supports and could not say."""
    j, q, f = res["job"], res["quality"], res["finding"]
    limits = []
    inside = j["tp_size"] * j["dsp_size"]
    if inside > 1:
        limits.append(f"one worker traced per group of {inside} GPUs (tp {j['tp_size']} x dsp {j['dsp_size']}): a slow "
                      "GPU inside a group shows as its group's worker")
    if q["replay_error"] > 0.005:
        limits.append(f"the replay at recorded durations departs from the recorded steps by {q['replay_error']:.1%}")
    if q["ops_started_before_a_dependency_ended"]:
        limits.append(f"{q['ops_started_before_a_dependency_ended']:,} ops started before an op they depend on ended "
                      "(clocks of different hosts, or overlap the graph does not model)")
    if q["collective_members_ending_before_the_last_arrival"]:
        limits.append(f"{q['collective_members_ending_before_the_last_arrival']:,} collective members ended before the "
                      "last member arrived")
    named = res["causes"]["named"]
    told = (f"S = {res['slowdown']:.3f} (real / ideal step time); "
            + (f"cause: {named[0]['cause']} ({', '.join(named[0]['where'])})" if named else "no single cause named")
            + f" ({_told(f)})")
    return {"source": "per-op straggler trace", "folder": res["folder"],
            "ranks": f"{res['workers_traced']} workers of {j['world_size']} GPUs", "files": 1,
            "file": f"{res['trace']} + {j['file']}",
            "holds": (f"{len(res['steps'])} steps, {res['ops_per_step']:,} ops per step; dp {j['dp_size']} x pp "
                      f"{j['pp_size']} x tp {j['tp_size']} x dsp {j['dsp_size']}"),
            "supports": ["load_balance"], "limits": limits, "told": told, "findings": [f["id"]]}
