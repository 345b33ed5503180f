"""The headers of docker-compose.yml and deploy/compose.fleet.yml, read as scripts/compose-check
reads them: every command is valid bash, every `kvfence` command one its parser takes, every
URL a port the file publishes, every folder a gateway writes made for the containers' user. The
setup runs here as written (the `kvfence` service's commands as a local `kvfence`; what needs an
engine is left to scripts/compose-check), and makes the keys, secrets and audit log the gateway
reads."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.test_compose import (
    COMPOSE,
    COMPOSE_FILE,
    POLICY_FILE,
    ROOT,
    SERVICES,
    TOOLS,
    _option,
    _parse_kvfence_args,
    _secret_mounts,
    _secret_refs,
    _volumes,
)


def _load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compose_check", ROOT / "scripts/compose_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _load_check()
FLEET_FILE = ROOT / "deploy" / "compose.fleet.yml"
FLEET: dict[str, Any] = yaml.safe_load(FLEET_FILE.read_text())
HEADERS = {
    "single": CHECK.header_commands(COMPOSE_FILE),
    "fleet": CHECK.header_commands(FLEET_FILE),
}
# Commands that need the engine or a running stack: scripts/compose-check runs those.
ENGINE = ("docker compose build", "docker compose up", "docker compose down", "curl ")
CONTAINER_UID = "10001"  # the image's user (Dockerfile)


def _words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


# The `kvfence` service run as a command, or inside `$(...)` (-T: its output is read).
TOOL_RUN = re.compile(rf"docker compose run --rm (?:-T )?{TOOLS} ")


def _kvfence_runs(commands: list[str]) -> list[list[str]]:
    """The ARGS of every `docker compose run --rm [-T] kvfence ARGS`, also inside `$(...)`."""
    runs = []
    for command in commands:
        if "docker compose run" not in command:
            continue
        assert command.startswith("docker compose run") or re.match(
            r"^\w+=\$\(docker compose run", command
        ), command
        words = _words(command.split("$(", 1)[-1].removesuffix(")"))
        assert TOOL_RUN.match(" ".join(words[:6]) + " "), command
        runs.append(words[words.index(TOOLS) + 1 :])
    return runs


def test_the_extraction_keeps_each_command_as_written(tmp_path: Path) -> None:
    header = tmp_path / "compose.yml"
    header.write_text(
        "# Prose, then commands:\n#\n#   echo one\n#   printf '%s\\n' a \\\n#     b\n"
        "# `not a command`, prose.\n#    four spaces: prose too\n#   echo two\n"
        "services: {}\n#   echo after the header\n"
    )
    assert CHECK.header_commands(header) == [
        "echo one",
        "printf '%s\\n' a \\\n  b",
        "echo two",
    ]


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_every_header_command_is_valid_bash(name: str) -> None:
    commands = HEADERS[name]
    assert len(commands) >= 5, f"the {name} header lost its commands"
    script = "\n".join(commands)
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_every_kvfence_command_in_the_headers_parses(name: str) -> None:
    runs = _kvfence_runs(HEADERS[name])
    assert any(args[:2] == ["audit", "verify"] for args in runs), "no audit verify"
    for args in runs:
        _parse_kvfence_args(args)


def _default_port(mapping: str) -> str:
    """The host port of a `[IP:]${VAR:-PORT}:CONTAINER` mapping, as published by default."""
    match = re.search(r"\$\{\w+:-(\d+)\}:\d+$", mapping)
    assert match, mapping
    return match.group(1)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("single", {p for p in SERVICES["gateway"]["ports"]}),
        ("fleet", {p for s in FLEET["services"].values() for p in s.get("ports", [])}),
    ],
)
def test_header_urls_are_ports_the_file_publishes(name: str, published: set[str]) -> None:
    ports = {_default_port(p) for p in published}
    urls = [u for c in HEADERS[name] for u in re.findall(r"http://127\.0\.0\.1:(\d+)/", c)]
    assert urls and set(urls) <= ports


def _chats(commands: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(key variable, JSON body) of every chat request the header sends."""
    found = []
    for command in commands:
        words = _words(command)
        if words[0] == "curl" and any(w.endswith("/v1/chat/completions") for w in words):
            key = re.search(r"Bearer \$(\w+)", command)
            assert key, command
            found.append((key.group(1), json.loads(_option(words, "-d"))))
    return found


def test_the_header_states_each_tenants_scope_and_its_chat_sends_it() -> None:
    """globex is scoped `user`: its requests without `user` are refused, so the header says so
    and its example sends one."""
    header = "\n".join(line for line in COMPOSE_FILE.read_text().splitlines() if line[:1] == "#")
    prose = " ".join(header.replace("#", " ").split())
    for tenant in yaml.safe_load(POLICY_FILE.read_text())["tenants"]:
        assert f"{tenant['id']} is scoped `{tenant['scope']}`" in prose
    assert "400 `missing_scope_value`" in prose
    chats = _chats(HEADERS["single"])
    assert chats, "the header shows no chat"
    for key, body in chats:
        assert body["model"] in {"smollm2"}
        if key == "GLOBEX_KEY":
            assert body.get("user"), "globex's chat without `user` would be refused"


def _local(command: str, root: Path) -> str:
    """A header command as this machine runs it without Docker: `docker compose run --rm
    kvfence ARGS` is `kvfence ARGS` in the folder the service mounts as its working directory;
    anything else runs as written."""
    if not TOOL_RUN.search(command):
        return command
    tools = SERVICES[TOOLS]
    folder = root / _volumes(tools)[tools["working_dir"]]
    kvfence = f"{shlex.quote(sys.executable)} -m kvfence.cli"
    local = TOOL_RUN.sub(lambda _: f"cd {shlex.quote(str(folder))} && {kvfence} ", command)
    # Inside `$(...)` it is a subshell already; as a command of its own it must not move the
    # header's working directory.
    return f"({local})" if command.startswith("docker compose run") else local


def _run(commands: list[str], root: Path, path: str = "") -> str:
    """The commands in one bash, in order, as the header has them run; those needing an
    engine are left out."""
    script = [_local(c, root) for c in commands if not c.startswith(ENGINE)]
    env = {
        "PATH": f"{path}{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(root),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + "\n".join(script)], cwd=root, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stderr}"
    return done.stdout


def _setup() -> list[str]:
    """The single stack's setup: every command before it starts."""
    commands = HEADERS["single"]
    up = next(i for i, c in enumerate(commands) if c.startswith("docker compose up"))
    return commands[:up]


def _host_policy(root: Path) -> Path:
    """policies/compose.yaml with every mounted path rebased onto `root`, as the gateway sees
    it inside its container."""
    text = POLICY_FILE.read_text()
    gateway = SERVICES["gateway"]
    for mount, name in _secret_mounts(gateway).items():
        text = text.replace(mount + "}", f"{root / COMPOSE['secrets'][name]['file']}}}")
    for target, source in _volumes(gateway).items():
        if target.startswith("/var/lib/kvfence/") or target == "/etc/kvfence/tenants":
            text = re.sub(rf"{re.escape(target)}(?=/|$)", str(root / source), text, flags=re.M)
    unmounted = [f for f in _secret_refs(yaml.safe_load(text), "file") if f.startswith("/run")]
    assert unmounted == [], "the policy names a secret compose does not declare"
    local = root / "policy.yaml"
    local.write_text(text)
    return local


def test_documented_setup_runs_as_written_and_the_gateway_accepts_its_keys(
    tmp_path: Path,
) -> None:
    _run(_setup(), tmp_path)
    files = {n: tmp_path / s["file"] for n, s in COMPOSE["secrets"].items()}
    assert (tmp_path / ".kvfence" / "compose").stat().st_mode & 0o077 == 0
    for name, path in files.items():
        assert path.is_file(), f"the documented setup does not create secret {name}"
        if not name.endswith("_trust"):  # trust files hold public keys
            assert path.stat().st_mode & 0o077 == 0, f"secret {name} is readable by others"
    keyfile = importlib.import_module("kvfence.keys.keyfile")
    keyfile.load_private_key(files["gateway_signing_key"])
    keyfile.load_private_key(files["backend_signing_key"])
    gateway_trust = keyfile.TrustStore.from_file(files["gateway_trust"])
    # The backend signs attestations under its key file's stem; the gateway must trust that id.
    backend_args = [str(a) for a in SERVICES["backend"]["command"]]
    attestation_key_id = Path(_option(backend_args, "--signing-key")).stem
    assert attestation_key_id in keyfile.TrustStore.from_file(files["backend_trust"])

    policy = importlib.import_module("gateway.policy.load").load_policy(_host_policy(tmp_path))
    assert policy.gateway.handle_key is not None
    assert policy.gateway.handle_key.id in gateway_trust, "the backend would refuse every handle"
    assert {b.kind for b in policy.backends} == {"kvfence", "vllm"}
    assert policy.gateway.audit_log is not None and policy.gateway.admin.token is not None
    # Receipts on, signed with the keys the header made, kept where the header made a folder.
    assert policy.gateway.receipts is not None and policy.gateway.receipts.active.id == "r1"
    assert policy.gateway.audit_log.checkpoints is not None
    assert policy.gateway.state_dir == tmp_path / ".kvfence" / "compose" / "state"
    assert policy.gateway.state_dir.is_dir()
    # The key files the header reads back into $ACME_KEY and $GLOBEX_KEY are the tenants' keys.
    runtime = importlib.import_module("gateway.policy.runtime").Runtime(policy)
    keys = {}
    for variable, path in re.findall(
        r"^(\w+)=\$\(cat (\S+)\)$", "\n".join(HEADERS["single"]), re.M
    ):
        key_file = tmp_path / path
        assert key_file.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
        keys[variable] = key_file.read_text().strip()
    assert {v: runtime.tenant_for_key(k).id for v, k in keys.items()} == {
        "ACME_KEY": "acme",
        "GLOBEX_KEY": "globex",
    }


@pytest.mark.parametrize(("uid", "runs_as"), [("0", CONTAINER_UID), ("1000", "1000")])
def test_containers_run_as_the_user_who_set_up_never_as_root(
    tmp_path: Path, uid: str, runs_as: str
) -> None:
    """As root, .env names the image's user (and the state folder is given to it); anyone else
    gets their own uid, so they can read what the containers write."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (fake / "id").chmod(0o755)
    (fake / "chown").write_text('#!/bin/sh\necho "chown $*"\n')  # the real one needs root
    (fake / "chown").chmod(0o755)
    setup = [c for c in _setup() if not c.startswith("docker compose run")]
    out = _run(setup, tmp_path, path=f"{fake}:")
    env_file = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().split())
    assert env_file == {"KVFENCE_UID": runs_as, "KVFENCE_GID": runs_as}
    assert f"chown -R {runs_as}:{runs_as} .kvfence/compose" in out


async def test_documented_audit_verify_checks_both_workers_chains(tmp_path: Path) -> None:
    _run(_setup(), tmp_path)
    policy = importlib.import_module("gateway.policy.load").load_policy(_host_policy(tmp_path))
    audit = policy.gateway.audit_log
    log_module = importlib.import_module("gateway.audit.sink")
    for worker in (1, 2):  # what `--workers 2` in the gateway's command writes
        log = log_module.open_log(audit, worker)
        await log.append({"request_id": f"r{worker}", "verdict": "clean"})
        await log.close()
    [verify] = [c for c in HEADERS["single"] if "audit verify" in c]
    out = await asyncio.to_thread(_run, [verify], tmp_path)
    assert "ok: 2 of 2 chains intact; verdicts: clean 2" in out


def _receipt_commands() -> list[str]:
    """The single header's commands from publishing the trust root to a tenant's verify."""
    commands = HEADERS["single"]
    first = next(i for i, c in enumerate(commands) if "/v1/kvfence/keys" in c)
    last = next(i for i, c in enumerate(commands) if "receipt verify" in c)
    return commands[first : last + 1]


def test_a_tenant_verifies_an_answers_receipt_against_the_pinned_fingerprint() -> None:
    """The tenant's three commands: the receipt and its proof fetched with its own key, for the
    id its answer carried, then verified against the fingerprint the operator published (never
    the key set the gateway serves now), with the answer's exact bytes."""
    commands = _receipt_commands()
    fetched = {}
    for command in commands:
        words = _words(command)
        if words[0] == "curl" and any("/v1/kvfence/receipts/" in w for w in words):
            [url] = [w for w in words if "/v1/kvfence/receipts/" in w]
            assert "Bearer $ACME_KEY" in command and "--fail-with-body" in words
            fetched[url.rsplit("/v1/kvfence/receipts/", 1)[1]] = Path(words[-1]).name
    assert fetched == {"$ID": "receipt.json", "$ID/proof": "receipt.tlog-proof"}
    [answer] = [c for c in commands if "/v1/chat/completions" in c]
    assert "Bearer $ACME_KEY" in answer and "-o .kvfence/compose/response.json" in answer
    [verify] = [a for a in _kvfence_runs(commands) if a[:2] == ["receipt", "verify"]]
    args = _parse_kvfence_args(verify)
    assert (str(args.receipt), str(args.proof), str(args.response)) == (
        "receipt.json", "receipt.tlog-proof", "response.json"
    )  # fmt: skip
    assert args.fingerprint == "$FINGERPRINT" and args.keys is None and args.log_key is None
    [pin] = [c for c in commands if c.startswith("FINGERPRINT=")]
    assert _kvfence_runs([pin]) == [["keys", "fingerprint", "keyset.json"]]


def test_the_header_reads_the_receipt_id_and_publishes_the_log_keys_fingerprint(
    tmp_path: Path,
) -> None:
    """Run offline: the fingerprint command on the key set this policy serves prints the log
    key's fingerprint, and the id is read from the answer's headers as HTTP sends them."""
    _run(_setup(), tmp_path)
    policy = importlib.import_module("gateway.policy.load").load_policy(_host_policy(tmp_path))
    keys = importlib.import_module("gateway.receipts.keys").ReceiptKeys.of(
        policy.gateway.receipts, policy.gateway.audit_log
    )
    state = tmp_path / ".kvfence" / "compose"
    (state / "keyset.json").write_bytes(keys.document)  # what GET /v1/kvfence/keys answers
    (state / "answer.headers").write_bytes(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"X-Kvfence-Receipt-Id: rcpt_1a2b3_00ff\r\nx-kvfence-verdict: clean\r\n\r\n"
    )
    commands = _receipt_commands()
    steps = [c for c in commands if c.startswith(("FINGERPRINT=", "ID="))]
    out = _run([*steps, 'printf "%s|%s" "$FINGERPRINT" "$ID"'], tmp_path)
    fingerprint = importlib.import_module("kvfence.receipts.receipt").fingerprint(keys.keyset.log)
    assert out == f"{fingerprint}|rcpt_1a2b3_00ff"


def _fleet_gateways() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in FLEET["services"].items() if s.get("command", [""])[0] == "gateway"}


def test_the_header_makes_every_folder_the_gateway_writes_for_the_containers_user() -> None:
    """The audit log, its anchor and the state folder (the control database) are made by the
    setup and given to the containers' user with the rest of .kvfence/compose/."""
    [mkdir] = [c for c in _setup() if c.startswith("mkdir -p")]
    made = set(_words(mkdir)[2:])
    written = {
        os.path.normpath(v.split(":")[0])
        for v in SERVICES["gateway"]["volumes"]
        if not v.endswith(":ro")
    }
    assert ".kvfence/compose/state" in written and written <= made
    assert 'chown -R "$u:$g" .kvfence/compose' in _setup()


def test_fleet_header_makes_every_folder_a_gateway_writes_for_the_containers_user() -> None:
    """Docker makes a missing bind-mounted folder owned by root, where the gateway (uid from
    .env) could not write its log."""
    [install] = [c for c in HEADERS["fleet"] if "install -d" in c]
    assert '-o "$KVFENCE_UID" -g "$KVFENCE_GID"' in install and ". ./.env" in install
    made = set(re.findall(r"\.kvfence/compose/[\w-]+", install))
    written = {
        os.path.normpath(Path("deploy") / v.split(":")[0])
        for s in _fleet_gateways().values()
        for v in s["volumes"]
        if not v.endswith(":ro")
    }
    assert written and made == written


def test_fleet_header_reads_the_env_file_and_verifies_each_gateways_log() -> None:
    fleet_runs = [c for c in HEADERS["fleet"] if "compose.fleet.yml" in c]
    assert fleet_runs and all("--env-file .env" in c for c in fleet_runs)
    verified = {
        (args[2], _option(args, "--anchor"))
        for args in _kvfence_runs(HEADERS["fleet"])
        if args[:2] == ["audit", "verify"]
    }
    expected = set()
    for service in _fleet_gateways().values():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        folder = {t: Path(s).name for t, s in mounts.items()}
        expected.add(
            (f"{folder['/var/lib/kvfence/audit']}/audit.jsonl",
             f"{folder['/var/lib/kvfence/anchor']}/audit.anchor")
        )  # fmt: skip
    assert verified == expected


def test_the_fleet_check_bursts_past_the_limit_the_fleet_policy_sets() -> None:
    """scripts/compose-check proves the limit is shared by sending more than one gateway's
    worth of acme's `concurrent` and fewer than two: shared, some are refused; per gateway,
    none would be. The burst stays within the rate limit, so only `concurrent` can refuse."""
    policy = yaml.safe_load((ROOT / "policies" / "fleet.yaml").read_text())
    [acme] = [t for t in policy["tenants"] if t["id"] == "acme"]
    limits = acme["limits"]
    assert limits["concurrent"] == CHECK.CONCURRENT
    assert CHECK.CONCURRENT < CHECK.BURST <= 2 * CHECK.CONCURRENT
    burst = limits.get("burst", limits["requests_per_s"])  # default: one second's requests
    assert burst >= CHECK.BURST + 4  # with the checks' requests just before it
    assert len(_fleet_gateways()) == 2


def _fleet_execs() -> list[tuple[str, list[str], str]]:
    """(service, ARGS, the command) of every `docker compose ... exec -T SERVICE kvfence ARGS`
    of the fleet header; ARGS end where a redirection does."""
    found = []
    for command in HEADERS["fleet"]:
        words = _words(command)
        if "exec" not in words:
            continue
        at = words.index("exec")
        assert words[at - 6 : at] == [
            "docker", "compose", "--env-file", ".env", "-f", "deploy/compose.fleet.yml"
        ], command  # fmt: skip
        assert words[at + 1] == "-T" and words[at + 3] == TOOLS, "no TTY: its output is piped"
        args = []
        for word in words[at + 4 :]:
            if word in {">", "|"}:
                break
            args.append(word.removesuffix(")"))
        found.append((words[at + 2], args, command))
    return found


def test_the_fleet_headers_registry_commands_go_to_a_gateway_and_parse() -> None:
    """`kvfence tenants|keys` run inside a gateway, on the policy it mounts, so they reach its
    admin listener with its token; every one is a command the parser takes, and a file that
    holds a key is made by a command under umask 077."""
    execs = _fleet_execs()
    actions = {tuple(args[:2]) for _, args, _ in execs}
    assert {("tenants", "add"), ("keys", "new"), ("keys", "revoke")} <= actions
    for service, args, command in execs:
        mounts = {v.split(":")[1]: v.split(":")[0] for v in _fleet_gateways()[service]["volumes"]}
        assert Path(mounts[_option(args, "--policy")]).name == "fleet.yaml"
        _parse_kvfence_args(args)
        if ">" in _words(command):
            assert command.startswith("(umask 077 && "), command


def test_the_fleet_header_makes_each_password_only_the_containers_user_reads() -> None:
    """Each secret the fleet file adds to docker-compose.yml's (Redis's, PostgreSQL's) is
    made by the header under umask 077 and given to the containers' user."""
    single = {s["file"].removeprefix("./") for s in COMPOSE["secrets"].values()}
    added = {
        os.path.normpath(Path("deploy") / s["file"]) for s in FLEET["secrets"].values()
    } - single  # fmt: skip
    assert {".kvfence/compose/redis_password", ".kvfence/compose/postgres_password"} <= added
    for path in added:
        [made] = [c for c in HEADERS["fleet"] if c.endswith(f"> {path})")]
        assert made.startswith("(umask 077 && head -c 32 /dev/urandom")
        [given] = [c for c in HEADERS["fleet"] if "chown" in c and c.endswith(path + ")")]
        assert '. ./.env && chown "$KVFENCE_UID:$KVFENCE_GID"' in given


def test_the_fleet_check_uses_the_keys_the_header_makes_and_revokes() -> None:
    """scripts/compose-check restarts Redis and then tries the header's keys: the one it keeps
    must answer, the one it revoked must not. Both are the files the header writes."""
    written = {
        _words(c)[-1].removesuffix(")"): args
        for _, args, c in _fleet_execs()
        if args[:2] == ["keys", "new"]
    }
    kept = f".kvfence/compose/keys/{CHECK.HEADER_KEY}.json"
    revoked = f".kvfence/compose/keys/{CHECK.REVOKED_KEY}.json"
    assert set(written) == {kept, revoked}
    assert all("--json" in args for args in written.values())
    [read_id] = [c for c in HEADERS["fleet"] if c.startswith("OLD_KEY_ID=")]
    assert revoked in read_id
    [revoke] = [args for _, args, _ in _fleet_execs() if args[:2] == ["keys", "revoke"]]
    assert revoke[2] == "$OLD_KEY_ID"


def test_the_header_reads_the_revoked_keys_id_from_what_keys_new_prints(tmp_path: Path) -> None:
    """The id the header revokes is read out of `kvfence keys new --json`'s real output."""
    from tests.kit.gateway import ENV, policy_text

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        policy_text("http://127.0.0.1:9").replace(
            "admin: {host: 127.0.0.1, port: 0}",
            f"admin: {{host: 127.0.0.1, port: 0}}\n  state_dir: {state}",
        )
        + "registry: true\n"
    )
    kvfence = [sys.executable, "-m", "kvfence.cli"]
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    for args in (["tenants", "add", "team1"], ["keys", "new", "--tenant", "team1", "--json"]):
        done = subprocess.run(
            [*kvfence, *args, "--policy", str(policy), "--offline"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    minted = json.loads(done.stdout)
    [read_id] = [c for c in HEADERS["fleet"] if c.startswith("OLD_KEY_ID=")]
    path = re.search(r"\.kvfence/compose/keys/\S+\.json", read_id)
    assert path is not None
    (tmp_path / path.group(0)).parent.mkdir(parents=True)
    (tmp_path / path.group(0)).write_text(done.stdout)
    out = _run([read_id, 'printf %s "$OLD_KEY_ID"'], tmp_path)
    assert out == minted["id"] and out.startswith("key_")


def test_the_postgres_stand_in_takes_what_the_fleet_file_gives_it(tmp_path: Path) -> None:
    """The local image standing in for postgres:17-alpine reads the variables the fleet file
    sets, and its entry point is valid sh; an image with no stand-in here is refused."""
    postgres = FLEET["services"]["postgres"]
    CHECK.write_standin(postgres["image"], tmp_path)
    entrypoint = (tmp_path / "docker-entrypoint.sh").read_text()
    assert subprocess.run(["sh", "-n", str(tmp_path / "docker-entrypoint.sh")]).returncode == 0
    for variable in postgres["environment"]:
        assert variable in entrypoint
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert "PGDATA=/var/lib/postgresql/data" in dockerfile and "EXPOSE 5432" in dockerfile
    assert "scram-sha-256" in entrypoint
    with pytest.raises(CHECK.CheckFailed):
        CHECK.write_standin("mysql:8", tmp_path)


_UNUSED = "qkv: ...; our kernel for generated rows: not used ({}); swiglu rows: any"


@pytest.mark.parametrize(
    ("kernels", "passes"),
    [
        ("qkv: ..., our kernel; generated rows: whole layers in our kernels", True),
        (_UNUSED.format("this CPU (or its cap) lacks avx512_bf16"), True),
        (_UNUSED.format("no C compiler (gcc or cc) on PATH"), False),
        (_UNUSED.format("build failed: /tmp/x.so: failed to map segment from shared"), False),
    ],
)
def test_the_check_fails_a_backend_image_that_cannot_run_our_kernels(
    tmp_path: Path, kernels: str, passes: bool
) -> None:
    record = {"level": "info", "msg": "backend ready to serve", "kernels": kernels}
    log = tmp_path / "backend.log"
    log.write_text(f"backend-1  | starting\nbackend-1  | {json.dumps(record)}\n")
    if passes:
        assert CHECK.backend_kernels(log) == 0
    else:
        with pytest.raises(CHECK.CheckFailed, match="not used"):
            CHECK.backend_kernels(log)


def test_the_check_fails_a_backend_log_without_its_start_up_record(tmp_path: Path) -> None:
    log = tmp_path / "backend.log"
    log.write_text("backend-1  | starting\n")
    with pytest.raises(CHECK.CheckFailed, match="ready to serve"):
        CHECK.backend_kernels(log)
