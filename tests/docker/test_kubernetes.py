"""docker/kubernetes/: every manifest valid against the Kubernetes API schemas (kubernetes-validate, which
ships them: offline), strict (no unknown fields), for the oldest and newest versions it knows of ours; and
what the schemas cannot say: the restricted Pod Security profile, a stop grace above chatgate's shutdown
grace, probe timeouts, resources that fit the checker pool, selectors that meet, no example secret."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from chatgate.gateway.checking import checker_count
from chatgate.settings import ServerSettings, load_settings
from tests.ci import missing
from tests.harness import REPO_ROOT

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - in the test extras
    kubernetes_validate = None

FOLDER = REPO_ROOT / "docker" / "kubernetes"
VERSIONS = ("1.30.0", "1.37.0")


def validator() -> None:
    if kubernetes_validate is None:
        missing("kubernetes-validate is not installed (in the test extras)")


def manifests() -> list[Path]:
    return sorted(p for p in FOLDER.glob("*.yaml") if p.name != "kustomization.yaml")


def resources() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[doc["kind"]] = doc
    return out


def quantity(text: str) -> float:
    """A Kubernetes quantity: cpu ("2", "500m") in cores, memory ("512Mi") in MiB."""
    m = re.fullmatch(r"([\d.]+)(m|Mi|Gi)?", str(text))
    assert m, text
    value, unit = float(m.group(1)), m.group(2)
    return {None: value, "m": value / 1000, "Mi": value, "Gi": value * 1024}[unit]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_manifest_is_valid_against_the_kubernetes_schema(path: Path, version: str) -> None:
    validator()
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_sees_a_bad_manifest() -> None:
    validator()
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"selector": {}, "replicas": "three",
                    "template": {"spec": {"containers": [{"name": "c", "imagePullPolicy": 3}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    unknown = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest_and_there_is_no_secret() -> None:
    listed = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == [p.name for p in manifests()]
    kinds = set(resources())
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy",
            "ConfigMap"} <= kinds
    # The Secret is created by a command that generates the admin key (docs/production.md#kubernetes):
    # an example file with a placeholder key gets applied as is.
    assert "Secret" not in kinds
    for path in FOLDER.glob("*"):
        assert "change-me" not in path.read_text(), path
    docs = (REPO_ROOT / "docs" / "production.md").read_text()
    assert "kubectl -n chatgate create secret generic chatgate" in docs
    assert re.search(r"CHATGATE_ADMIN_KEY=\"?\$\(openssl rand -hex 32\)", docs)


def pod() -> dict[str, Any]:
    spec: dict[str, Any] = resources()["Deployment"]["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    [c] = pod()["containers"]
    assert isinstance(c, dict)
    return c


def test_restricted_pod_security_profile() -> None:
    """What the "restricted" profile demands, at pod and container level, and a read-only root fs."""
    pod_ctx, ctx = pod()["securityContext"], container()["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] == 10001
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx.get("runAsNonRoot", True) is True and ctx.get("privileged", False) is False
    assert pod().get("hostNetwork", False) is False
    for volume in pod()["volumes"]:
        assert set(volume) - {"name"} <= {"configMap", "emptyDir", "secret", "persistentVolumeClaim",
                                          "projected", "downwardAPI", "ephemeral", "csi"}


def test_stop_grace_covers_the_prestop_pause_and_the_shutdown_grace() -> None:
    pre_stop = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pause = float(pre_stop[1])
    assert pause >= 3
    grace = pod()["terminationGracePeriodSeconds"]
    assert grace > pause + ServerSettings().shutdown_grace_seconds


def test_probes_have_the_images_timeout() -> None:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container()[kind]
        assert probe["timeoutSeconds"] >= 5, kind
        assert probe["httpGet"]["port"] == "http"
    assert container()["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container()["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_resources_fit_the_checker_pool_the_cpu_limit_makes() -> None:
    """Measured by the container check: ~65 MiB idle, ~190-200 MiB with the tokenizer, ~70 MiB per
    checker process; the limit leaves room for the bodies in flight."""
    res = container()["resources"]
    cpu = quantity(res["limits"]["cpu"])
    checkers = checker_count(math.ceil(cpu))
    memory = quantity(res["limits"]["memory"])
    assert memory >= 256 + 128 * checkers, (memory, checkers)
    assert quantity(res["requests"]["memory"]) <= memory and quantity(res["requests"]["cpu"]) <= cpu


def test_selectors_ports_and_targets_meet() -> None:
    r = resources()
    labels = r["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert r["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert r["Service"]["spec"]["selector"].items() <= labels.items()
    assert r["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert r["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert r["Service"]["spec"]["ports"][0]["targetPort"] in ports
    [ingress] = r["NetworkPolicy"]["spec"]["ingress"]
    assert [p["port"] for p in ingress["ports"]] == [ports["http"]]
    egress = {p["port"] for rule in r["NetworkPolicy"]["spec"]["egress"] for p in rule["ports"]}
    assert {53, 5432, 6379, 443} <= egress
    target = r["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", r["Deployment"]["metadata"]["name"])
    assert r["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2
    hpa, pdb = r["HorizontalPodAutoscaler"]["spec"], r["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] < hpa["minReplicas"]


def test_the_configmap_is_a_valid_config_with_the_secrets_env(tmp_path: Path) -> None:
    toml = resources()["ConfigMap"]["data"]["chatgate.toml"]
    (tmp_path / "chatgate.toml").write_text(toml)
    env = {"CHATGATE_STORE_URL": "postgresql://chatgate:pw@db:5432/chatgate",
           "CHATGATE_LIMITS_REDIS_URL": "redis://redis:6379/0", "DEEPSEEK_API_KEY": "sk-x",
           "CHATGATE_ADMIN_KEY": "a" * 64}
    settings = load_settings(str(tmp_path / "chatgate.toml"), env).settings
    assert settings.auth.mode == "managed" and settings.store.url.startswith("postgresql://")
    assert settings.limits.redis_url and settings.limits.on_backend_error == "fail_closed"
    mounts = {m["mountPath"] for m in container()["volumeMounts"]}
    assert {"/config", "/data"} <= mounts and settings.store.spool_dir.startswith("/data/")
