#!/usr/bin/env python3
"""deploy/kubernetes/: both overlays render with `kubectl kustomize` and every
object reads strictly into the official Kubernetes client's typed models
(tests/deploy/k8s_strict.py), and the settings that must agree do agree:
probes on the server's gRPC port, a termination grace period longer than
preStop + --grace-s + the server's 1 s backstop, the router following the
headless Service of the encoders, the HPA's metric a series the server
exports, the L3 flags of each overlay, the image tags the project version.
A misspelled and a mistyped field are shown to fail.

Exit 77 (CTest SKIP_RETURN_CODE) when kubectl or python3-kubernetes is
missing (scripts/install-deps.sh image installs both).
"""

import copy
import os
import re
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(REPO, "deploy", "kubernetes")
sys.path.insert(0, HERE)

try:
    import yaml
    import k8s_strict
except ImportError as e:  # python3-kubernetes (or python3-yaml) missing
    print(f"SKIP: {e}; scripts/install-deps.sh image installs python3-kubernetes", file=sys.stderr)
    sys.exit(77)

KUBECTL = shutil.which("kubectl")
if KUBECTL is None:
    print("SKIP: no kubectl on PATH; scripts/install-deps.sh image installs kubernetes-client", file=sys.stderr)
    sys.exit(77)


def project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        return re.search(r"project\(epd_encode VERSION ([0-9.]+)", f.read()).group(1)


def render(overlay):
    out = subprocess.run([KUBECTL, "kustomize", os.path.join(K8S, "overlays", overlay)], check=True,
                         capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind_name(docs):
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def container(deployment, name):
    cs = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(cs) == 1, f"container {name} in {deployment['metadata']['name']}"
    return cs[0]


def flag(args, name):
    """The value of --name=V in args (None when absent)."""
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = {o: render(o) for o in ("trial", "fleet")}

    def test_every_object_reads_into_the_typed_models(self):
        for overlay, docs in self.rendered.items():
            for d in docs:
                model = k8s_strict.load(d, f"overlay {overlay}")
                self.assertEqual(model.metadata.name, d["metadata"]["name"])
        examples = [os.path.join(K8S, "examples", "vllm-ec-shared-volume.yaml"),
                    os.path.join(K8S, "overlays", "fleet", "l3-secret.example.yaml")]
        for path in examples:
            with open(path) as f:
                for d in yaml.safe_load_all(f):
                    k8s_strict.load(d, path)

    def test_overlays_hold_the_expected_objects(self):
        common = {("Deployment", "epd-encoder"), ("Deployment", "epd-router"), ("Service", "epd-encoder"),
                  ("Service", "epd-encoder-headless"), ("Service", "epd-router"),
                  ("HorizontalPodAutoscaler", "epd-encoder")}
        trial = common | {("Namespace", "epd-trial"), ("Deployment", "epd-redis"), ("Service", "epd-redis")}
        self.assertEqual(set(by_kind_name(self.rendered["trial"])), trial)
        self.assertEqual(set(by_kind_name(self.rendered["fleet"])), common)
        for d in self.rendered["fleet"]:
            self.assertEqual(d["metadata"]["namespace"], "epd")
        for d in self.rendered["trial"]:
            if d["kind"] != "Namespace":
                self.assertEqual(d["metadata"]["namespace"], "epd-trial")

    def test_encoder_probes_and_drain_fit_the_server(self):
        for overlay, docs in self.rendered.items():
            dep = by_kind_name(docs)[("Deployment", "epd-encoder")]
            c = container(dep, "encoder")
            port = int(flag(c["args"], "port"))
            self.assertEqual(port, 50051)
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            self.assertEqual(ports["grpc"], port)
            self.assertEqual(ports["metrics"], int(flag(c["args"], "metrics-port")))
            self.assertEqual(c["readinessProbe"]["grpc"]["port"], port, overlay)
            self.assertEqual(c["livenessProbe"]["grpc"]["port"], port, overlay)
            self.assertIn("requests", c["resources"])
            sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
            grace = float(flag(c["args"], "grace-s"))
            # The server exits at most --grace-s + 1 s after SIGTERM (tools/exit_deadline.h).
            self.assertGreater(dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], sleep + grace + 1)
            self.assertEqual(c["image"], f"localhost/epd-encode:{project_version()}")

    def test_router_follows_the_headless_service_of_the_encoders(self):
        for overlay, docs in self.rendered.items():
            objs = by_kind_name(docs)
            headless = objs[("Service", "epd-encoder-headless")]
            self.assertEqual(headless["spec"]["clusterIP"], "None")
            pod_labels = objs[("Deployment", "epd-encoder")]["spec"]["template"]["metadata"]["labels"]
            for k, v in headless["spec"]["selector"].items():
                self.assertEqual(pod_labels[k], v, overlay)
            r = container(objs[("Deployment", "epd-router")], "router")
            env = {e["name"]: e.get("value") for e in r["env"]}
            self.assertEqual(env["EPD_ENCODERS"], "epd-encoder-headless")
            self.assertEqual(env["EPD_ENCODER_PORT"], str(headless["spec"]["ports"][0]["port"]))
            self.assertEqual(r["image"], f"localhost/epd-router:{project_version()}")

    def test_hpa_scales_on_a_series_the_server_exports(self):
        with open(os.path.join(REPO, "include", "epd", "core", "encode_types.h")) as f:
            stats_table = f.read()
        for docs in self.rendered.values():
            hpa = by_kind_name(docs)[("HorizontalPodAutoscaler", "epd-encoder")]
            self.assertEqual(hpa["spec"]["scaleTargetRef"]["name"], "epd-encoder")
            names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
            self.assertEqual(names, ["epd_queue_items"])
            self.assertIn('{"epd_queue_items"}', stats_table)

    def test_each_overlay_names_its_l3(self):
        trial = container(by_kind_name(self.rendered["trial"])[("Deployment", "epd-encoder")], "encoder")
        self.assertEqual(flag(trial["args"], "l3"), "redis://epd-redis:6379")
        redis = by_kind_name(self.rendered["trial"])[("Service", "epd-redis")]
        self.assertEqual(redis["spec"]["ports"][0]["port"], 6379)
        fleet_dep = by_kind_name(self.rendered["fleet"])[("Deployment", "epd-encoder")]
        fleet = container(fleet_dep, "encoder")
        self.assertEqual(flag(fleet["args"], "l3"), "$(EPD_L3_URL)")
        env = {e["name"]: e for e in fleet["env"]}
        self.assertEqual(env["EPD_L3_URL"]["valueFrom"]["secretKeyRef"], {"name": "epd-l3", "key": "l3-url"})
        mount = {m["name"]: m["mountPath"] for m in fleet["volumeMounts"]}["l3-secret"]
        self.assertEqual(os.path.dirname(flag(fleet["args"], "l3-key-file")), mount)
        vols = {v["name"]: v for v in fleet_dep["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(vols["l3-secret"]["secret"]["secretName"], "epd-l3")
        with open(os.path.join(K8S, "overlays", "fleet", "l3-secret.example.yaml")) as f:
            secret = yaml.safe_load(f)
        self.assertEqual(set(secret["stringData"]), {"l3-url", "l3.key", "auth-token"})
        self.assertTrue(secret["stringData"]["l3-url"].startswith("redis-cluster://"))

    def test_a_misspelled_field_fails(self):
        dep = copy.deepcopy(by_kind_name(self.rendered["trial"])[("Deployment", "epd-encoder")])
        c = dep["spec"]["template"]["spec"]["containers"][0]
        c["readinesProbe"] = c.pop("readinessProbe")
        with self.assertRaisesRegex(k8s_strict.ManifestError, r"containers\[0\]: unknown field 'readinesProbe'"):
            k8s_strict.load(dep)

    def test_a_mistyped_field_fails(self):
        docs = by_kind_name(self.rendered["fleet"])
        dep = copy.deepcopy(docs[("Deployment", "epd-encoder")])
        dep["spec"]["replicas"] = "four"
        with self.assertRaisesRegex(k8s_strict.ManifestError, r"spec\.replicas: expected int, got str 'four'"):
            k8s_strict.load(dep)
        dep = copy.deepcopy(docs[("Deployment", "epd-encoder")])
        dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"] = {"port": "grpc"}
        with self.assertRaisesRegex(k8s_strict.ManifestError, r"livenessProbe\.grpc\.port: expected int"):
            k8s_strict.load(dep)
        hpa = copy.deepcopy(docs[("HorizontalPodAutoscaler", "epd-encoder")])
        hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = 32
        with self.assertRaisesRegex(k8s_strict.ManifestError, r"averageValue: expected str, got int"):
            k8s_strict.load(hpa)

    def test_a_missing_required_field_fails(self):
        dep = copy.deepcopy(by_kind_name(self.rendered["fleet"])[("Deployment", "epd-router")])
        del dep["spec"]["template"]["spec"]["containers"][0]["name"]
        with self.assertRaisesRegex(k8s_strict.ManifestError, r"name.*must not be `None`"):
            k8s_strict.load(dep)


if __name__ == "__main__":
    unittest.main()
