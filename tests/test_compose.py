"""docker-compose.yml, the Dockerfile and policies/compose.yaml agree: every service of ours runs a
valid `kvfence` command through the image's entry point, only the gateway is reachable from
outside, secrets are files mounted where they are read, and every service has a health check."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kvfence.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
POLICY_FILE = ROOT / "policies" / "compose.yaml"
SECRETS_DIR = "/run/secrets/"

COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Services built from our Dockerfile; the others (vllm) use their own image.
OURS = sorted(name for name, svc in SERVICES.items() if "build" in svc)
TOOLS = "kvfence"  # the CLI service the setup runs: no network, no secrets
SERVERS = sorted(set(SERVICES) - {TOOLS})


def _networks(service: dict[str, Any]) -> set[str]:
    nets = service.get("networks", {})
    return set(nets) if isinstance(nets, (list, dict)) else set()


def _service_secrets(service: dict[str, Any]) -> set[str]:
    return set(_secret_mounts(service).values())


def _secret_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Path inside the container -> the secret mounted there."""
    mounts = {}
    for ref in service.get("secrets", []):
        source, target = (ref, ref) if isinstance(ref, str) else (ref["source"], ref.get("target"))
        target = target or source
        mounts[target if target.startswith("/") else SECRETS_DIR + target] = source
    return mounts


def _option(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def _dockerfile_stages(text: str) -> dict[str, dict[str, Any]]:
    """Stage name -> {base, entrypoint, runs}; the entry point is inherited from a stage base."""
    logical = re.sub(r"\\\n", " ", text)
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            current = {"base": parts[0], "entrypoint": None, "runs": []}
            stages[name] = current
        elif current is not None and word == "ENTRYPOINT":
            current["entrypoint"] = json.loads(rest)
        elif current is not None and word == "RUN":
            current["runs"].append(rest)
    for stage in stages.values():
        base = stage["base"]
        while stage["entrypoint"] is None and base in stages:
            stage["entrypoint"] = stages[base]["entrypoint"]
            base = stages[base]["base"]
    return stages


STAGES = _dockerfile_stages(DOCKERFILE.read_text())


def _parse_kvfence_args(args: list[str]) -> argparse.Namespace:
    """Parse as `kvfence ARGS` would, with the subcommand's real parser; fail on exit."""
    name, rest = args[0], args[1:]
    assert name in COMMANDS, f"{name!r} is not a kvfence command ({sorted(COMMANDS)})"
    module_name, text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"kvfence {name}", description=text)
    module.configure(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(rest)
    except SystemExit:
        pytest.fail(f"kvfence {' '.join(args)} is refused by its parser:\n{err.getvalue()}")


def test_our_services_exist() -> None:
    assert {"gateway", "backend"} <= set(OURS)
    assert "vllm" in SERVICES
    assert SERVICES["vllm"].get("profiles") == ["vllm"]


@pytest.mark.parametrize("name", OURS)
def test_service_runs_the_image_entry_point(name: str) -> None:
    service = SERVICES[name]
    assert "entrypoint" not in service, "the image's entry point must not be overridden"
    target = service["build"]["target"]
    assert target in STAGES, f"Dockerfile has no stage {target!r}"
    assert STAGES[target]["entrypoint"] == ["kvfence"]
    assert isinstance(service["command"], list), "exec form: no shell between compose and kvfence"


@pytest.mark.parametrize("name", OURS)
def test_service_command_is_a_valid_kvfence_invocation(name: str) -> None:
    args = [str(a) for a in SERVICES[name]["command"]]
    _parse_kvfence_args(args)
    assert args[0] == name, "each service runs the subcommand it is named after"


def test_gateway_image_installs_no_torch() -> None:
    target = SERVICES["gateway"]["build"]["target"]
    chain, stage = [], target
    while stage in STAGES:
        chain.append(stage)
        stage = STAGES[stage]["base"]
    runs = " ".join(r for s in chain for r in STAGES[s]["runs"])
    assert "torch" not in runs
    assert "backend]" not in runs and ",backend" not in runs


def _build_args(text: str) -> dict[str, str]:
    """Every `ARG NAME[=DEFAULT]` of the Dockerfile, wherever declared."""
    return dict(
        (m.group(1), m.group(2) or "") for m in re.finditer(r"^ARG (\w+)(?:=(\S*))?$", text, re.M)
    )


def test_torch_comes_from_an_index_the_build_may_change() -> None:
    """PyTorch's CPU index by default; `pypi` (or empty) for pip's own configured index where
    that index cannot be reached but pip's holds the CPU build."""
    text = DOCKERFILE.read_text()
    args = _build_args(text)
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    [torch] = [r for r in STAGES["backend"]["runs"] if "torch==" in r]
    assert '--index-url "$TORCH_INDEX_URL"' in torch and '""|pypi)' in torch
    assert "download.pytorch.org" not in torch, "the index is the argument, not a constant"


@pytest.mark.parametrize("name", OURS)
def test_compose_passes_the_build_arguments_from_the_environment(name: str) -> None:
    """`docker compose build` with PYTHON_IMAGE or TORCH_INDEX_URL set passes them; unset, the
    Dockerfile's defaults hold (compose drops a listed argument the environment lacks)."""
    args = SERVICES[name]["build"]["args"]
    assert sorted(args) == sorted(_build_args(DOCKERFILE.read_text()))


def test_only_the_gateway_publishes_a_port() -> None:
    published = {name for name, svc in SERVICES.items() if svc.get("ports")}
    assert published == {"gateway"}
    for name in SERVERS:
        assert "network_mode" not in SERVICES[name]
    # The admin listener (tenant ids in /metrics, quarantine release) only on the host's loopback.
    admin = yaml.safe_load(POLICY_FILE.read_text())["gateway"]["admin"]
    [mapping] = [p for p in SERVICES["gateway"]["ports"] if p.endswith(f":{admin['port']}")]
    assert mapping.startswith("127.0.0.1:") and "token" in admin


def test_the_cli_service_sees_only_the_state_folder() -> None:
    tools = SERVICES[TOOLS]
    assert tools["profiles"] == ["tools"], "never started by `docker compose up`"
    assert tools["image"] == SERVICES["gateway"]["image"], "the image the gateway runs"
    assert tools["network_mode"] == "none" and "secrets" not in tools
    assert tools["volumes"] == [f"./.kvfence/compose:{tools['working_dir']}"]
    assert tools["read_only"] is True and tools["cap_drop"] == ["ALL"]


@pytest.mark.parametrize("name", sorted(set(SERVERS) - {"gateway"}))
def test_upstreams_sit_only_on_internal_networks_shared_with_the_gateway(name: str) -> None:
    networks = COMPOSE["networks"]
    nets = _networks(SERVICES[name])
    assert nets, f"{name} would join the default (external) network"
    for net in nets:
        assert (networks.get(net) or {}).get("internal") is True, f"{net} is not internal"
    assert nets & _networks(SERVICES["gateway"]), f"the gateway cannot reach {name}"


def test_secrets_are_files_in_the_ignored_state_directory() -> None:
    declared = COMPOSE["secrets"]
    for name, spec in declared.items():
        assert set(spec) == {"file"}, f"secret {name} is not a plain file"
        assert spec["file"].startswith("./.kvfence/"), f"secret {name} lies outside .kvfence/"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".kvfence/" in ignored
    for name, svc in SERVICES.items():
        assert _service_secrets(svc) <= set(declared), f"{name} mounts an undeclared secret"
        for var, value in (svc.get("environment") or {}).items():
            assert not re.search(r"KEY|PEPPER|SECRET|TOKEN", var), f"{name}: secret in env {var}"
            assert not str(value).startswith("kvf_"), f"{name}: an API key in {var}"


@pytest.mark.parametrize("name", OURS)
def test_every_file_a_command_names_is_mounted(name: str) -> None:
    service = SERVICES[name]
    targets = {v.split(":")[1] for v in service.get("volumes", [])}
    for arg in map(str, service["command"]):
        if arg.startswith(SECRETS_DIR):
            assert arg in _secret_mounts(service), f"{arg} is not mounted into {name}"
        elif arg.startswith("/etc/kvfence/"):
            assert arg in targets, f"{arg} is not mounted into {name}"


def _secret_refs(node: Any, source: str) -> list[str]:
    """Every `{file: PATH}` (or `{env: NAME}`) reference in a parsed policy."""
    if isinstance(node, dict):
        if set(node) == {source}:
            return [node[source]]
        return [p for v in node.values() for p in _secret_refs(v, source)]
    if isinstance(node, list):
        return [p for v in node for p in _secret_refs(v, source)]
    return []


def _volumes(service: dict[str, Any]) -> dict[str, str]:
    """Folder inside the container -> the host folder (relative to the compose file)."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def test_policy_reads_files_the_gateway_mounts() -> None:
    policy = yaml.safe_load(POLICY_FILE.read_text())
    files = _secret_refs(policy, "file")
    assert files, "the compose policy reads no secret files"
    secrets, folders = _secret_mounts(SERVICES["gateway"]), _volumes(SERVICES["gateway"])
    for path in files:
        in_folder = any(path.startswith(target + "/") for target in folders)
        assert path in secrets or in_folder, f"{path} is not mounted into the gateway"
    assert _secret_refs(policy, "env") == [], "compose passes secrets as files, not env"
    # Tenant digests come from a mounted folder, never pasted into the tracked policy.
    assert "hmac-sha256:" not in POLICY_FILE.read_text()
    audit = policy["gateway"]["audit_log"]
    assert Path(audit["path"]).parent.as_posix() in folders, "the audit log is on a volume"
    assert Path(audit["anchor"]).parent.as_posix() in folders, "so is its anchor"
    assert Path(audit["anchor"]).parent != Path(audit["path"]).parent


def test_receipts_are_on_signed_with_mounted_keys_and_kept_on_a_volume() -> None:
    """Checkpoints and receipts sign with their own secrets, and the control database that
    keeps the receipts lies in a folder of .kvfence/compose/, not the temp dir a gateway
    without `state_dir` uses (lost at every restart)."""
    gateway = yaml.safe_load(POLICY_FILE.read_text())["gateway"]
    [key] = gateway["receipts"]["keys"]
    assert key["active"] is True
    signers = {gateway["audit_log"]["checkpoints"]["key"]["file"], key["private_key"]["file"]}
    service = SERVICES["gateway"]
    mounted = {_secret_mounts(service)[f] for f in signers}
    files = {COMPOSE["secrets"][name]["file"] for name in mounted}
    assert files == {"./.kvfence/compose/log.key", "./.kvfence/compose/receipt-r1.key"}
    state = gateway["state_dir"]
    assert _volumes(service)[state].startswith("./.kvfence/compose/")
    assert state not in service.get("tmpfs", []) and not state.startswith("/tmp")


def test_policy_backends_match_the_services_they_name() -> None:
    policy = yaml.safe_load(POLICY_FILE.read_text())
    by_kind = {b["kind"]: b for b in policy["backends"]}
    ours = by_kind["kvfence"]
    url = urlsplit(ours["url"])
    args = _parse_kvfence_args([str(a) for a in SERVICES["backend"]["command"]])
    assert url.hostname == "backend"
    assert url.port == args.port
    assert ours["audience"] == args.id
    # What the backend serves: the model name (the spec itself for the packaged model) and the
    # revision its handles must name.
    served = {"name": args.served_name or args.model, "revision": args.revision}
    assert ours["models"] == [served]
    vllm = urlsplit(by_kind["vllm"]["url"])
    assert vllm.hostname == "vllm"
    served = _option([str(a) for a in SERVICES["vllm"]["command"]], "--served-model-name")
    assert served in {m["name"] for m in by_kind["vllm"]["models"]}


@pytest.mark.parametrize("name", SERVERS)
def test_every_service_has_a_health_check_on_its_own_port(name: str) -> None:
    service = SERVICES[name]
    check = " ".join(map(str, service["healthcheck"]["test"]))
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", check)
    assert match, f"{name}: the health check probes no local URL"
    port, path = match.groups()
    assert port == _option([str(a) for a in service["command"]], "--port")
    assert path in {"/healthz", "/readyz", "/health"}
    if name == "gateway":
        assert path == "/readyz"
        assert service["depends_on"]["backend"]["condition"] == "service_healthy"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("profile", [[], ["--profile", "vllm"]], ids=["default", "vllm"])
def test_docker_compose_validates_the_file(profile: list[str]) -> None:
    cmd = ["docker-compose", "-f", str(COMPOSE_FILE), *profile, "config", "-q"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
