"""Print the pinned requirements of pyproject.toml, one per line: the runtime set plus the test extra.

One home for the list that ``make wheelhouse`` downloads and ``make setup-keep-torch`` installs:

    python tools/pins.py                    # every pin (pip install -r / pip download -r)
    python tools/pins.py --without torch    # all but torch: keep a GPU image's own build
    python tools/pins.py --build            # plus setuptools and pip (an offline editable install)
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _name(requirement: str) -> str:
    """``torch==2.13.0`` -> ``torch`` (normalised: lower case, ``_`` as ``-``)."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pins(without: list[str] = (), build: bool = False) -> list[str]:
    """The pins, in pyproject order; ``ValueError`` naming a ``without`` entry that is not one."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["test"]
    drop = {_name(n) for n in without}
    unknown = drop - {_name(r) for r in reqs}
    if unknown:
        raise ValueError(f"--without {', '.join(sorted(unknown))}: not a requirement in {PYPROJECT.name} "
                         f"(accepted: {', '.join(_name(r) for r in reqs)})")
    return [r for r in reqs if _name(r) not in drop] + (["setuptools>=68", "pip"] if build else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--without", action="append", default=[], metavar="NAME", help="leave this package out")
    ap.add_argument("--build", action="store_true", help="add setuptools and pip")
    args = ap.parse_args(argv)
    try:
        print("\n".join(pins(args.without, args.build)))
    except ValueError as err:
        print(f"pins: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
