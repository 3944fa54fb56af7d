"""Compile the detection core (streams/core) with mypyc into .native/; a no-op when built.

    python scripts/build_native.py [--force]

The build is used only while its manifest matches the sources (`streams.core.native`), so
an edited module runs as Python until this runs again. Built in a scratch folder and moved
into place whole: a process starting meanwhile runs the pure core, never half a build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.core import native  # noqa: E402 -- the tree this script builds

SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

paths, group, out, temp = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
setup(
    name="c4-native-core",
    ext_modules=mypycify(paths, group_name=group, target_dir=temp + "/c", opt_level="3"),
    script_args=["build_ext", "--build-lib", out, "--build-temp", temp],
)
"""


def build(force: bool) -> int:
    target = native.native_dir()
    want = native.fingerprint()
    if not force and native.build_status() == "compiled":
        print(f"compiled core up to date in {target}")
        return 0
    sources = [str(p.relative_to(ROOT)) for p in native.compiled_sources()]
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".native-build-", dir=target.parent))
    try:
        out, temp = scratch / "out", scratch / "temp"
        result = subprocess.run(  # noqa: S603 -- this interpreter, our own setup script
            [sys.executable, "-c", SETUP, ",".join(sources), native.GROUP, str(out), str(temp)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
            print(f"build_native: mypyc failed: {' '.join(tail)}", file=sys.stderr)
            return 1
        (out / native.MANIFEST).write_text(json.dumps({"fingerprint": want}, indent=1))
        old = target.with_name(f"{target.name}.old-{os.getpid()}")
        if target.exists():
            target.rename(old)
        out.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"compiled core built in {target} ({len(sources)} modules)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    return build(parser.parse_args().force)


if __name__ == "__main__":
    sys.exit(main())
