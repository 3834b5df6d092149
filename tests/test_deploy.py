"""Container images and Kubernetes manifests: hadolint-clean, schema-valid, consistent with the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted((ROOT / "docker").glob("*/Dockerfile"))
MANIFESTS = sorted(p for p in (ROOT / "deploy" / "kubernetes").glob("*.yaml") if p.name != "kustomization.yaml")


def tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is not installed (it is in the test extras)")
    return found


def test_there_is_an_image_per_device_class():
    assert {p.parent.name for p in DOCKERFILES} == {"cpu", "cuda", "rocm"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile):
    result = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = dockerfile.read_text()
    assert "ARG BASE_IMAGE=" in text and "FROM ${BASE_IMAGE} AS build" in text and "FROM ${BASE_IMAGE} AS runtime" in text
    runtime_stage = text.split("AS runtime", 1)[1]
    assert "USER 10001" in runtime_stage and "gcc" not in runtime_stage and "build-essential" not in runtime_stage
    assert "/health/live" in runtime_stage and "VLLM_SR_RUNTIME_CACHE_DIR" in runtime_stage
    assert '"serve", "--host", "0.0.0.0", "--port", "8100"' in runtime_stage
    # OpenShift's arbitrary uid (group 0) must be able to write the cache (first-use downloads, exports) and home
    assert "chgrp -R 0 /var/cache/vllm-sr-runtime /home/sr" in runtime_stage and "chmod -R g=u /var/cache/vllm-sr-runtime /home/sr" in runtime_stage


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    assert subprocess.run([tool("hadolint"), str(bad)], capture_output=True).returncode != 0


def test_manifests_validate_against_the_kubernetes_schema():
    result = subprocess.run([tool("kubernetes-validate"), "--strict", *map(str, MANIFESTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_validation_can_fail(tmp_path):
    broken = tmp_path / "deployment.yaml"
    document = yaml.safe_load((ROOT / "deploy/kubernetes/deployment.yaml").read_text())
    document["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {"not": "a port"}
    broken.write_text(yaml.safe_dump(document))
    assert subprocess.run([tool("kubernetes-validate"), "--strict", str(broken)], capture_output=True).returncode != 0


def documents():
    for path in MANIFESTS:
        yield from (doc for doc in yaml.safe_load_all(path.read_text()) if doc)


def test_deployments_fit_the_runtime():
    from vllm_sr_runtime.cli import build_parser
    from vllm_sr_runtime.server.config import DEFAULT_DEADLINE_MS

    deployments = [d for d in documents() if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"vllm-sr-runtime", "vllm-sr-runtime-cuda", "vllm-sr-runtime-rocm"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        container = pod["spec"]["containers"][0]
        args = build_parser().parse_args(["serve", *container["args"]])  # every flag is one serve accepts
        assert args.offline
        # a thread for every request the queues hold, and more: the liveness probe never waits behind forwards
        assert args.threads is None or args.threads > args.max_queue, args.threads
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
        assert container["ports"][0]["containerPort"] == 8100
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert pod["spec"]["terminationGracePeriodSeconds"] > (args.deadline_ms or DEFAULT_DEADLINE_MS) / 1000 + args.graceful_timeout
        assert "requests" in container["resources"] and "limits" in container["resources"]
        gpu = {"vllm-sr-runtime-cuda": "nvidia.com/gpu", "vllm-sr-runtime-rocm": "amd.com/gpu"}.get(deployment["metadata"]["name"])
        if gpu:
            assert container["resources"]["limits"][gpu] == "1"


def test_configmap_models_file_parses(tmp_path):
    from vllm_sr_runtime.server.config import load_models_file

    config = next(d for d in documents() if d["kind"] == "ConfigMap")
    models = tmp_path / "models.yaml"
    models.write_text(config["data"]["models.yaml"])
    specs = load_models_file(str(models))
    assert specs[0].name == "d3-lite" and specs[0].artifact.startswith("/models/")


def test_service_and_autoscaler_point_at_the_deployment():
    kinds = {d["kind"]: d for d in documents()}
    assert kinds["Service"]["spec"]["ports"][0]["port"] == 8100
    assert kinds["Service"]["spec"]["selector"] == {"app.kubernetes.io/name": "vllm-sr-runtime"}
    assert kinds["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == "vllm-sr-runtime"
