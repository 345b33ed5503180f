"""The fleet's deployment files: the Kubernetes manifests validate offline against the API
schemas (kubernetes-validate) and keep the isolation rules (only the gateway reaches backends,
Redis and PostgreSQL, probes on /readyz, a disruption budget, a GPU per backend, PostgreSQL on a
volume); the compose `fleet` profile validates like docker-compose.yml; both policies load and
describe the same fleet, its control plane in PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway.policy.load import load_policy
from gateway.policy.model import OnSharedFailure, Policy
from tests.kit.redis_server import GATEWAY_RULES, GATEWAY_USER

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "deploy" / "compose.fleet.yml"
K8S_VERSION = "1.30.0"
DOCS: list[dict[str, Any]] = [
    doc for f in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(f.read_text()) if doc
]
GATEWAY = {"app.kubernetes.io/name": "kvfence", "app.kubernetes.io/component": "gateway"}
POSTGRES_DATA = "/var/lib/postgresql/data"


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_validates_strictly(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    broken = yaml.safe_load(yaml.safe_dump(named("Deployment", "kvfence-gateway")))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_gateway_replicas_probes_and_disruption_budget() -> None:
    gateway = named("Deployment", "kvfence-gateway")
    assert gateway["spec"]["replicas"] >= 2
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (budget,) = of_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == GATEWAY
    assert budget["spec"]["minAvailable"] < gateway["spec"]["replicas"]
    service = named("Service", "kvfence-gateway")
    assert service["spec"]["selector"] == GATEWAY


def test_each_backend_has_a_gpu_and_its_own_service() -> None:
    backends = [d for d in of_kind("Deployment") if "backend" in d["metadata"]["name"]]
    assert len(backends) == 2
    for deployment in backends:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert "--device" in container["args"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        service = named("Service", deployment["metadata"]["name"])
        assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize(
    ("component", "port"), [("backend", 8000), ("redis", 6379), ("postgres", 5432)]
)
def test_only_the_gateway_reaches_backends_redis_and_postgres(component: str, port: int) -> None:
    deny = named("NetworkPolicy", "default-deny-ingress")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    guards = [
        p
        for p in of_kind("NetworkPolicy")
        if p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
        == component
    ]
    assert len(guards) == 1
    rules = guards[0]["spec"]["ingress"]
    for rule in rules:
        assert rule["from"] == [{"podSelector": {"matchLabels": GATEWAY}}]
    assert [p for r in rules for p in r["ports"]] == [{"protocol": "TCP", "port": port}]


def test_postgres_keeps_its_data_on_a_volume_claim_as_a_non_root_user() -> None:
    postgres = named("StatefulSet", "kvfence-postgres")
    spec = postgres["spec"]
    assert spec["replicas"] == 1
    [claim] = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[POSTGRES_DATA] == claim["metadata"]["name"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PGDATA"].startswith(POSTGRES_DATA + "/"), "initdb wants a folder of the claim's"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "pg_isready" in container["readinessProbe"]["exec"]["command"]
    # The password is a file from the gateways' Secret, the key the policy reads too.
    password = env["POSTGRES_PASSWORD_FILE"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    [source] = [volumes[n]["secret"] for p, n in mounts.items() if password.startswith(p + "/")]
    assert source["secretName"] == "kvfence-gateway"
    assert source["items"] == [{"key": "postgres_password", "path": Path(password).name}]
    assert "postgres_password" in named("Secret", "kvfence-gateway")["stringData"]
    service = named("Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels(postgres).items()


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_configmap_policy_names_the_postgres_service_and_a_mounted_password() -> None:
    """The gateways reach PostgreSQL by the headless Service's name, and read its password
    where the kvfence-gateway Secret is mounted; no password in the URL."""
    policy = yaml.safe_load(named("ConfigMap", "kvfence-policy")["data"]["policy.yaml"])
    control = policy["gateway"]["control"]
    url = urlsplit(control["url"])
    assert control["database"] == "postgresql" and url.password is None
    service = named("StatefulSet", "kvfence-postgres")["spec"]["serviceName"]
    assert url.hostname == f"{service}.kvfence.svc" and url.port == 5432
    [gateway] = named("Deployment", "kvfence-gateway")["spec"]["template"]["spec"]["containers"]
    [secrets] = [m for m in gateway["volumeMounts"] if m["name"] == "secrets"]
    assert control["password"]["file"] == f"{secrets['mountPath']}/postgres_password"
    assert policy["registry"] is True


def test_the_k8s_secret_holds_the_log_and_receipt_keys_the_policy_reads() -> None:
    """Every replica signs checkpoints and receipts with the same keys: the kvfence-gateway
    Secret's, where the gateways mount it."""
    gateway = yaml.safe_load(named("ConfigMap", "kvfence-policy")["data"]["policy.yaml"])["gateway"]
    [key] = gateway["receipts"]["keys"]
    assert key["active"] is True
    [container] = named("Deployment", "kvfence-gateway")["spec"]["template"]["spec"]["containers"]
    [secrets] = [m for m in container["volumeMounts"] if m["name"] == "secrets"]
    files = {gateway["audit_log"]["checkpoints"]["key"]["file"], key["private_key"]["file"]}
    assert {str(Path(f).parent) for f in files} == {secrets["mountPath"]}
    assert {Path(f).name for f in files} == {"log.key", "receipt-r1.key"}
    assert {Path(f).name for f in files} <= set(named("Secret", "kvfence-gateway")["stringData"])


def test_both_compose_gateways_sign_with_the_keys_docker_compose_yml_makes() -> None:
    """The fleet mounts the log and receipt keys made by docker-compose.yml's setup into both
    gateways, where policies/fleet.yaml reads them."""
    fleet = yaml.safe_load(COMPOSE.read_text())
    single = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["secrets"]
    gateway = yaml.safe_load((ROOT / "policies" / "fleet.yaml").read_text())["gateway"]
    [key] = gateway["receipts"]["keys"]
    for path in (gateway["audit_log"]["checkpoints"]["key"]["file"], key["private_key"]["file"]):
        name = Path(path).name
        assert path == f"/run/secrets/{name}"
        for service in ("gateway-a", "gateway-b"):
            assert name in fleet["services"][service]["secrets"]
        made = Path(single[name]["file"]).as_posix().removeprefix("./")
        assert Path(fleet["secrets"][name]["file"]).as_posix() == f"../{made}"


def _rebased(text: str, tmp_path: Path) -> Path:
    """The policy with every secret file replaced by a local one (keys that load)."""
    from kvfence.keys.keyfile import generate_key, write_private_key
    from tests.kit.stack import make_keys

    keys = make_keys(tmp_path)
    for name in ("log.key", "receipt.key"):
        write_private_key(keys.folder / name, generate_key())
    files = {
        "namespace_key": keys.folder / "ns.key",
        "api_key_pepper": keys.folder / "pepper",
        "audit_key": keys.folder / "audit.key",
        "admin_token": keys.folder / "audit.key",
        "gateway-1.key": keys.folder / "gateway.key",
        "gateway_signing_key": keys.folder / "gateway.key",
        "backend-trust.json": keys.folder / "gateway-trust.json",
        "backend_trust": keys.folder / "gateway-trust.json",
        "redis_password": keys.folder / "audit.key",
        "postgres_password": keys.folder / "audit.key",
        "log.key": keys.folder / "log.key",
        "log_key": keys.folder / "log.key",
        "receipt-r1.key": keys.folder / "receipt.key",
        "receipt_key_r1": keys.folder / "receipt.key",
    }
    for prefix in ("/etc/kvfence/secrets/", "/run/secrets/"):
        for name, path in files.items():
            text = text.replace(prefix + name + "}", f"{path}}}")
    (tmp_path / "tenants").mkdir()
    for tenant in ("acme", "globex"):
        (tmp_path / "tenants" / f"{tenant}.digests").write_text("")
    text = text.replace("/etc/kvfence/tenants/", f"{tmp_path}/tenants/")
    for folder in ("audit", "anchor"):
        (tmp_path / folder).mkdir(mode=0o700)
        text = text.replace(f"/var/lib/kvfence/{folder}/", f"{tmp_path}/{folder}/")
    out = tmp_path / "policy.yaml"
    out.write_text(text)
    return out


def _check_fleet(policy: Policy, urls: set[str], postgres: str) -> None:
    assert {b.url for b in policy.backends} == urls
    assert {m.name for b in policy.backends for m in b.models} == {"smollm2"}
    shared = policy.gateway.shared
    assert shared is not None and shared.on_failure is OnSharedFailure.CLOSED
    assert all(t.limits.any for t in policy.tenants)
    control = policy.gateway.control
    assert control.database == "postgresql" and control.password is not None
    assert urlsplit(control.url).hostname == postgres
    assert policy.registry is not None, "the fleet's registry lives in the database"
    # Receipts on, in the same database: any replica serves any receipt.
    audit = policy.gateway.audit_log
    assert audit is not None and audit.checkpoints is not None
    assert policy.gateway.receipts is not None and policy.gateway.receipts.active.id == "r1"


def test_the_configmap_policy_loads_and_names_the_services(tmp_path: Path) -> None:
    text = named("ConfigMap", "kvfence-policy")["data"]["policy.yaml"]
    policy = load_policy(_rebased(text, tmp_path))
    services = {d["metadata"]["name"] for d in of_kind("Service")}
    urls = {f"http://{s}:8000" for s in services if "backend" in s}
    _check_fleet(policy, urls, "postgres.kvfence.svc")
    assert policy.gateway.shared is not None
    assert "kvfence-redis" in policy.gateway.shared.redis_url and "kvfence-redis" in services


def test_the_compose_fleet_policy_loads(tmp_path: Path) -> None:
    policy = load_policy(_rebased((ROOT / "policies" / "fleet.yaml").read_text(), tmp_path))
    _check_fleet(policy, {"http://backend-a:8000", "http://backend-b:8000"}, "postgres")


def test_each_compose_gateway_keeps_its_own_log_and_its_anchor_apart(tmp_path: Path) -> None:
    """Whoever rewrites a gateway's log cannot also roll back its anchor in the same folder,
    and two replicas never write one chain."""
    policy = load_policy(_rebased((ROOT / "policies" / "fleet.yaml").read_text(), tmp_path))
    audit = policy.gateway.audit_log
    assert audit is not None and audit.anchor is not None
    text = yaml.safe_load((ROOT / "policies" / "fleet.yaml").read_text())["gateway"]["audit_log"]
    log_dir, anchor_dir = Path(text["path"]).parent, Path(text["anchor"]).parent
    assert log_dir != anchor_dir
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    sources = []
    for name in ("gateway-a", "gateway-b"):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"]}
        sources += [mounts[log_dir.as_posix()], mounts[anchor_dir.as_posix()]]
    assert len(set(sources)) == 4, sources


@pytest.mark.parametrize("service", ["gateway-a", "backend-a"])
def test_compose_fleet_builds_as_docker_compose_yml_does(service: str) -> None:
    """The same build arguments from the environment (PYTHON_IMAGE, TORCH_INDEX_URL), so a
    build through either file makes the same image."""
    fleet = yaml.safe_load(COMPOSE.read_text())["services"][service]["build"]
    single = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    image = yaml.safe_load(COMPOSE.read_text())["services"][service]["image"]
    [same] = [s["build"] for s in single.values() if s.get("image") == image and "build" in s]
    assert fleet["args"] == same["args"] and fleet["target"] == same["target"]


def test_compose_fleet_publishes_only_the_load_balancer() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert set(services) == {
        "lb", "gateway-a", "gateway-b", "backend-a", "backend-b", "redis", "postgres"
    }  # fmt: skip
    assert all(s["profiles"] == ["fleet"] for s in services.values())
    for name, service in services.items():
        public = [p for p in service.get("ports", []) if not p.startswith("127.0.0.1:")]
        assert bool(public) == (name == "lb"), f"{name} publishes {public}"
    for name in ("backend-a", "backend-b"):
        assert services[name]["networks"] == ["fence"]
    assert services["redis"]["networks"] == ["state"]  # the gateways' alone: no backend's
    assert services["postgres"]["networks"] == ["state"]
    for name in ("gateway-a", "gateway-b"):
        assert set(services[name]["networks"]) == {"edge", "fence", "state"}
    networks = yaml.safe_load(COMPOSE.read_text())["networks"]
    assert networks["fence"]["internal"] is True and networks["state"]["internal"] is True


def test_compose_postgres_keeps_its_data_and_is_healthy_before_the_gateways_start() -> None:
    """PostgreSQL's data is a named volume (kept by `down`), its password a secret file that
    the gateways mount too, and the policy's url names its service, user and database."""
    fleet = yaml.safe_load(COMPOSE.read_text())
    services = fleet["services"]
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:17-alpine"
    [volume] = postgres["volumes"]
    name, target = volume.split(":")
    assert target == POSTGRES_DATA and name in fleet["volumes"], "a named volume, not a folder"
    env = postgres["environment"]
    assert env["PGDATA"].startswith(POSTGRES_DATA + "/")
    assert postgres["secrets"] == ["postgres_password"]
    assert env["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert "-h" in postgres["healthcheck"]["test"], "over TCP: not the setup server's socket"
    assert postgres["read_only"] is True and postgres["cap_drop"] == ["ALL"]
    assert not postgres["user"].startswith("0"), "the containers' user, never root"
    policy = yaml.safe_load((ROOT / "policies" / "fleet.yaml").read_text())
    control = policy["gateway"]["control"]
    url = urlsplit(control["url"])
    assert control["database"] == "postgresql" and url.password is None
    assert (url.hostname, url.port) == ("postgres", 5432)
    assert (url.username, url.path) == (env["POSTGRES_USER"], "/" + env["POSTGRES_DB"])
    assert control["password"] == {"file": env["POSTGRES_PASSWORD_FILE"]}
    assert policy["registry"] is True
    for gateway in ("gateway-a", "gateway-b"):
        assert "postgres_password" in services[gateway]["secrets"]
        assert services[gateway]["depends_on"]["postgres"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_redis_lets_in_only_the_gateways_acl_user(where: str) -> None:
    """The rules the tests run Redis with (tests/kit/redis_server.py) are the deployed ones: the
    default user off, the gateways' user with a password from a secret, no dangerous command."""
    if where == "compose":
        redis = yaml.safe_load(COMPOSE.read_text())["services"]["redis"]
        command, policy = redis["command"][2], (ROOT / "policies" / "fleet.yaml").read_text()
        assert redis["secrets"] == ["redis_password"]
    else:
        [redis] = named("Deployment", "kvfence-redis")["spec"]["template"]["spec"]["containers"]
        command = redis["command"][2]
        policy = named("ConfigMap", "kvfence-policy")["data"]["policy.yaml"]
    words = command.split()
    assert "user default off resetpass -@all" in " ".join(words)
    assert f"user {GATEWAY_USER} on >%s {GATEWAY_RULES}" in " ".join(words)
    assert "--protected-mode" not in words
    shared = yaml.safe_load(policy)["gateway"]["shared"]["redis"]
    assert shared["username"] == GATEWAY_USER and "redis_password" in shared["password"]["file"]
    assert "eval" not in GATEWAY_RULES and "@" not in GATEWAY_RULES.replace("-@all", "")
    documented = (ROOT / "docs" / "fleet.md").read_text()
    assert f"user {GATEWAY_USER} on >PASSWORD {GATEWAY_RULES}\n" in documented


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_validates_the_fleet_profile() -> None:
    cmd = ["docker-compose", "-f", str(COMPOSE), "--profile", "fleet", "config", "-q"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
