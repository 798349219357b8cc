"""deploy/ against the image and the server: the Kubernetes manifests are valid for Kubernetes' own
schemas (kubernetes-validate: offline, strict, so a misspelt field fails too), their probes, drain,
GPU and volumes fit the Containerfile's image and parakeet-serve's flags; compose's file the same.
(The image itself is built and run in tests/test_container.py.)"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from parakeet_stream.server.cli import build_parser

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the test extra) is missing")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CONTAINERFILE = (ROOT / "Containerfile").read_text()
EXPOSED = {int(port) for port in re.search(r"^EXPOSE (.+)$", CONTAINERFILE, re.M).group(1).split()}
USER = re.search(r"^USER (\d+):(\d+)$", CONTAINERFILE, re.M).groups()
HF_HOME = re.search(r"\bHF_HOME=(\S+)", CONTAINERFILE).group(1)
TARGETS = set(re.findall(r"^FROM \S+ AS (\S+)$", CONTAINERFILE, re.M))
SERVER_GRACE_S = 5  # after the drain timeout the server finalizes the rest and exits within this


def manifests(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if doc]


def serving() -> tuple[dict, dict]:
    """The parakeet-serve Deployment's pod spec and its container."""
    deployment = next(doc for doc in manifests("parakeet-stream.yaml") if doc["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


# the oldest Kubernetes release whose schemas kubernetes-validate holds, and the newest
VERSIONS = [min(kubernetes_validate.utils.all_versions(), key=lambda v: tuple(map(int, v.split(".")))),
            kubernetes_validate.latest_version()]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["parakeet-stream.yaml", "haproxy.yaml"])
def test_manifests_are_valid_kubernetes(name, version):
    for doc in manifests(name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_an_invalid_manifest_is_refused():
    deployment = copy.deepcopy(manifests("parakeet-stream.yaml")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_deployment_runs_the_cuda_image_as_its_user_with_probes_and_a_gpu():
    pod, container = serving()
    assert container["image"].endswith(":cuda") and "cuda" in TARGETS
    assert "command" not in container  # the image's entrypoint, parakeet-serve, takes the args
    args = build_parser().parse_args(container["args"])
    assert args.device == "cuda" and args.agent_port == 8081
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert set(ports.values()) == EXPOSED | {args.agent_port}
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"} and ports["http"] == args.http_port
    assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert (str(pod["securityContext"]["runAsUser"]), str(pod["securityContext"]["runAsGroup"])) == USER
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert {mount["mountPath"] for mount in container["volumeMounts"]} == {HF_HOME, "/tmp"}


def test_termination_grace_covers_pre_stop_and_the_drain():
    pod, container = serving()
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = build_parser().parse_args(container["args"]).drain_timeout
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain + SERVER_GRACE_S


def test_haproxy_finds_the_replicas_on_their_ports():
    _, container = serving()
    args = build_parser().parse_args(container["args"])
    service = next(doc for doc in manifests("parakeet-stream.yaml") if doc["kind"] == "Service")
    assert {port["port"] for port in service["spec"]["ports"]} == {port["containerPort"] for port in container["ports"]}
    config = next(doc for doc in manifests("haproxy.yaml") if doc["kind"] == "ConfigMap")["data"]["haproxy.cfg"]
    host = f"{service['metadata']['name']}.default.svc.cluster.local"
    for port in (args.port, args.ws_port, args.http_port):
        assert f"{host}:{port} " in config
    assert f"check port {args.http_port} agent-check agent-port {args.agent_port}" in config


def test_compose_builds_the_image_and_stops_after_the_drain():
    service = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["parakeet"]
    assert service["build"]["target"] in TARGETS and (DEPLOY / service["build"]["context"] / "Containerfile").is_file()
    assert {int(mapping.rsplit(":", 1)[1]) for mapping in service["ports"]} == EXPOSED
    drain = float(service["environment"]["PARAKEET_DRAIN_TIMEOUT"])
    assert float(service["stop_grace_period"].removesuffix("s")) > drain + SERVER_GRACE_S
    assert service["read_only"] and service["tmpfs"] == ["/tmp"]
    assert [volume.split(":")[1] for volume in service["volumes"]] == [HF_HOME]
