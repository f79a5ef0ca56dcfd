from preflight.cli import run

raise SystemExit(run())
