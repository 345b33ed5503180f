"""What scripts/compose-check needs beyond bash: a compose file's header commands as a script,
a throwaway copy of the checkout, local stand-ins for public images Docker Hub cannot serve here,
the checks through a running stack, and the audit record count.

Standard library only: it runs with the host's python3 before any virtual environment exists.
A header command is a comment line indented by three spaces (`#   CMD`); a command ending in `\\`
goes on over the next comment lines. The commands are kept exactly as written.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

COMMAND = re.compile(r"^#   (\S.*)$")
TIMEOUT_S = 120  # one answer from a small CPU backend, with room for a loaded machine
# Long enough to fill several whole cache blocks (16 tokens each on our backend).
TEXT = (
    "Summarise the following notes for a colleague who missed the meeting. The team reviewed "
    "the quarterly plan for the storage service, agreed to move the nightly compaction job to "
    "the early morning window, and asked the on-call engineer to document the restore drill. "
    "Two open questions remain: whether the cache tier needs a second region before the "
    "holiday traffic peak, and who owns the alerting rules after the reorganisation."
)
BURST, CONCURRENT = 12, 8  # the fleet policy's tenant limit: `concurrent: 8`
# Each file as its header runs it, from the stack's root; the fleet's two gateways.
SINGLE = ["docker", "compose"]
FLEET = ["docker", "compose", "--env-file", ".env", "-f", "deploy/compose.fleet.yml"]
GATEWAYS = ("gateway-a", "gateway-b")
SETTLE_S = 120  # Redis back and both gateways ready again; a revocation seen by both
# The registry keys the fleet header makes (.kvfence/compose/keys/NAME.json): kept, and revoked.
HEADER_KEY, REVOKED_KEY = "team1", "team1-old"


class CheckFailed(Exception):
    """A check did not hold: one line saying what was expected and what came."""


def header_commands(path: Path) -> list[str]:
    """The commands of the file's leading comment block, in order, continuations joined with
    their backslash-newline as written."""
    commands: list[str] = []
    going_on = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if going_on:
            commands[-1] += "\n" + line.removeprefix("#").removeprefix("   ")
        elif match := COMMAND.match(line):
            commands.append(match.group(1))
        else:
            continue
        going_on = commands[-1].endswith("\\")
    return commands


def header_script(path: Path) -> str:
    """Bash that runs each command in the current shell (its variables carry over to the next),
    its output in "$HEADER_LOG/N"; `header_step` and `header_done` are the caller's hooks."""
    out = []
    for n, command in enumerate(header_commands(path), 1):
        out.append(f"header_step {n} {shlex.quote(command)}")
        out.append(f'{{ {command}\n}} </dev/null >"$HEADER_LOG/{n}" 2>&1')
        out.append(f"header_done {n}")
    return "\n".join(out) + "\n"


def copy_tree(src: Path, dest: Path) -> int:
    """The checkout's tracked and untracked-but-not-ignored files (what a commit of the working
    tree would hold), never its ignored state such as .kvfence/ or .env."""
    git = ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    # A fixed argument list; git from PATH, as the person or CI running the check has it.
    listed = subprocess.run(git, check=True, capture_output=True).stdout  # noqa: S603
    count = 0
    for name in filter(None, listed.decode().split("\0")):
        source = src / name
        if not source.is_file() or source.is_symlink():
            continue  # deleted in the working tree, or a link out of it
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode & 0o777)
        count += 1
    return count


# Stand-ins: a build context (Dockerfile and files) per public image name, built FROM the local
# base image (build argument BASE) with Debian's packages. Not the real images (Debian's
# versions, not Alpine), but they take the same environment and paths the compose files use.
_POSTGRES_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
RUN mkdir -p /etc/postgresql-common/createcluster.d \\
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/none.conf \\
 && apt-get update -q \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \\
      postgresql libnss-wrapper \\
 && rm -rf /var/lib/apt/lists/* /etc/postgresql /var/lib/postgresql/* \\
 && ln -s "$(ls -d /usr/lib/postgresql/* | sort -V | tail -n1)" /usr/lib/postgresql/current \\
 && install -d -o postgres -g postgres -m 1777 /var/lib/postgresql/data \\
 && install -d -o postgres -g postgres -m 3777 /var/run/postgresql
COPY docker-entrypoint.sh /usr/local/bin/
ENV PATH=/usr/lib/postgresql/current/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
"""
_POSTGRES_ENTRYPOINT = """\
#!/bin/sh
# The postgres image's contract: the first start makes a cluster in PGDATA owned by whoever runs
# this (POSTGRES_USER, its password from POSTGRES_PASSWORD_FILE or POSTGRES_PASSWORD, and
# POSTGRES_DB); network clients need the password (scram), the local socket is trusted.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE"); fi
if ! getent passwd "$(id -u)" >/dev/null; then
  # initdb wants a name for its uid, and the root file system may be read-only.
  NSS_WRAPPER_PASSWD=$(mktemp) NSS_WRAPPER_GROUP=$(mktemp)
  echo "postgres:x:$(id -u):$(id -g):PostgreSQL:$PGDATA:/bin/false" >"$NSS_WRAPPER_PASSWD"
  echo "postgres:x:$(id -g):" >"$NSS_WRAPPER_GROUP"
  LD_PRELOAD=$(ls /usr/lib/*/libnss_wrapper.so)
  export NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP LD_PRELOAD
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "set POSTGRES_PASSWORD_FILE (or POSTGRES_PASSWORD): no cluster without a password" >&2
    exit 1
  fi
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  pwfile=$(mktemp) && printf '%s\\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 \\
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -c "CREATE DATABASE \\"$db\\"" >/dev/null
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "made the cluster in $PGDATA: user $user, database $db"
fi
exec "$@"
"""
STANDINS: dict[str, dict[str, str]] = {
    "postgres": {"Dockerfile": _POSTGRES_DOCKERFILE, "docker-entrypoint.sh": _POSTGRES_ENTRYPOINT},
}


def write_standin(image: str, dest: Path) -> None:
    """The build context of `image`'s stand-in in `dest`; CheckFailed when none is known."""
    files = STANDINS.get(image.split(":", 1)[0])
    if files is None:
        raise CheckFailed(f"no stand-in known here for {image}")
    for name, text in files.items():
        (dest / name).write_text(text)
        (dest / name).chmod(0o755 if name.endswith(".sh") else 0o644)


def _call(
    url: str, key: str = "", body: dict[str, Any] | None = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    if not url.startswith("http://"):
        raise CheckFailed(f"{url}: the stacks answer plain HTTP on this host")
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 (http only)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310
            status, got, raw = resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:  # an error answer holds its connection until closed
            status, got, raw = exc.code, dict(exc.headers.items()), exc.read()
    lowered = {k.lower(): v for k, v in got.items()}
    try:
        parsed = json.loads(raw) if raw.strip().startswith(b"{") else {"text": raw.decode()}
    except json.JSONDecodeError:
        parsed = {"text": raw.decode(errors="replace")}
    return status, lowered, parsed


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)
    print(f"    ok: {what}", flush=True)


def _chat(url: str, key: str, content: str, user: str = "", max_tokens: int = 4) -> Any:
    body: dict[str, Any] = {"model": "smollm2", "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    if user:
        body["user"] = user
    return _call(url + "/v1/chat/completions", key, body)


def _answered(status: int, headers: dict[str, str], body: dict[str, Any], who: str) -> int:
    if status != 200:
        raise CheckFailed(f"{who}: expected 200, got {status}: {json.dumps(body)[:300]}")
    verdict = headers.get("x-kvfence-verdict")
    _expect(verdict == "clean", f"{who}: answered, x-kvfence-verdict: {verdict}")
    details = body.get("usage", {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens", 0))


def check_isolation(url: str, keys: dict[str, str]) -> int:
    """acme's repeated prompt hits its own cache; globex's copy of it hits nothing. Returns the
    number of answers (audit records) it caused."""
    # A fresh prompt, and a fresh end user of globex's: neither namespace has cached anything
    # (the chat template's opening is the same in every prompt), so only a leak could hit.
    nonce = uuid.uuid4().hex
    content = f"Meeting {nonce}. {TEXT}"
    first = _answered(*_chat(url, keys["acme"], content), "acme, first")
    _expect(first == 0, f"acme's first request: {first} cached tokens (a new prompt)")
    again = _answered(*_chat(url, keys["acme"], content), "acme, repeated")
    _expect(again > 0, f"acme's repeat: {again} cached tokens (its own cache)")
    user = f"user-{nonce}"
    other = _answered(*_chat(url, keys["globex"], content, user=user), "globex, same prompt")
    _expect(other == 0, f"globex's copy of acme's prompt: {other} cached tokens")
    status, _, body = _chat(url, keys["globex"], content)
    code = body.get("error", {}).get("code")
    _expect(
        (status, code) == (400, "missing_scope_value"), f"globex without `user`: {status} {code}"
    )
    status, _, body = _call(url + "/v1/models", keys["acme"])
    models = [m.get("id") for m in body.get("data", [])]
    _expect(status == 200 and models == ["smollm2"], f"acme's /v1/models: {status} {models}")
    return 3


def check_admin(admin: str, token: str, fleet: bool) -> None:
    status, _, _ = _call(admin + "/status")
    _expect(status == 401, f"{admin}/status without the admin token: {status}")
    status, _, body = _call(admin + "/status", token)
    _expect(status == 200 and body.get("ready") is True, f"{admin}/status with it: {status}, ready")
    if fleet:
        shared = body.get("shared") or {}
        _expect(shared.get("up") is True, f"{admin}: shared state (Redis) up")
        status, _, body = _call(admin + "/metrics", token)
        answered = sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.get("text", "").splitlines()
            if line.startswith("kvfence_gateway_requests_total{")
        )
        _expect(answered > 0, f"{admin}: this gateway answered {answered:g} requests")


def check_shared_limit(url: str, key: str) -> int:
    """acme's `concurrent` limit holds across both gateways (kept in Redis): of a burst spread
    over them by the balancer, at most the limit is admitted, where each gateway on its own
    would admit all. Returns the number admitted (audit records)."""
    content = f"Count slowly from one to fifty. {uuid.uuid4().hex}"
    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(lambda _: _chat(url, key, content, max_tokens=24), range(BURST)))
    statuses = sorted(status for status, _, _ in answers)
    codes = {b.get("error", {}).get("code") for s, _, b in answers if s == 429}
    admitted = statuses.count(200)
    _expect(
        admitted <= CONCURRENT and statuses.count(429) == BURST - admitted
        and codes <= {"rate_limit_exceeded"},
        f"a burst of {BURST}: {admitted} admitted, {BURST - admitted} refused 429 (limit "
        f"{CONCURRENT} in flight, shared through Redis)",
    )  # fmt: skip
    return admitted


# Asks one gateway directly, from inside its container (only the load balancer publishes a port):
# the request (key, path, JSON body or null) read from stdin, the key never on a command line;
# prints the status, the receipt id and the body's exact bytes (base64).
_REQUEST_IN_GATEWAY = """\
import base64, json, sys, urllib.error, urllib.request
ask = json.loads(sys.stdin.read())
headers = {"Authorization": "Bearer " + ask["key"]}
data = None
if ask["body"] is not None:
    data, headers["Content-Type"] = json.dumps(ask["body"]).encode(), "application/json"
request = urllib.request.Request("http://127.0.0.1:8080" + ask["path"], data, headers)
try:
    with urllib.request.urlopen(request, timeout=120) as resp:
        status, got, raw = resp.status, resp.headers, resp.read()
except urllib.error.HTTPError as exc:
    status, got, raw = exc.code, exc.headers, exc.read()
print(json.dumps({"status": status, "receipt_id": got.get("x-kvfence-receipt-id"),
                  "body": base64.b64encode(raw).decode()}))
"""


def _compose(*args: str, stdin: str = "", stack: list[str] = FLEET) -> str:
    # A fixed argument list; docker from PATH, as the person or CI running the check has it.
    done = subprocess.run(  # noqa: S603
        [*stack, *args], input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if done.returncode != 0:
        raise CheckFailed(f"`{shlex.join(['docker compose', *args])}`: {done.stderr.strip()}")
    return done.stdout.strip()


def _at(service: str, key: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to `service`'s own listener: {status, receipt_id, raw (the body's bytes)}."""
    ask = json.dumps({"key": key, "path": path, "body": body})
    out = _compose("exec", "-T", service, "python", "-c", _REQUEST_IN_GATEWAY, stdin=ask)
    got: dict[str, Any] = json.loads(out.splitlines()[-1])
    got["raw"] = base64.b64decode(got.pop("body"))
    return got


def _status_at(service: str, key: str) -> int:
    return int(_at(service, key, "/v1/models")["status"])


def _started_at(container: str) -> str:
    inspect = ["docker", "inspect", "-f", "{{.State.StartedAt}}", container]
    return subprocess.run(inspect, capture_output=True, text=True, check=True).stdout  # noqa: S603


def _until(what: str, holds: Any) -> None:
    """Polls `holds()` until true or SETTLE_S pass (a change takes a moment to reach both)."""
    deadline = time.monotonic() + SETTLE_S
    while not holds():
        if time.monotonic() > deadline:
            raise CheckFailed(f"not within {SETTLE_S} s: {what}")
        time.sleep(1)
    print(f"    ok: {what}", flush=True)


def _keys_answer(keys: dict[str, tuple[str, int]], when: str) -> None:
    """Each of `keys` (label -> key, the status expected) answers so on both gateways."""
    for label, (key, expected) in keys.items():
        for service in GATEWAYS:
            _until(
                f"{when}: {label} on {service}: {expected}",
                lambda s=service, k=key, e=expected: _status_at(s, k) == e,
            )


def _ready(admins: list[str], token: str, fleet: bool = True) -> bool:
    for admin in admins:
        try:
            status, _, body = _call(admin + "/status", token)
        except (urllib.error.URLError, OSError):
            return False  # restarting: not listening yet
        if status != 200 or body.get("ready") is not True:
            return False
        if fleet and (body.get("shared") or {}).get("up") is not True:
            return False
    return True


def check_redis_restart(url: str, state: Path, admins: list[str], token: str) -> int:
    """What must last is not in Redis: after Redis restarts empty, a registry key made before
    still answers on both gateways, one revoked before stays 401 on both, and a tenant is
    answered through the balancer. The keys are the ones the fleet header made and revoked
    (HEADER_KEY, REVOKED_KEY). Returns the answers it caused (audit records)."""
    made = {
        name: json.loads((state / "keys" / f"{name}.json").read_text())["api_key"]
        for name in (HEADER_KEY, REVOKED_KEY)
    }
    keys = {
        f"the header's key {HEADER_KEY}": (made[HEADER_KEY], 200),
        f"the key it revoked, {REVOKED_KEY}": (made[REVOKED_KEY], 401),
    }
    _keys_answer(keys, "before Redis restarts")
    redis = _compose("ps", "-q", "redis")
    before = _started_at(redis)
    _compose("restart", "redis")
    _expect(_started_at(redis) != before, "Redis restarted (its memory and tmpfs gone)")
    _until("both gateways ready, Redis up again", lambda: _ready(admins, token))
    _keys_answer(keys, "after Redis restarted empty")
    acme = (state / "keys" / "acme").read_text().strip()
    _answered(*_chat(url, acme, f"After the restart. {uuid.uuid4().hex}"), "acme, after")
    return 1


def _receipt(url: str, key: str, receipt_id: str, what: str = "") -> tuple[int, dict[str, Any]]:
    status, _, body = _call(f"{url}/v1/kvfence/receipts/{receipt_id}{what}", key)
    return status, body


def check_receipts(url: str, keys: dict[str, str], admin: str, token: str) -> int:
    """An answer names its receipt; its tenant fetches it and its proof, the other tenant gets
    the 404 of an unknown id; after the gateway restarts, the receipt is still served (the
    control database is on a volume). Returns the answers it caused (audit records)."""
    status, headers, body = _chat(url, keys["acme"], f"A receipt, please. {uuid.uuid4().hex}")
    receipt_id = headers.get("x-kvfence-receipt-id", "")
    _expect(status == 200 and receipt_id.startswith("rcpt_"), f"acme's answer: {receipt_id}")
    status, body = _receipt(url, keys["acme"], receipt_id)
    _expect(
        status == 200 and body.get("receipt_id") == receipt_id,
        f"acme fetches {receipt_id}: {status}",
    )
    status, proof = _receipt(url, keys["acme"], receipt_id, "/proof")
    _expect(
        status == 200 and proof.get("text", "").startswith("c2sp.org/tlog-proof@v1\n"),
        f"acme fetches its proof: {status}",
    )
    status, body = _receipt(url, keys["globex"], receipt_id)
    code = body.get("error", {}).get("code")
    _expect(status == 404, f"globex asks for acme's receipt: {status} {code}")
    gateway = _compose("ps", "-q", "gateway", stack=SINGLE)
    before = _started_at(gateway)
    _compose("restart", "gateway", stack=SINGLE)
    _expect(_started_at(gateway) != before, "the gateway restarted")
    _until("the gateway ready again", lambda: _ready([admin], token, fleet=False))
    status, body = _receipt(url, keys["acme"], receipt_id)
    _expect(
        status == 200 and body.get("receipt_id") == receipt_id,
        f"after the restart, acme fetches {receipt_id}: {status}",
    )
    return 1


def check_receipts_across(state: Path, key: str) -> int:
    """A receipt issued through gateway-a is served, with its proof, by gateway-b (both keep
    receipts in PostgreSQL), and verifies offline against the log key's fingerprint with the
    answer's exact bytes. Returns the answers it caused (audit records)."""
    issuing, other = GATEWAYS
    content = f"Which replica answered? {uuid.uuid4().hex}"
    body = {"model": "smollm2", "max_tokens": 4,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    answer = _at(issuing, key, "/v1/chat/completions", body)
    receipt_id = answer["receipt_id"] or ""
    _expect(
        answer["status"] == 200 and receipt_id.startswith("rcpt_"),
        f"acme's answer through {issuing}: {receipt_id}",
    )
    receipt = _at(other, key, f"/v1/kvfence/receipts/{receipt_id}")
    _expect(
        receipt["status"] == 200 and json.loads(receipt["raw"])["receipt_id"] == receipt_id,
        f"{other} serves {issuing}'s receipt: {receipt['status']}",
    )
    proof = _at(other, key, f"/v1/kvfence/receipts/{receipt_id}/proof")
    _expect(proof["status"] == 200, f"{other} serves its proof: {proof['status']}")
    keyset = _at(other, key, "/v1/kvfence/keys")
    folder = state / "fleet-receipt"
    folder.mkdir(exist_ok=True)
    files = {"receipt.json": receipt, "receipt.tlog-proof": proof, "response.json": answer,
             "keyset.json": keyset}  # fmt: skip
    for name, got in files.items():
        (folder / name).write_bytes(got["raw"])
    # docker-compose.yml's `kvfence` service: it sees .kvfence/compose/ as its working directory.
    tool = ["run", "--rm", "-T", "kvfence"]
    fingerprint = _compose(*tool, "keys", "fingerprint", "fleet-receipt/keyset.json", stack=SINGLE)
    verified = _compose(
        *tool, "receipt", "verify", "fleet-receipt/receipt.json", "--proof",
        "fleet-receipt/receipt.tlog-proof", "--response", "fleet-receipt/response.json",
        "--fingerprint", fingerprint, stack=SINGLE,
    )  # fmt: skip
    _expect(
        f"receipt {receipt_id}: verified;" in verified,
        f"{issuing}'s receipt, from {other}, verified against {fingerprint[:23]}...",
    )
    return 1


def probe(args: argparse.Namespace) -> int:
    state = Path(args.state)
    keys = {t: (state / "keys" / t).read_text().strip() for t in ("acme", "globex")}
    token = (state / "admin_token").read_text().strip()
    answered = check_isolation(args.url, keys)
    if args.fleet:
        answered += check_shared_limit(args.url, keys["acme"])
    for admin in args.admin:
        check_admin(admin, token, args.fleet)
    if args.fleet:
        answered += check_receipts_across(state, keys["acme"])
        answered += check_redis_restart(args.url, state, args.admin, token)
    else:
        answered += check_receipts(args.url, keys, args.admin[0], token)
    Path(args.answered).write_text(f"{answered}\n")
    return 0


def audit_records(args: argparse.Namespace) -> int:
    """Each `audit verify` output names its records; together they hold at least what the
    probe caused, and every output counts some."""
    counts = []
    for log in args.logs:
        text = Path(log).read_text()
        found = [int(n) for n in re.findall(r"^(?:\S+: )?ok: (\d+) records", text, re.M)]
        if not found or "FAILED" in text:
            raise CheckFailed(f"`audit verify` ({log}) counted no intact chain:\n{text}")
        counts.append(sum(found))
    least = int(Path(args.answered).read_text())
    _expect(
        all(counts) and sum(counts) >= least,
        f"audit verify: {' + '.join(map(str, counts))} records (at least {least} from the checks)",
    )
    return 0


def backend_kernels(log: Path) -> int:
    """The backend container's start-up record names the kernels it runs, and the image gave it
    what our own need (a compiler, a library it may load): where they are not used, it is for
    the host's CPU alone."""
    ready = []
    for line in log.read_text(errors="replace").splitlines():
        start = line.find("{")
        try:
            record = json.loads(line[start:]) if start >= 0 else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("msg") == "backend ready to serve":
            ready.append(record)
    _expect(bool(ready), f"the backend's log has its `backend ready to serve` record ({log})")
    kernels = str(ready[-1].get("kernels", ""))
    why = re.search(r"our kernel for generated rows: not used \((.*?)\);", kernels)
    host = ("this CPU", "not built for")  # reasons of the host's CPU, not of the image
    _expect(
        why is None or why.group(1).startswith(host),
        "our kernels, where this CPU runs them: "
        + (f"not used ({why.group(1)})" if why else "used"),
    )
    print(f"    backend kernels: {kernels}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="compose_check.py")
    sub = parser.add_subparsers(dest="action", required=True)
    header = sub.add_parser("header", help="print a compose file's header commands as bash")
    header.add_argument("file", type=Path)
    copy = sub.add_parser("copy", help="copy the checkout's files (not its ignored state)")
    copy.add_argument("src", type=Path)
    copy.add_argument("dest", type=Path)
    check = sub.add_parser("probe", help="the checks through a running stack")
    check.add_argument("--url", required=True)
    check.add_argument("--admin", action="append", default=[])
    check.add_argument("--state", required=True, help="the stack's .kvfence/compose")
    check.add_argument("--fleet", action="store_true")
    check.add_argument("--answered", required=True, help="write the answers caused here")
    standin = sub.add_parser("standin", help="write the build context of an image's stand-in")
    standin.add_argument("image", help="NAME:TAG, e.g. postgres:17-alpine")
    standin.add_argument("dest", type=Path, help="an empty folder")
    audit = sub.add_parser("audit", help="check `audit verify` outputs against the answers")
    audit.add_argument("--answered", required=True)
    audit.add_argument("logs", nargs="+")
    kernels = sub.add_parser("kernels", help="the backend's start-up record names its kernels")
    kernels.add_argument("log", type=Path, help="the backend container's log")
    args = parser.parse_args(argv)
    try:
        if args.action == "header":
            sys.stdout.write(header_script(args.file))
            return 0
        if args.action == "copy":
            print(f"{copy_tree(args.src, args.dest)} files")
            return 0
        if args.action == "standin":
            write_standin(args.image, args.dest)
            return 0
        if args.action == "kernels":
            return backend_kernels(args.log)
        return probe(args) if args.action == "probe" else audit_records(args)
    except (CheckFailed, OSError, subprocess.SubprocessError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
