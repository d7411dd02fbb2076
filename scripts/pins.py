"""Print requirements.txt's pins that apply to one Python version, one per line (``name==version``).

    python scripts/pins.py [--python 3.12] [NAME ...]      # default: this interpreter's version; all names

requirements.txt pins some packages per Python with environment markers; pip evaluates them for the interpreter
it runs in, while .ci/run (test tools for another venv) and scripts/device_bundle.sh (wheels for another machine's
Python) need them for a given version. Runs on the standard library and ``packaging`` (which pip vendors).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=".".join(platform.python_version_tuple()[:2]))
    parser.add_argument("names", nargs="*", help="only these distributions")
    args = parser.parse_args()
    wanted = {canonicalize_name(name) for name in args.names}
    for line in REQUIREMENTS.read_text().splitlines():
        text = line.partition("#")[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        applies = requirement.marker is None or requirement.marker.evaluate({"python_version": args.python})
        if applies and (not wanted or canonicalize_name(requirement.name) in wanted):
            print(f"{requirement.name}{requirement.specifier}")


if __name__ == "__main__":
    main()
