#!/usr/bin/env python3
"""The OCI image (deploy/oci/Containerfile) and the trial overlay of
deploy/kubernetes/, run with podman on this machine:

  1. scripts/image.sh prebuilt packages the build's epd-encode and default
     model into the runtime stage (no second compile) and builds the router
     and Redis images, all on the mmdebstrap base (cached under the build);
  2. the encoder image: every library its binary needs is in it, it runs as
     the non-root user, and a container of it, run as is, reports SERVING to
     its HEALTHCHECK, encodes an image and answers the repeat from its cache;
  3. `podman kube play` of the rendered trial overlay (encoder, router,
     Redis), on host networking with free loopback ports in place of the
     manifests' fixed ones: a real encode through the router succeeds, a
     repeat is an L1 hit on the same server, and the value reached the
     in-cluster Redis (the L3).

Everything it starts is removed at the end (podman kube down, podman rm).
Exit 77 (CTest SKIP_RETURN_CODE) when podman, mmdebstrap or kubectl are
missing or podman cannot run a container here (scripts/install-deps.sh
image; docs/DEPLOY.md).
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("EPD_BUILD_DIR", os.path.join(REPO, "build"))
EPD = os.environ.get("EPD_ENCODE_BIN", os.path.join(BUILD, "tools", "epd-encode"))
ENV = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF",
                                                      os.path.join(REPO, "deploy", "oci", "containers.conf")))
SUFFIX = f"oci-test-{os.getpid()}"


def skip(why):
    print(f"SKIP: {why}", file=sys.stderr)
    sys.exit(77)


def run(*cmd, check=True, timeout=600, **kw):
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        return re.search(r"project\(epd_encode VERSION ([0-9.]+)", f.read()).group(1)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(what, fn, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while True:
        result = fn()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def sources(client_stdout):
    return re.findall(r"source=(\S+)", client_stdout)


def check_preconditions():
    for tool in ("podman", "mmdebstrap", "kubectl"):
        if shutil.which(tool) is None:
            skip(f"{tool} not found (scripts/install-deps.sh image)")
    if not os.access(EPD, os.X_OK):
        skip(f"{EPD} not built")
    r = run("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    if r.returncode != 0:
        skip(f"podman cannot run here: {r.stderr.strip()[-500:]}")


def write_png(path, seed):
    from PIL import Image  # python3-pil, in the demo group

    img = Image.new("RGB", (112, 84))
    img.putdata([((x * 7 + seed) % 256, (y * 5 + seed * 3) % 256, (x * y + seed) % 256)
                 for y in range(84) for x in range(112)])
    img.save(path)


def check_encoder_image(image, png):
    """The image as built: libraries, user, HEALTHCHECK, an encode and a hit."""
    ldd = run("podman", "run", "--rm", "--entrypoint", "/usr/bin/ldd", image, "/opt/epd/bin/epd-encode").stdout
    assert "not found" not in ldd, ldd
    assert "libtorch.so" in ldd
    inspect = run("podman", "image", "inspect", "--format", "{{.Config.User}} {{json .Config.Healthcheck.Test}}",
                  image).stdout
    assert inspect.startswith("10001:10001 "), inspect
    assert '"health"' in inspect, inspect
    name = f"epd-encoder-{SUFFIX}"
    run("podman", "run", "-d", "--name", name, image)
    try:
        wait_for("the container's HEALTHCHECK", lambda: run("podman", "healthcheck", "run", name,
                                                            check=False).returncode == 0)
        assert run("podman", "exec", name, "epd-encode", "health").stdout.strip() == "SERVING"
        assert run("podman", "exec", name, "id", "-u").stdout.strip() == "10001"
        run("podman", "cp", png, f"{name}:/tmp/one.png")
        first = run("podman", "exec", name, "epd-encode", "client", "--server", "127.0.0.1:50051", "/tmp/one.png").stdout
        again = run("podman", "exec", name, "epd-encode", "client", "--server", "127.0.0.1:50051", "/tmp/one.png").stdout
        assert sources(first) == ["miss"], first
        assert sources(again) == ["l1"], again
    finally:
        run("podman", "rm", "-f", "-t", "5", name, check=False)


def play_file(tmp, ports):
    """The trial overlay, rendered, with free ports on host networking."""
    grpc, metrics, redis, router, health = ports
    out = run("kubectl", "kustomize", os.path.join(REPO, "deploy", "kubernetes", "overlays", "trial")).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    for d in docs:
        d["metadata"]["name"] += f"-{SUFFIX}"
        del d["metadata"]["namespace"]
        spec = d["spec"]["template"]["spec"]
        spec["hostNetwork"] = True
        c = spec["containers"][0]
        del c["ports"]  # podman maps container ports only off the host network
        for probe in ("readinessProbe", "livenessProbe"):
            for kind in ("grpc", "tcpSocket", "httpGet"):
                if kind in c.get(probe, {}):
                    c[probe][kind]["port"] = {"encoder": grpc, "router": health, "redis": redis}[c["name"]]
        if c["name"] == "encoder":
            swap = {"--port=": grpc, "--metrics-port=": metrics, "--l3=": f"redis://127.0.0.1:{redis}"}
            c["args"] = [next((k + str(v) for k, v in swap.items() if a.startswith(k)), a) for a in c["args"]]
        elif c["name"] == "redis":
            c["args"][c["args"].index("--port") + 1] = str(redis)
        else:
            env = {"EPD_ENCODERS": "localhost", "EPD_ENCODER_PORT": str(grpc), "EPD_ROUTER_PORT": str(router),
                   "EPD_HEALTH_PORT": str(health), "EPD_REFRESH_S": "1"}
            c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    path = os.path.join(tmp, "trial.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f)
    return path


def check_kube_play(tmp, png):
    ports = free_ports(5)
    grpc, _, redis, router, _ = ports
    path = play_file(tmp, ports)
    run("podman", "kube", "play", path, timeout=300)
    try:
        wait_for("the encoder", lambda: run(EPD, "health", "--server", f"127.0.0.1:{grpc}",
                                            check=False).returncode == 0)
        first = wait_for("an encode through the router", lambda: run(
            EPD, "client", "--server", f"127.0.0.1:{router}", png, check=False).stdout)
        again = run(EPD, "client", "--server", f"127.0.0.1:{router}", png).stdout
        assert sources(first) == ["miss"], first
        assert sources(again) == ["l1"], again
        servers = set(re.findall(r"server=(\S+)", first + again))
        assert len(servers) == 1, servers
        keys = wait_for("the L3 write-back", lambda: int(run("redis-cli", "-p", str(redis), "dbsize").stdout or 0))
        assert keys >= 1, keys
    finally:
        r = run("podman", "kube", "down", path, check=False, timeout=120)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)


def main():
    check_preconditions()
    start = time.monotonic()
    run(os.path.join(REPO, "scripts", "image.sh"), "prebuilt", BUILD, timeout=1500)
    print(f"images built in {time.monotonic() - start:.0f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "one.png")
        write_png(png, 7)
        check_encoder_image(f"localhost/epd-encode:{version()}", png)
        print("image run: SERVING, a miss, then an l1 hit", file=sys.stderr)
        check_kube_play(tmp, png)
        print("kube play: miss then l1 through the router, the value in Redis", file=sys.stderr)
    print(f"done in {time.monotonic() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
