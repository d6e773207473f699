"""ctest install_test: `cmake --install` into a temporary prefix, then use it
as a user would.

  install_test.py BUILD_DIR SOURCE_DIR 'core headers;...'

1. installs BUILD_DIR into a fresh prefix;
2. configures (Ninja) and builds tests/install/consumer against it with
   find_package(epd <version> EXACT CONFIG REQUIRED) and epd::core, runs it
   and checks what it prints;
3. builds the same program with only `pkg-config --cflags --libs epd`;
4. runs the installed `epd-encode --version`; with torch, checks that the
   default model (the Qwen2.5-VL checkpoint directory) is installed, that
   the installed binary takes it as its --model default, and replays two
   requests with it;
5. imports the installed Python package from the prefix (not the build
   tree) and checks epd.__version__ and a cache round trip; with grpc,
   imports each public name of the client package epd.client and checks
   that all its modules and the service config come from the prefix.
The expected version is read from the top-level CMakeLists.txt's project().
Exits 0 on success; prints what differs otherwise.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import pngs  # noqa: E402


# What users and the tests import from epd.client (the package's public
# names, each imported by name from the installed package) and the modules
# that package is made of.
CLIENT_NAMES = ["CudaIpcLease", "CudaIpcRef", "EncodeClient", "EncodeError", "EncodeResult", "Item", "ItemResult",
                "KEY_VERSION", "PreprocessConfig", "ProbeResult", "ROUTE_HEADER", "SESSION_HEADER", "SESSION_RETRY_S",
                "ServerInfo", "ShmLease", "VideoSampling", "caller_content_key", "content_key", "to_vllm_batch",
                "video_key"]
CLIENT_MODULES = ["__init__.py", "_client.py", "_keys.py", "_lease_types.py", "_leases.py", "_proto.py", "_results.py",
                  "_routing.py"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAILED ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def expect(what, got, want):
    if got != want:
        sys.exit(f"FAILED: {what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def write_png(path, width, height):
    """An RGB PNG written by hand (tests/python/pngs.py): no imaging library needed."""
    path.write_bytes(pngs.encode_png(width, height, pngs.rows_of(width, height, lambda x, y: ((x * 9 + y * 3) % 256,) * 3)))


def check_default_model(cli, model_dir, tmp):
    for name in ("config.json", "preprocessor_config.json", "model.safetensors"):
        expect(f"installed default model's {name}", (model_dir / name).is_file(), True)
    # The installed binary resolves its default relative to itself, so the
    # --model default its help shows is the installed directory.
    help_text = run([str(cli), "replay", "--help"])
    expect("installed epd-encode's --model default is the installed checkpoint",
           str(model_dir.resolve()) in help_text, True)
    config = json.loads((model_dir / "config.json").read_text())
    expect("default model's model_type", config["model_type"], "qwen2_5_vl")
    images = tmp / "images"
    images.mkdir()
    write_png(images / "a.png", 56, 84)  # 2 x 3 merged patches of 28 px: 6 tokens
    j = json.loads(run([str(cli), "replay", "--images", str(images), "--generate", "2", "--threads", "1",
                        "--json"]))
    expect("replay with the installed default model: items", j["items"] >= 2, True)
    expect("replay with the installed default model: tower tokens", j["tower_tokens"], 6)


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
                expect("installed TorchScript default tower", model.is_file(), True)
                check_default_model(cli, prefix / "share/epd/models/default-qwen2_5_vl", Path(tmp))

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
            # The gRPC client, when this Python has grpc: the package
            # epd.client imports from the prefix with every public name, and
            # with the module generated from Encode's service config (retry
            # policy), which must be installed with it and say what the JSON
            # file says.
            client_py = ("import json, pathlib, sys\n"
                         "try:\n"
                         "    import grpc  # noqa: F401\n"
                         "except ImportError:\n"
                         "    print('no-grpc'); raise SystemExit\n"
                         f"from epd.client import {', '.join(CLIENT_NAMES)}\n"
                         "import epd.client, epd._service_config as sc\n"
                         "files = sorted(str(pathlib.Path(m.__file__).resolve()) for n, m in sys.modules.items()\n"
                         "               if n == 'epd.client' or n.startswith('epd.client.'))\n"
                         "print(json.dumps({'config_file': str(pathlib.Path(sc.__file__).resolve()),\n"
                         "                  'config': json.loads(sc.ENCODER_SERVICE_CONFIG), 'files': files,\n"
                         "                  'alias': EncodeResult is ItemResult,\n"
                         "                  'all': sorted(epd.client.__all__)}))\n")
            got = (run([sys.executable, "-c", client_py], env=env, cwd=tmp).strip()
                   if (build / "python" / "epd" / "v1").is_dir() else "no-grpc")
            if got != "no-grpc":
                got = json.loads(got)
                expect("epd._service_config imported from the prefix",
                       got["config_file"].startswith(str(prefix.resolve())), True)
                want = json.loads((source / "proto/epd/v1/encoder_service_config.json").read_text())
                expect("installed Encode service config", got["config"], want)
                pkg = (prefix / pydir.group(1) / "epd" / "client").resolve()
                expect("epd.client's modules, all imported from the installed package",
                       [Path(f).relative_to(pkg).as_posix() if Path(f).is_relative_to(pkg) else f
                        for f in got["files"]], CLIENT_MODULES)
                expect("no single-module client.py installed beside the package",
                       (prefix / pydir.group(1) / "epd" / "client.py").exists(), False)
                expect("epd.client.EncodeResult is ItemResult", got["alias"], True)
                expect("epd.client.__all__", got["all"], sorted(CLIENT_NAMES))
    print("install test: ok")


if __name__ == "__main__":
    main()
