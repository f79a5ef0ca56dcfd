"""Command line: ``python -m preflight audit PROFILE ...``, ``compare OLD_DIR NEW_DIR`` and friends.

Exit codes: 0 ran; 1 a chapter errored (or a verdict at/above ``--fail-on``, or the findings broke
the schema); 2 bad input (profile, argument, path, findings file), reported in one message naming
the field, with nothing written. A mistyped subcommand, option or choice gets a suggestion
("did you mean 'audit'?").
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from pathlib import Path

from preflight.models import EFFICIENCY_RANGE


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same format and exit code as ours
        self.print_usage(sys.stderr)
        _die(f"{self.prog}: {message}{_choice_hint(self, message)}")


def _did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """For argparse's "invalid choice: 'audti' (choose from ...)": the closest of this parser's choices
    (its subcommands, or an option's choices such as --fail-on's)."""
    m = re.search(r"invalid choice: (['\"]?)(.+?)\1 \(choose from", message)
    if not m:
        return ""
    return _did_you_mean(m.group(2), (c for a in parser._actions if a.choices for c in a.choices))


def _unknown_options_hint(extra: list[str], *parsers: argparse.ArgumentParser) -> str:
    """For arguments no parser took: the closest known option to each one that looks like an option."""
    known = [s for p in parsers for a in p._actions for s in a.option_strings]
    return "".join(_did_you_mean(x.split("=", 1)[0], known) for x in extra if x.startswith("-"))


def _die(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _timeout(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout = {text!r}: expected whole seconds, 10 to 86400") from None
    if not 10 <= v <= 86400:
        raise argparse.ArgumentTypeError(f"--timeout = {v}: accepted range is 10 to 86400 seconds")
    return v


def _ranged(name: str, kind, low, high, what: str):
    """An argparse type: ``kind`` (int or float) within [low, high], else the option, value and range named."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r}: expected a {'whole ' * (kind is int)}number, "
                                             f"{low:,} to {high:,} {what}") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{name} = {text}: accepted range is {low:,} to {high:,} {what}")
        return v
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="preflight", description="Preflight: audit a training project for the five "
                                              "pitfalls of scaling on HPC clusters.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p.set_defaults(_commands=sub.choices)      # name -> subparser, for main's typo hints

    a = sub.add_parser("audit", help="run the chapters on a profile and write the report")
    a.add_argument("profile", help="project profile (YAML), e.g. data/profiles/example.yaml")
    a.add_argument("--out", help="output folder (default reports/<project>/, with --plan-only reports/<project>-plan/)")
    a.add_argument("--plan-only", action="store_true", help="formulas only, no live measurement")
    a.add_argument("--chapters", help="comma-separated chapter numbers, e.g. 1,3 (default: all)")
    a.add_argument("--timeout", type=_timeout, default=600,  # = audit.DEFAULT_TIMEOUT_S (import-light CLI)
                   help="per-cell execution timeout, s (10-86400)")
    a.add_argument("--fail-on", choices=["warn", "fail"], help="exit 1 if any verdict reaches this level")
    a.add_argument("--results", help="folder of measurement records (JSON) to use instead of measuring")
    a.add_argument("--traces", metavar="DIR", help="your job's torch.profiler traces (one file or more per rank): "
                                                   "their findings join each chapter's")
    a.add_argument("--flight-recorder", metavar="DIR", help="your hung job's Flight Recorder dumps (_dump_<rank>, one "
                                                            "per rank): chapter 5 names the ranks that hung it")
    a.add_argument("--stragglers", metavar="DIR", help="your job's per-op trace (*.parquet + meta*.yaml): chapter 4 "
                                                       "says what its stragglers cost, and why")
    a.add_argument("--quick", action="store_true", help="smallest measurement sizes (smoke test)")
    a.add_argument("--playbook", help=argparse.SUPPRESS)  # tests: another notebook folder

    k = sub.add_parser("check", help="plan-only findings and verdicts in the terminal, in seconds (a CI gate)")
    k.add_argument("profile", help="project profile (YAML)")
    k.add_argument("--fail-on", choices=["warn", "fail"], help="exit 1 if any verdict reaches this level")
    k.add_argument("--json", action="store_true", help="print the findings as JSON (chapter, id, value, verdict...)")
    k.add_argument("--all", action="store_true", help="also list the findings recorded for reference (info)")

    d = sub.add_parser("advise", help="rank the parallel layouts that fit by predicted tokens/s per GPU")
    d.add_argument("profile", help="project profile (YAML)")
    d.add_argument("--top", type=_ranged("--top", int, 1, 1000, "layouts"), default=10,
                   help="how many fitting layouts to list (1-1000, default 10)")
    d.add_argument("--json", action="store_true", help="print the ranked layouts as JSON, best first")
    d.add_argument("--write-profile", metavar="OUT.yaml", help="write the profile with the top layout as its plan")
    d.add_argument("--global-batch", type=_ranged("--global-batch", int, 1, 10_000_000, "sequences"),
                   help="sequences per optimizer step (1-10,000,000; default: the profile's mbs x m x dp)")
    eff = d.add_mutually_exclusive_group()
    eff.add_argument("--efficiency", type=_ranged("--efficiency", float, *EFFICIENCY_RANGE, "of peak"),
                     help="share of the dense peak the kernels reach, e.g. chapter 1's measured MFU (0.01-1; "
                          "default 0.60)")
    eff.add_argument("--mfu-from", metavar="AUDIT",
                     help="take the efficiency from chapter 1's measured MFU in an audit (its folder or findings.json)")

    t = sub.add_parser("traces", help="the five verdicts from a job's torch.profiler traces, one or more per rank")
    t.add_argument("dir", metavar="DIR", nargs="?", help="folder of the job's traces (*.json, *.json.gz) or their "
                                                        "per-rank *.summary.json, or Nsight Systems exports "
                                                        "(*.sqlite from nsys export --type sqlite; one rank per GPU)")
    t.add_argument("--json", action="store_true", help="print the quality table, per-rank figures and findings as JSON")
    t.add_argument("--fail-on", choices=["warn", "fail"], help="exit 1 if any verdict reaches this level")
    t.add_argument("--gpu", metavar="KEY", help="the chip's key in the hardware table (python -m preflight chips), "
                                                "where the traces' deviceProperties do not name a known chip")
    t.add_argument("--jobs", type=_ranged("--jobs", int, 1, 1024, "processes"),
                   help="files read at once, one process each (1-1024; default: the cores)")
    t.add_argument("--summarize", metavar="TRACE", nargs="+", help="write each TRACE's per-rank summary into --out "
                                                                   "(one Slurm task per node reads its ranks' traces "
                                                                   "where they are: slurm/trace_summaries.sbatch)")
    t.add_argument("--out", metavar="DIR", help="with --summarize: the folder for <name>.summary.json")

    h = sub.add_parser("hang", help="which rank hung the job, and at which collective: every rank's Flight Recorder dump")
    h.add_argument("dir", metavar="DIR", help="folder of the job's dumps, one <prefix><rank> file per rank (_dump_0, ...)")
    h.add_argument("--json", action="store_true", help="print the groups, where the job stopped and the suspects as JSON")
    h.add_argument("--svg", metavar="FILE", help="also draw ranks x process groups, how far each rank got, into FILE")

    v = sub.add_parser("validate", help="check a profile and print it with defaults filled in")
    v.add_argument("profile")

    sub.add_parser("chips", help="print the hardware peak table")

    s = sub.add_parser("shards", help="pack a small-file dataset into verified tar shards (chapter 2)")
    s.add_argument("src", metavar="SRC_DIR", help="folder of sample files, e.g. cls_03/00000123.img.zz")
    s.add_argument("dst", metavar="DST_DIR", help="output folder for shard-NNNNNN.tar + manifest.json")
    s.add_argument("--shard-size", default="256MB",
                   help="target shard size, e.g. 256MB, 500MB, 1GiB (default 256MB, at most 100GB)")
    s.add_argument("--force", action="store_true", help="replace an existing shard set in DST_DIR")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c = sub.add_parser("compare", help="before/after: compare two audit folders (writes compare.html)")
    c.add_argument("old", metavar="OLD_DIR", help="the earlier audit folder (holds findings.json)")
    c.add_argument("new", metavar="NEW_DIR", help="the later audit folder")
    c.add_argument("--out", metavar="DIR", help="where to write compare.html (default NEW_DIR)")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when a verdict worsens or a measured value moves the wrong way beyond its noise")
    return p


def cmd_audit(args) -> int:
    from preflight.core.profile import ProfileError, load_profile
    from preflight.runner import audit

    try:
        profile = load_profile(args.profile)
        playbook = Path(args.playbook) if args.playbook else audit.PLAYBOOK
        chapters = audit.select_chapters(args.chapters, audit.discover(playbook))
    except (ProfileError, audit.AuditInputError) as err:
        _die(str(err))
    results = None
    if args.results:
        results = Path(args.results).resolve()     # notebooks run in playbook/: make it absolute
        if not results.is_dir():
            _die(f"--results = {args.results!r}: not a folder of measurement records")
    traces = None
    if args.traces:        # read (and cached) before anything is written: a bad folder exits 2 here
        from preflight.chapters.traces import audit_traces
        from preflight.diagnose.trace_file import TraceError

        traces = Path(args.traces).resolve()
        try:
            audit_traces(traces, None if profile.cluster.gpu == "auto" else profile.cluster.gpu)
        except TraceError as err:
            _die(f"--traces: {err}")
    evidence = _audit_evidence(args, chapters)      # read before anything is written too: exit 2 here
    # a plan-only audit writes beside the measured report, never over it
    out = Path(args.out) if args.out else Path("reports") / (profile.project + ("-plan" if args.plan_only else ""))
    if out.exists() and not out.is_dir():
        _die(f"--out = {args.out!r}: exists and is not a folder")
    try:       # the workload (your model) checked before anything is written
        workload = audit.check_workload(profile, Path(args.profile).resolve(), plan_only=args.plan_only,
                                        results_dir=results)
    except audit.AuditInputError as err:
        _die(str(err))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _die(f"--out = {str(out)!r}: cannot create the output folder ({err.strerror})")

    from preflight.reporting.report import FindingsError

    try:
        summary = audit.run_audit(profile, Path(args.profile).resolve(), out.resolve(), chapters=chapters,
                                  playbook=playbook, plan_only=args.plan_only, results_dir=results,
                                  timeout_s=args.timeout, quick=args.quick, workload=workload, traces_dir=traces,
                                  **evidence)
    except FindingsError as err:    # a chapter emitted something outside the contract: a bug, not input
        print(f"error: the report was not written: {err}", file=sys.stderr)
        return 1
    for c in summary["chapters"]:
        print(f"  chapter {c['number']} {c['name']:<18} {c['status']:<6} {c['verdict']:<6} {c['elapsed_s']:>6.1f} s")
    print(f"report: {(out / 'index.html').resolve()}")
    return audit.exit_code(summary, args.fail_on)


def _audit_evidence(args, chapters: list[int]) -> dict:
    """``--flight-recorder DIR`` and ``--stragglers DIR``, read and checked (``preflight.runner.evidence``):
    absolute folders for ``run_audit``, or exit 2 naming the file (or the chapter the selection leaves out)."""
    from preflight.chapters.registry import BY_NAME
    from preflight.diagnose.flight_recorder_dump import DumpError
    from preflight.diagnose.stragglers_trace import StragglerTraceError
    from preflight.runner import evidence

    out = {}
    for option, key, chapter, read, errors in (
            ("--flight-recorder", "flight_recorder_dir", "fault_tolerance", evidence.hang, DumpError),
            ("--stragglers", "stragglers_dir", "load_balance", evidence.stragglers, StragglerTraceError)):
        given = getattr(args, key.removesuffix("_dir"))
        if not given:
            continue
        n = BY_NAME[chapter].number
        if n not in chapters:
            _die(f"{option} is read by chapter {n} ({chapter}), which --chapters {args.chapters} leaves out: "
                 f"add {n} to --chapters")
        folder = Path(given).resolve()
        try:
            read(folder)
        except errors as err:
            _die(f"{option}: {err}")
        except OSError as err:
            _die(f"{option}: {err.filename or given}: {err.strerror or err}")
        out[key] = folder
    return out


def cmd_check(args) -> int:
    import json

    from preflight.core.profile import ProfileError, load_profile
    from preflight.runner import check

    try:
        profile = load_profile(args.profile)
    except ProfileError as err:
        _die(str(err))
    findings = check.plan_findings(profile, Path(args.profile).resolve())
    if args.json:
        rows = [f | {"chapter": n} for n, fs in findings.items() for f in fs]
        print(json.dumps({"project": profile.project, "fail_on": args.fail_on,
                          "exit_code": check.gate(findings, args.fail_on), "findings": rows}, indent=1))
    else:
        print(check.text_report(profile, findings, show_info=args.all), end="")
    return check.gate(findings, args.fail_on)


def cmd_advise(args) -> int:
    import json

    from preflight.chapters import advisor
    from preflight.chapters.memory_plan import capacity_bytes
    from preflight.core.profile import ProfileError, load_profile
    from preflight.models.throughput import MFU_CONVENTION as T_MFU

    try:
        profile = load_profile(args.profile)
    except ProfileError as err:
        _die(str(err))
    out = Path(args.write_profile) if args.write_profile else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        _die(f"--write-profile = {args.write_profile!r}: " + ("is a folder" if out.is_dir() else
                                                             "its folder does not exist"))
    gpu_key, capacity = None, None
    if profile.cluster.gpu == "auto":         # this machine's GPU: probed (imports torch)
        from preflight.core.device import probe

        device = probe()
        gpu_key, capacity = device.table_key, capacity_bytes(profile, device)[0]
    try:
        efficiency, source = args.efficiency, None
        if args.mfu_from:
            efficiency, source = advisor.measured_efficiency(args.mfu_from, profile)
        result = advisor.advise(profile, batch=args.global_batch, efficiency=efficiency, gpu_key=gpu_key,
                                capacity=capacity, efficiency_source=source)
    except ValueError as err:
        _die(str(err))
    if args.json:
        shown = [c for c in result["candidates"] if c["fits"]][:args.top] or result["candidates"][:1]
        print(json.dumps({"plan": result["plan"], "candidates": shown, "fitting": result["fitting"],
                          "layouts": len(result["candidates"]), "global_batch": result["global_batch"],
                          "efficiency": result["efficiency"], "efficiency_modelled": result["efficiency_modelled"],
                          "efficiency_source": result["efficiency_source"], "mfu_convention": T_MFU,
                          "not_modelled": result["not_modelled"]}, indent=1))
    else:
        print(advisor.text_report(profile, result, args.top), end="")
    if result["no_fit"]:
        if out is not None:
            print(f"error: --write-profile: no layout fits, {out} not written", file=sys.stderr)
        return 1
    if out is not None:
        advisor.write_profile(profile, result["candidates"][0], out)
        print(f"profile: {out.resolve()} (the top layout; `python -m preflight check {out}` judges it)")
    return 0


def cmd_traces(args) -> int:
    from preflight.core import hardware
    from preflight.diagnose.trace_file import TraceError

    if args.gpu and hardware.lookup(args.gpu) is None:
        _die(f"--gpu = {args.gpu!r}: not in the hardware table; accepted: {', '.join(hardware.CHIPS)}"
             f"{_did_you_mean(args.gpu, hardware.CHIPS)}")
    if args.summarize:
        from preflight.runner.traces import summarize_many

        if args.dir or not args.out:
            _die("traces --summarize TRACE [TRACE ...] --out DIR: trace files and an output folder (no DIR argument)")
        missing = [f for f in args.summarize if not Path(f).is_file()]
        if missing:
            _die(f"--summarize = {missing[0]!r}: no such file")
        try:
            paths = summarize_many([Path(f) for f in args.summarize], Path(args.out), args.jobs)
        except TraceError as err:
            _die(str(err))
        print(f"wrote {len(paths)} summar{'y' if len(paths) == 1 else 'ies'} into {args.out}")
        return 0
    if not args.dir:
        _die("traces: give the folder of the job's traces (DIR), or --summarize TRACE --out DIR")
    if args.out:
        _die("traces DIR: --out goes with --summarize only")
    from preflight.runner import stragglers as straggler_trace

    if straggler_trace.is_per_op_folder(args.dir):     # a Parquet per-op trace + meta: the straggler what-if
        from preflight.diagnose.stragglers_trace import StragglerTraceError

        try:
            return straggler_trace.run(args.dir, args.json, args.fail_on)
        except StragglerTraceError as err:
            _die(str(err))
    from preflight.chapters.traces import audit_traces
    from preflight.runner import traces as R

    try:
        a = audit_traces(args.dir, args.gpu, args.jobs)
    except TraceError as err:
        _die(str(err))
    findings = R.by_chapter(a)
    print(R.as_json(a, findings, args.fail_on) if args.json else R.text_report(a, findings), end="\n" if args.json else "")
    return R.gate(findings, args.fail_on)


def cmd_hang(args) -> int:
    from preflight.diagnose.flight_recorder import analyse_folder
    from preflight.diagnose.flight_recorder_dump import DumpError
    from preflight.runner import hang

    svg = Path(args.svg) if args.svg else None
    if svg is not None and (svg.is_dir() or not svg.parent.is_dir()):
        _die(f"--svg = {args.svg!r}: " + ("is a folder" if svg.is_dir() else "its folder does not exist"))
    try:
        a = analyse_folder(args.dir)
    except DumpError as err:
        _die(str(err))
    print(hang.as_json(a) if args.json else hang.text_report(a), end="\n" if args.json else "")
    if svg is not None:
        from preflight.core.fsutil import atomic_write_text
        from preflight.reporting.charts import to_svg
        from preflight.reporting.hang_charts import progress_grid

        atomic_write_text(svg, to_svg(progress_grid(a)))
        if not args.json:
            print(f"picture: {svg.resolve()}")
    return 0


def cmd_validate(args) -> int:
    import yaml

    from preflight.core.profile import ProfileError, load_profile

    try:
        profile = load_profile(args.profile)
    except ProfileError as err:
        _die(str(err))
    print(yaml.safe_dump(profile.model_dump(), sort_keys=False), end="")
    print(f"# ok: {profile.gpus} GPUs, data-parallel size {profile.dp}")
    return 0


def cmd_chips(_args) -> int:
    from preflight.core.hardware import table

    print(table().to_string())
    return 0


def cmd_shards(args) -> int:
    from preflight.toolkit import shards

    try:
        size = shards.parse_size(args.shard_size)
    except ValueError as err:
        _die(f"--shard-size = {args.shard_size!r}: {err}")
    if size > 100 * 1000**3:
        _die(f"--shard-size = {args.shard_size!r}: {size} bytes; accepted range is 1 byte to 100GB")
    src, dst = Path(args.src), Path(args.dst)
    if not src.is_dir():
        _die(f"SRC_DIR = {args.src!r}: {'not a folder' if src.exists() else 'no such folder'}")
    if dst.exists() and not dst.is_dir():
        _die(f"DST_DIR = {args.dst!r}: exists and is not a folder")
    seen = {"shards": 0, "bytes": 0}

    def progress(done, total, shards_done):
        while seen["shards"] < shards_done:        # one stat per finished shard
            seen["bytes"] += (dst / shards.shard_name(seen["shards"])).stat().st_size
            seen["shards"] += 1
        print(f"  {shards_done} shards, {done}/{total} samples, {seen['bytes'] / 1e6:.1f} MB written",
              file=sys.stderr, flush=True)

    try:
        r = shards.convert(src, dst, size, force=args.force, progress=None if args.quiet else progress)
    except shards.ShardError as err:
        _die(str(err))
    except OSError as err:
        _die(f"{err.filename or args.dst}: {err.strerror or err}")
    if r["resumed_shards"] and not args.quiet:
        print(f"  resumed: kept {r['resumed_shards']} finished shards of an interrupted run", file=sys.stderr)
    if size < 64 * 1000**2 and r["shards"] > 1 and not args.quiet:
        print(f"note: {size / 1e6:.3g} MB shards; on a parallel file system keep files at 64 MB or more "
              "(200-500 MB advised)", file=sys.stderr)
    print(f"{r['samples']} samples in {r['shards']} shards ({r['bytes'] / 1e6:.1f} MB) -> {r['dst']} (verified)")
    return 0


def cmd_compare(args) -> int:
    from preflight.reporting import compare
    from preflight.reporting.report import FindingsError, load_findings

    audits = []
    for label, path in (("OLD_DIR", args.old), ("NEW_DIR", args.new)):
        try:
            audits.append(load_findings(path))
        except FindingsError as err:
            _die(f"{label}: {err}")
    old, new = audits
    out = Path(args.out) if args.out else compare.audit_folder(args.new)
    if out.exists() and not out.is_dir():
        _die(f"--out = {args.out!r}: exists and is not a folder")
    try:
        page = compare.write_compare(old, new, args.old, args.new, out)
    except OSError as err:
        _die(f"--out = {str(out)!r}: cannot write compare.html ({err.strerror or err})")
    for w in compare.warnings(old, new):
        print(f"warning: {w}", file=sys.stderr)
    print(compare.text_report(old, new, str(compare.audit_folder(args.old)), str(compare.audit_folder(args.new))),
          end="")
    print(f"compare: {page.resolve()}")
    if args.fail_on_regression:
        found = compare.regressions(old, new)
        for fid_, why in found:
            print(f"regression: {fid_}: {why}")
        return 1 if found else 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:   # argparse's parse_args would say "unrecognized arguments" without a suggestion
        sub = args._commands[args.command]
        sub.error(f"unrecognized arguments: {' '.join(extra)}{_unknown_options_hint(extra, sub, parser)}")
    try:
        return {"audit": cmd_audit, "check": cmd_check, "advise": cmd_advise, "traces": cmd_traces,
                "hang": cmd_hang, "validate": cmd_validate, "chips": cmd_chips,
                "shards": cmd_shards,
                "compare": cmd_compare}[args.command](args)
    except BrokenPipeError:     # `preflight compare A B | head`: the reader left early, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:   # Ctrl-C outside run_audit (which exits 130 itself)
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def run() -> int:
    """The ``preflight`` command's process: ``main()``, then its objects are frozen out of the garbage
    collector, since the process ends next and its final collection of every object of pandas,
    altair, IPython and nbconvert took 0.25 s of a 3.6 s plan-only audit (2-core box, 2026-12-05).
    Only for a process that ends: ``main()`` called in a longer-lived one (the tests) is left as is."""
    import gc

    try:
        return main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    raise SystemExit(run())
