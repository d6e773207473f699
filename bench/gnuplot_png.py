"""Draws one PNG with gnuplot (Debian gnuplot-nox), for the benchmark report scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def render_png(png: str, script: str, files: dict[str, str], tag: str) -> bool:
    """Runs `script` with the pngcairo terminal writing `png`, in a temporary
    directory holding `files` (name -> text). Returns whether the PNG was
    written; on failure says why on stderr, prefixed with `tag`."""
    if shutil.which("gnuplot") is None:
        print(f"{tag}: gnuplot not found (Debian gnuplot-nox); no plots", file=sys.stderr)
        return False
    png = os.path.abspath(png)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        full = f'set terminal pngcairo size 960,540 noenhanced font ",10"\nset output "{png}"\n' + script
        r = subprocess.run(["gnuplot"], input=full.encode(), cwd=tmp, capture_output=True)
    if r.returncode != 0 or not os.path.isfile(png):
        print(f"{tag}: gnuplot failed for {os.path.basename(png)}: {r.stderr.decode(errors='replace')}", file=sys.stderr)
        return False
    return True
