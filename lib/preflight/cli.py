"""Command line: ``python -m preflight audit PROFILE ...`` and friends.

Exit codes: 0 ran; 1 a chapter errored (or a verdict at/above ``--fail-on``); 2 bad input (profile,
argument, path), reported in one message naming the field, with nothing written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same format and exit code as ours
        self.print_usage(sys.stderr)
        _die(f"{self.prog}: {message}")


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="preflight", description="Preflight: audit a training project for the five "
                                              "pitfalls of scaling on HPC clusters.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    a = sub.add_parser("audit", help="run the chapters on a profile and write the report")
    a.add_argument("profile", help="project profile (YAML), e.g. data/profiles/example.yaml")
    a.add_argument("--out", help="output folder (default reports/<project>/)")
    a.add_argument("--plan-only", action="store_true", help="formulas only, no live measurement")
    a.add_argument("--chapters", help="comma-separated chapter numbers, e.g. 1,3 (default: all)")
    a.add_argument("--timeout", type=_timeout, default=600,  # = audit.DEFAULT_TIMEOUT_S (import-light CLI)
                   help="per-cell execution timeout, s (10-86400)")
    a.add_argument("--fail-on", choices=["warn", "fail"], help="exit 1 if any verdict reaches this level")
    a.add_argument("--results", help="folder of measurement records (JSON) to use instead of measuring")
    a.add_argument("--quick", action="store_true", help="smallest measurement sizes (smoke test)")
    a.add_argument("--playbook", help=argparse.SUPPRESS)  # tests: another notebook folder

    v = sub.add_parser("validate", help="check a profile and print it with defaults filled in")
    v.add_argument("profile")

    sub.add_parser("chips", help="print the hardware peak table")
    return p


def cmd_audit(args) -> int:
    from preflight import audit
    from preflight.profile import ProfileError, load_profile

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
    out = Path(args.out) if args.out else Path("reports") / profile.project
    if out.exists() and not out.is_dir():
        _die(f"--out = {args.out!r}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _die(f"--out = {str(out)!r}: cannot create the output folder ({err.strerror})")

    summary = audit.run_audit(profile, Path(args.profile).resolve(), out.resolve(), chapters=chapters,
                              playbook=playbook, plan_only=args.plan_only, results_dir=results,
                              timeout_s=args.timeout, quick=args.quick)
    for c in summary["chapters"]:
        print(f"  chapter {c['number']} {c['name']:<18} {c['status']:<6} {c['verdict']:<6} {c['elapsed_s']:>6.1f} s")
    print(f"report: {(out / 'index.html').resolve()}")
    return audit.exit_code(summary, args.fail_on)


def cmd_validate(args) -> int:
    import yaml

    from preflight.profile import ProfileError, load_profile

    try:
        profile = load_profile(args.profile)
    except ProfileError as err:
        _die(str(err))
    print(yaml.safe_dump(profile.model_dump(), sort_keys=False), end="")
    print(f"# ok: {profile.gpus} GPUs, data-parallel size {profile.dp}")
    return 0


def cmd_chips(_args) -> int:
    from preflight.hardware import table

    print(table().to_string())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"audit": cmd_audit, "validate": cmd_validate, "chips": cmd_chips}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
