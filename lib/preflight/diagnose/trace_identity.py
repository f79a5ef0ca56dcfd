"""Are these files one job? The checks a folder of per-rank traces passes before it is judged as one.

The world size agreeing is not enough: a rank copied in from another run (ten days later, another
model, the same world size) would be matched collective by collective against ranks it never ran with,
and the wait it shows would be invented. Each rank's first file is compared with the lowest rank's:

- **start times**: the hosts' clocks differ by milliseconds to seconds, not by a day: two ranks whose
  traces start more than ``MAX_START_APART_NS`` apart are two runs;
- **devices**: the GPU models ``deviceProperties`` names (a job runs on one kind of GPU);
- **process groups**: a group of the same name with another size or description in ``pg_config``;
- **kernel names**: two ranks of one job run the same kernels; two with at least
  ``MIN_NAMES`` kernel names each and none in common ran different programs.

A failed check raises ``TraceError`` naming both files and the reason (the command exits 2).
"""
from __future__ import annotations

from pathlib import Path

from preflight.diagnose.trace_file import TraceError

MAX_START_APART_NS = 24 * 3600 * 10**9
MIN_NAMES = 8


def _why_apart(a: dict, b: dict) -> str | None:
    ma, mb = a["meta"], b["meta"]
    sa, sb = ma.get("start_ns"), mb.get("start_ns")
    if isinstance(sa, int) and isinstance(sb, int) and abs(sa - sb) > MAX_START_APART_NS:
        return (f"their traces start {abs(sa - sb) / 86400e9:.1f} days apart (clocks of one job differ by "
                "seconds at most)")
    da, db = ma.get("devices") or [], mb.get("devices") or []
    if da and db and set(da) != set(db):
        return f"they ran on different GPUs ({', '.join(da)} vs {', '.join(db)})"
    ga, gb = ma.get("groups") or {}, mb.get("groups") or {}
    for name in sorted(set(ga) & set(gb)):
        x, y = ga[name], gb[name]
        for key in ("size", "desc"):
            if x.get(key) is not None and y.get(key) is not None and x[key] != y[key]:
                return f"process group {name!r} has {key} {x[key]!r} in one and {y[key]!r} in the other"
    ka, kb = set(a.get("kernel_names") or []), set(b.get("kernel_names") or [])
    if len(ka) >= MIN_NAMES and len(kb) >= MIN_NAMES and not ka & kb:
        return f"they share no kernel name ({len(ka)} and {len(kb)} distinct names: different programs)"
    return None


def check_one_job(folder: Path, by_rank: dict[int, list[dict]]) -> None:
    """Raise ``TraceError`` when a rank's traces are not of the same run as the lowest rank's (see the
    module's docstring)."""
    if len(by_rank) < 2:
        return
    ranks = sorted(by_rank)
    ref = by_rank[ranks[0]][0]
    for r in ranks[1:]:
        s = by_rank[r][0]
        why = _why_apart(ref, s)
        if why:
            raise TraceError(f"{folder}: {ref['meta']['file']} (rank {ranks[0]}) and {s['meta']['file']} (rank {r}) "
                             f"are not one job: {why}. Keep one run's traces in the folder.")
