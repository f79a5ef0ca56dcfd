"""Read a folder of PyTorch Flight Recorder dumps (one ``<prefix><rank>`` pickle per rank) safely.

A dump is what ``ProcessGroupNCCL`` writes when a collective times out (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``
with ``TORCH_NCCL_TRACE_BUFFER_SIZE=N``), into ``$TORCH_FR_DUMP_TEMP_FILE<rank>``. It is a pickle, and a
pickle can run any code when loaded: ``pickle.load`` on a file you did not write is remote code execution.
So the file is read by :class:`_BuiltinsOnly`, an Unpickler whose ``find_class`` refuses every global. A
pickle built of opcodes alone can only make builtin values (dict, list, tuple, set, str, bytes, int,
float, bool, None); one that asks for a class or function (``GLOBAL``, ``STACK_GLOBAL``, the ``copyreg``
extension codes) is refused with :class:`DumpError` before anything is called.

The value is then checked field by field (what :mod:`preflight.diagnose.flight_recorder` reads; fields it
does not read, such as ``frames``, may be anything). The schema, as PyTorch 2.x writes it (version 2.9
and 2.10 seen):

- ``pg_config``  {pg name: {``name``, ``desc``, ``ranks`` (a string "[0, 1]", or a list)}}: the groups
  this rank belongs to, keyed by their **global** name (the same on every rank);
- ``pg_status``  {local pg id: {``last_enqueued_collective``, ``last_completed_collective``, ...}}: keyed
  by the **local** id (``pg_id`` in the entries), which differs from the name;
- ``entries``    the ring buffer, oldest first: ``pg_id``, ``process_group`` ([name, desc]),
  ``collective_seq_id``, ``p2p_seq_id``, ``is_p2p``, ``profiling_name``, sizes and dtypes, ``record_id``.

Local id -> name: from the entries where they show it; a local id no entry shows (a rank whose buffer
is empty) is matched by creation order: both numberings grow as groups are created, so the i-th
smallest local id of ``pg_status`` is the i-th smallest name of ``pg_config`` when both list the same
number of groups. The order rule is checked against every pair the entries show and not used if one
disagrees (the ``mapping`` field says which rule gave each id).
"""
from __future__ import annotations

import ast
import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_DUMP_BYTES = 512 * 2**20           # a 20,000-entry buffer with stack frames is a few tens of MB
_RANK_FILE = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")


class DumpError(ValueError):
    """A dump folder or file that cannot be analysed; the message names the file and the field."""


class _Refused(pickle.UnpicklingError):
    """The pickle asked for a global."""


class _BuiltinsOnly(pickle.Unpickler):
    """Builds builtin values only: every request for a class or function is refused."""

    def find_class(self, module, name):
        raise _Refused(f"it asks for the global {module}.{name}; a Flight Recorder dump holds builtin "
                                     "values only, so nothing was loaded or run")


def load_pickle(path: Path):
    """The file's value, unpickled with builtins only. Raises DumpError (file named) on anything else."""
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: {size:,} bytes; a Flight Recorder dump is at most {MAX_DUMP_BYTES:,} bytes here")
    data = path.read_bytes()
    try:
        return _BuiltinsOnly(io.BytesIO(data)).load()
    except _Refused as err:
        raise DumpError(f"{path}: refused: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError,
            MemoryError, RecursionError, UnicodeDecodeError) as err:
        what = "truncated" if isinstance(err, EOFError) else f"{type(err).__name__}: {err}"
        raise DumpError(f"{path}: not a readable pickle ({what}); a Flight Recorder dump is the pickle "
                        "ProcessGroupNCCL writes") from None


@dataclass
class Dump:
    """One rank's dump, checked. ``status``: local pg id -> (last enqueued, last completed);
    ``groups``: pg name -> (desc, member ranks); ``local``: local pg id -> pg name; ``mapping``: how
    each local id was named ("entries" or "creation order")."""
    rank: int
    path: Path
    version: str
    groups: dict[str, tuple[str, tuple[int, ...]]]
    status: dict[int, tuple[int, int]]
    entries: list[dict]
    local: dict[int, str] = field(default_factory=dict)
    mapping: dict[int, str] = field(default_factory=dict)


def _need(path, where: str, value, kind, what: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DumpError(f"{path}: {where}: expected {what}, got {type(value).__name__} {str(value)[:60]!r}")
    return value


def _ranks(path, where: str, raw) -> tuple[int, ...]:
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw.strip() or "[]")      # literal_eval: a list literal, never code
        except (ValueError, SyntaxError):
            raise DumpError(f"{path}: {where}: expected a list of ranks such as \"[0, 1, 2, 3]\", got {raw[:60]!r}") from None
    if not isinstance(raw, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in raw):
        raise DumpError(f"{path}: {where}: expected a list of rank numbers (whole numbers >= 0), got {str(raw)[:60]!r}")
    if not raw:
        raise DumpError(f"{path}: {where}: the group lists no ranks; the groups cannot be rebuilt from this dump")
    return tuple(raw)


_ENTRY_FIELDS = {"pg_id": (int, "a local group id (int)"), "collective_seq_id": (int, "a sequence number (int)"),
                 "p2p_seq_id": (int, "a sequence number (int)"), "profiling_name": (str, "an op name such as "
                                                                                    "'nccl:all_reduce'"),
                 "is_p2p": (bool, "true or false"), "record_id": (int, "a record number (int)"),
                 "input_sizes": (list, "a list of tensor shapes"), "output_sizes": (list, "a list of tensor shapes"),
                 "input_dtypes": (list, "a list of dtype names"), "output_dtypes": (list, "a list of dtype names")}


def _entry(path, i: int, e) -> dict:
    _need(path, f"entries[{i}]", e, dict, "a dict (one recorded collective)")
    for key, (kind, what) in _ENTRY_FIELDS.items():
        if key not in e:
            raise DumpError(f"{path}: entries[{i}]: no '{key}' field (expected {what})")
        _need(path, f"entries[{i}].{key}", e[key], kind, what)
    pg = e.get("process_group")
    if not (isinstance(pg, (list, tuple)) and len(pg) == 2 and all(isinstance(x, str) for x in pg)):
        raise DumpError(f"{path}: entries[{i}].process_group: expected [name, desc] (two strings), got {str(pg)[:60]!r}")
    for key in ("input_sizes", "output_sizes"):
        if not all(isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s) for s in e[key]):
            raise DumpError(f"{path}: entries[{i}].{key}: expected shapes (lists of whole numbers), got {str(e[key])[:60]!r}")
    for key in ("input_dtypes", "output_dtypes"):
        if not all(isinstance(s, str) for s in e[key]):
            raise DumpError(f"{path}: entries[{i}].{key}: expected dtype names (strings), got {str(e[key])[:60]!r}")
    return {**e, "process_group": (pg[0], pg[1])}


def check_dump(path: Path, rank: int, d) -> Dump:
    """The unpickled value ``d`` of rank ``rank``'s file, checked and indexed (DumpError names the field)."""
    _need(path, "the top level", d, dict, "a dict with pg_config, pg_status and entries")
    for key in ("pg_config", "pg_status", "entries"):
        if key not in d:
            raise DumpError(f"{path}: no '{key}' field at the top level (a Flight Recorder dump has pg_config, "
                            "pg_status and entries)")
    version = str(d.get("version", "?"))
    groups = {}
    for name, g in _need(path, "pg_config", d["pg_config"], dict, "a dict {pg name: {name, desc, ranks}}").items():
        where = f"pg_config[{name!r}]"
        _need(path, where, g, dict, "a dict with desc and ranks")
        if "ranks" not in g:
            raise DumpError(f"{path}: {where}: no 'ranks' field")
        groups[str(name)] = (str(g.get("desc", "")), _ranks(path, f"{where}.ranks", g["ranks"]))
    status = {}
    for lid, s in _need(path, "pg_status", d["pg_status"], dict, "a dict {local pg id: {last_enqueued_collective, "
                                                                  "last_completed_collective}}").items():
        where = f"pg_status[{lid!r}]"
        if not str(lid).lstrip("-").isdigit():
            raise DumpError(f"{path}: {where}: expected a local pg id (a whole number)")
        _need(path, where, s, dict, "a dict with last_enqueued_collective and last_completed_collective")
        for key in ("last_enqueued_collective", "last_completed_collective"):
            if key not in s:
                raise DumpError(f"{path}: {where}: no '{key}' field")
            _need(path, f"{where}.{key}", s[key], int, "a sequence number (int, -1 for none)")
        status[int(lid)] = (s["last_enqueued_collective"], s["last_completed_collective"])
    entries = [_entry(path, i, e) for i, e in enumerate(_need(path, "entries", d["entries"], list, "a list"))]
    dump = Dump(rank, path, version, groups, status, entries)
    _name_local_ids(dump)
    return dump


def _name_local_ids(dump: Dump) -> None:
    """Fill ``dump.local`` (local pg id -> pg name): the entries' pairs, then creation order (module doc)."""
    p = dump.path
    for i, e in enumerate(dump.entries):
        lid, name = e["pg_id"], e["process_group"][0]
        if name not in dump.groups:
            raise DumpError(f"{p}: entries[{i}].process_group: group {name!r} is not in this dump's pg_config")
        if dump.local.get(lid, name) != name:
            raise DumpError(f"{p}: entries[{i}].pg_id: local id {lid} is group {name!r} here and "
                            f"{dump.local[lid]!r} in an earlier entry")
        if lid not in dump.status:
            raise DumpError(f"{p}: entries[{i}].pg_id: local id {lid} has no pg_status entry")
        dump.local[lid] = name
        dump.mapping[lid] = "entries"
    mine = sorted((n for n, (_, ranks) in dump.groups.items() if dump.rank in ranks), key=_name_key)
    lids = sorted(dump.status)
    if len(mine) == len(lids):
        order = dict(zip(lids, mine))
        if all(order[lid] == name for lid, name in dump.local.items()):
            for lid, name in order.items():
                if lid not in dump.local:
                    dump.local[lid] = name
                    dump.mapping[lid] = "creation order"


def _name_key(name: str):
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def dump_files(folder) -> tuple[dict[int, Path], list[str]]:
    """The folder's dump files by rank (``<prefix><rank>``, one prefix), and the names of the files skipped."""
    d = Path(folder)
    if not d.exists():
        raise DumpError(f"{folder}: no such folder")
    if not d.is_dir():
        raise DumpError(f"{folder}: is a file, not a folder: give the folder that holds every rank's dump "
                        "(_dump_0, _dump_1, ...)")
    by_prefix: dict[str, dict[int, Path]] = {}
    skipped = []
    for f in sorted(d.iterdir()):
        m = _RANK_FILE.match(f.name)
        if not f.is_file() or not m:
            skipped.append(f.name)
            continue
        ranks = by_prefix.setdefault(m["prefix"], {})
        rank = int(m["rank"])
        if rank in ranks:
            raise DumpError(f"{f}: rank {rank} twice ({ranks[rank].name} and {f.name})")
        ranks[rank] = f
    if not by_prefix:
        raise DumpError(f"{folder}: no Flight Recorder dumps (files named <prefix><rank>, e.g. _dump_0); "
                        f"found {len(skipped)} other file(s)")
    if len(by_prefix) > 1:
        sets = ", ".join(f"{p!r} ({len(r)} files)" for p, r in by_prefix.items())
        raise DumpError(f"{folder}: more than one set of dumps ({sets}): give a folder with one job's dumps")
    return next(iter(by_prefix.values())), skipped


def read_dumps(folder) -> tuple[dict[int, Dump], list[str]]:
    """Every rank's checked dump, and the names of the files skipped. Groups are checked across ranks: a
    pg name must have the same members in every dump that lists it (else two jobs are mixed)."""
    files, skipped = dump_files(folder)
    dumps = {r: check_dump(p, r, load_pickle(p)) for r, p in sorted(files.items())}
    seen: dict[str, tuple[int, tuple[int, ...]]] = {}
    for r, d in dumps.items():
        if d.groups and not any(r in ranks for _, ranks in d.groups.values()):
            raise DumpError(f"{d.path}: rank {r} (from the file name) is in none of its pg_config groups: the file "
                            "name does not give the rank that wrote it")
        for name, (_, ranks) in d.groups.items():
            first = seen.setdefault(name, (r, ranks))
            if first[1] != ranks:
                raise DumpError(f"{d.path}: pg_config[{name!r}].ranks: {list(ranks)} here, {list(first[1])} in rank "
                                f"{first[0]}'s dump: these files are not from one job")
    return dumps, skipped
