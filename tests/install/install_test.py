"""ctest install_test: `cmake --install` into a temporary prefix, then use it
as a user would.

  install_test.py BUILD_DIR SOURCE_DIR 'core headers;...'

1. installs BUILD_DIR into a fresh prefix;
2. configures (Ninja) and builds tests/install/consumer against it with
   find_package(epd <version> EXACT CONFIG REQUIRED) and epd::core, runs it
   and checks what it prints;
3. builds the same program with only `pkg-config --cflags --libs epd`;
4. runs the installed `epd-encode --version`;
5. imports the installed Python package from the prefix (not the build
   tree) and checks epd.__version__ and a cache round trip.
The expected version is read from the top-level CMakeLists.txt's project().
Exits 0 on success; prints what differs otherwise.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAILED ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def expect(what, got, want):
    if got != want:
        sys.exit(f"FAILED: {what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def main():
    build, source, core_headers = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    text = (source / "CMakeLists.txt").read_text()
    version = re.search(r"^project\(epd_encode VERSION ([0-9.]+)", text, re.M).group(1)
    cache = (build / "CMakeCache.txt").read_text()

    with tempfile.TemporaryDirectory(prefix="epd-install-") as tmp:
        prefix = Path(tmp) / "prefix"
        run(["cmake", "--install", str(build), "--prefix", str(prefix)])

        consumer = Path(tmp) / "consumer"
        run(["cmake", "-S", str(source / "tests/install/consumer"), "-B", str(consumer), "-G", "Ninja",
             f"-DCMAKE_PREFIX_PATH={prefix}", f"-DEPD_EXPECT_VERSION={version}",
             f"-DEPD_CORE_HEADERS={core_headers}", "-DCMAKE_BUILD_TYPE=Release"])
        run(["cmake", "--build", str(consumer), "-j", "2"])
        out = run([str(consumer / "app")]).splitlines()
        expect("find_package consumer's output", out, [version, "RESOURCE_EXHAUSTED: pinned pool full"])

        pc = run(["pkg-config", "--cflags", "--libs", "epd"],
                 env={**os.environ, "PKG_CONFIG_PATH": str(next(prefix.glob("lib*/pkgconfig")))}).split()
        app_pc = Path(tmp) / "app_pc"
        cxx = os.environ.get("CXX") or shutil.which("c++")
        run([cxx, "-o", str(app_pc), str(source / "tests/install/consumer/main.cc"), *pc])
        out = run([str(app_pc)]).splitlines()
        expect("pkg-config consumer's output", out, [version, "RESOURCE_EXHAUSTED: pinned pool full"])

        cli = prefix / "bin" / "epd-encode"
        if cli.exists():
            expect("epd-encode --version", run([str(cli), "--version"]).strip(), f"epd-encode {version}")
            if "EPD_WITH_TORCH:BOOL=ON" in cache:
                model = prefix / "share/epd/models/default_tower.pt"
                expect("installed default tower", model.is_file(), True)

        pydir = re.search(r"^EPD_INSTALL_PYTHONDIR:STRING=(.*)$", cache, re.M)
        if pydir:
            py = ("import epd, pathlib, sys\n"
                  "c = epd.EmbeddingCache(250)\n"
                  "c.put('a', 'A', 100); c.put('b', 'B', 100); c.get('a'); c.put('c', 'C', 100)\n"
                  "print(epd.__version__, pathlib.Path(epd.__file__).resolve(), sorted(k for k in 'abc' if k in c))\n")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = str(prefix / pydir.group(1))
            got_version, got_file, got_keys = run([sys.executable, "-c", py], env=env, cwd=tmp).split(" ", 2)
            expect("epd.__version__", got_version, version)
            expect("epd imported from the prefix", got_file.startswith(str(prefix.resolve())), True)
            # LRU over 250 bytes: a, b in; a touched; c evicts b.
            expect("installed EmbeddingCache evicts the least recently used", got_keys.strip(), "['a', 'c']")
    print("install test: ok")


if __name__ == "__main__":
    main()
