"""The hardening figures, measured on whichever checkout is first on `sys.path`, so the
same harness measures the code before and after the change:

    .venv/bin/python -m bench.hardening                       # this checkout
    .venv/bin/python -m bench.hardening --only processes --rounds 110 --label sigkill
    (cd OLD && PYTHONPATH=. python -m bench.hardening --label before)   # with bench/ and
        # tests/kit/{probes,tamper}.py copied into OLD

Prints one JSON object and writes it to bench/results/hardening-LABEL.json. Sections: edge
(raw-socket smuggling probes), body (fields forwarded), handle (a captured handle with another
body), audit (tamper kinds, crash recovery, processes), watcher (bad policy files), logs.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

from tests.fakes.openai_upstream import FakeUpstream  # noqa: E402
from tests.kit.gateway import ENV, KEYS, make_policy, policy_text, run_gateway  # noqa: E402
from tests.kit.probes import (  # noqa: E402
    BAD_POLICY_CONTENT,
    FORWARDED_BEFORE,
    REFUSED,
    chat_body,
)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def exchange(url: str, raw: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    data = b""
    try:
        async with asyncio.timeout(2):
            while chunk := await reader.read(65536):
                data += chunk
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return data


async def edge() -> dict[str, Any]:
    upstream = FakeUpstream()
    await upstream.start()
    gw, runner = await run_gateway(make_policy(upstream.url), upstream)
    logs = Records()
    logging.getLogger().addHandler(logs)
    logging.getLogger().setLevel(logging.DEBUG)
    alone: dict[str, int] = {}
    finding = ("connect_without_key", "connect_with_key", "http10_chunked",
               "http20_request_line", "host_with_space", "host_with_userinfo")  # fmt: skip
    try:
        for name, raw, _status in REFUSED:  # each probe alone on its connection
            before = len(upstream.received)
            await exchange(gw.url, raw)
            alone[name] = len(upstream.received) - before
    finally:
        logging.getLogger().removeHandler(logs)
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
    errors = [r for r in logs.records if r.levelno >= logging.ERROR]
    return {
        "probes": len(REFUSED),
        "probes_reaching_the_upstream": sum(1 for n in alone.values() if n),
        "finding1_variants": len(finding),
        "finding1_variants_reaching_the_upstream": sum(1 for n in finding if alone[n]),
        "error_level_log_lines": len(errors),
        "log_lines": len(logs.records),
        "reached": sorted(k for k, v in alone.items() if v),
    }


async def body() -> dict[str, Any]:
    upstream = FakeUpstream()
    await upstream.start()
    gw, runner = await run_gateway(make_policy(upstream.url), upstream)
    try:
        big = (b'{"model":"smollm2","messages":[{"role":"user","content":"x"}],'
               b'"seed":18446744073709551616}')  # fmt: skip
        await gw.chat("acme", chat_body(**FORWARDED_BEFORE))
        sent = upstream.received[-1].json
        headers = {**gw.auth("acme"), "content-type": "application/json"}
        await gw.session.post(gw.url + "/v1/chat/completions", data=big, headers=headers)
        exact = b"18446744073709551616" in upstream.received[-1].body
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
    parts = sent["messages"][0]["content"]
    nested = ["uuid" in sent["messages"][0], *("uuid" in p or "content_hash" in p for p in parts)]
    forwarded = [k for k in FORWARDED_BEFORE if k in sent]
    return {
        "fields_tried": len(FORWARDED_BEFORE) + 3,
        "fields_forwarded": len(forwarded) + sum(nested),
        "forwarded": forwarded,
        "integer_2_64_exact": exact,
    }


async def handle() -> dict[str, Any]:
    import orjson
    import torch
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from backend.model.load import LoadedModel
    from backend.model.weights import build_llama
    from backend.server import create_app
    from kvfence.handle import HANDLE_HEADER
    from tests.kit.backend_server import make_kit
    from tests.kit.models import TINY, byte_tokenizer, tiny_tensors

    model = build_llama(TINY, tiny_tensors(), torch.device("cpu"), torch.float32)
    kit = make_kit(LoadedModel(model, TINY, byte_tokenizer(), torch.device("cpu"),
                               torch.float32, "tiny"))  # fmt: skip
    victim = orjson.dumps({"model": kit.model, "prompt": "victim", "max_tokens": 1})
    attack = orjson.dumps({"model": kit.model, "prompt": "attacker", "max_tokens": 1})
    takes_body = "body" in inspect.signature(kit.signer.sign).parameters
    extra = {"body": victim} if takes_body else {}
    token = kit.signer.sign("victim-ns", kit.model, "1", "rid-1", "backend-test", **extra)
    async with TestServer(create_app(kit.backend)) as server, ClientSession() as http:
        resp = await http.post(server.make_url("/v1/completions"), data=attack,
                               headers={HANDLE_HEADER: token})  # fmt: skip
        return {"captured_handle_with_another_body": resp.status}


async def watcher() -> dict[str, Any]:
    alive = 0
    for name, content in BAD_POLICY_CONTENT.items():
        with tempfile.TemporaryDirectory() as tmp:
            upstream = FakeUpstream()
            await upstream.start()
            path = Path(tmp) / "p.yaml"
            path.write_text(policy_text(upstream.url))
            gw, runner = await run_gateway(make_policy(upstream.url), upstream, reload_from=path)
            try:
                path.write_bytes(content)
                await asyncio.sleep(0.3)
                text = policy_text(upstream.url)
                cut = text.index("  - {id: globex")
                path.write_text(text[:cut] + text[text.index("  - {id: initech") :])
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    resp = await gw.chat("globex", {"model": "smollm2", "messages": []})
                    if resp.status == 401:
                        alive += 1
                        break
                    await asyncio.sleep(0.1)
                else:
                    print(f"watcher dead after {name}", file=sys.stderr)
            finally:
                await gw.session.close()
                try:
                    await runner.cleanup()
                except Exception as exc:  # the watcher task died with it
                    print(f"watcher task raised {type(exc).__name__}", file=sys.stderr)
                await upstream.close()
    return {"bad_contents": len(BAD_POLICY_CONTENT), "watcher_alive_after": alive}


def _cli(argv: list[str]) -> int:
    from gateway.audit.cli import configure, main

    parser = argparse.ArgumentParser()
    configure(parser)
    with open(os.devnull, "w") as null:
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = null
        try:
            return main(parser.parse_args(argv))
        finally:
            sys.stdout, sys.stderr = stdout, stderr


def _has_anchor() -> bool:
    from gateway.audit.chain.log import AuditLog

    return "anchor" in inspect.signature(AuditLog).parameters


async def tamper() -> dict[str, Any]:
    from tests.kit.tamper import ANCHOR, KINDS, SECRET, build

    anchored = _has_anchor()
    out: dict[str, Any] = {"kinds": len(KINDS)}
    for mode in ("readme_command", "without_anchor") if anchored else ("readme_command",):
        missed, tried = [], 0
        for name, (fn, _) in KINDS.items():
            if name in ANCHOR and (mode == "without_anchor" or not anchored):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                log = await build(Path(tmp), anchor=anchored and mode == "readme_command")
                key = Path(tmp) / "key"
                key.write_bytes(SECRET)
                argv = ["verify", str(log.active), "--key-file", str(key)]
                if log.anchor is not None:
                    argv += ["--anchor", str(log.anchor)]
                assert _cli(argv) == 0, "an intact log must verify"
                try:
                    fn(log)
                except (AssertionError, FileNotFoundError, IndexError):
                    continue  # this kind does not apply to this log format
                tried += 1
                if _cli(argv) == 0:
                    missed.append(name)
        out[mode] = {"tried": tried, "detected": tried - len(missed), "missed": missed}
    return out


async def crash() -> dict[str, Any]:
    from gateway.audit.chain.log import AuditLog
    from tests.kit.tamper import SECRET, record

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        path.write_bytes(b"")
        try:
            AuditLog(path, SECRET).close_sync()
            out["empty_active_file_starts"] = True
        except Exception as exc:  # a measurement: record it
            out["empty_active_file_starts"] = type(exc).__name__
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        for first, count in ((0, 30), (30, 3)):
            log = AuditLog(path, SECRET, rotate_bytes=4096)
            for i in range(first, first + count):
                await log.append(record(i))
            await log.close()
            if first == 0:
                with path.open("ab") as f:
                    f.write(b'{"kind":"rec')
        key = Path(tmp) / "key"
        key.write_bytes(SECRET)
        plain = _cli(["verify", str(path), "--key-file", str(key)])
        rotated = _cli(["verify", str(path), "--rotated", "--key-file", str(key)])
        out["torn_then_restart_verify_exit"] = {"plain": plain, "rotated": rotated}
    return out


def _verify_chains(tmp: Path) -> Any:
    """Each worker's chain verified (with its anchor) and its crash recoveries counted, where
    this checkout has `verify_chain`; else the verdict of `verify --rotated`."""
    from gateway.audit.chain.format import mac_key
    from tests.kit.tamper import SECRET

    try:
        from gateway.audit.chain.verify import verify_chain
    except ImportError:
        key = tmp / "audit.key"
        return [_cli(["verify", str(p), "--rotated", "--key-file", str(key)]) == 0
                for p in sorted((tmp / "audit").glob("audit.w?.jsonl"))]  # fmt: skip
    out = []
    for path in sorted((tmp / "audit").glob("audit.w?.jsonl")):
        anchor = tmp / "anchor" / path.name.replace(".jsonl", ".anchor")
        summaries = verify_chain(path, mac_key(SECRET), anchor)
        out.append({"files": len(summaries), "recoveries": sum(s.recoveries for s in summaries)})
    return out


async def processes(rounds: int) -> dict[str, Any]:
    from tests.kit.audit_processes import chat, gateway_policy, gone, launch, records

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        upstream = FakeUpstream()
        await upstream.start()
        policy, port = gateway_policy(tmp, upstream, _has_anchor()), 18000 + os.getpid() % 1000
        proc, workers = await launch(policy, port)
        proc.kill()
        await proc.wait()
        await asyncio.sleep(5)
        out["workers_serving_5s_after_parent_sigkill"] = sum(not gone(p) for p in workers)
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        completed: list[str] = []
        for round_ in range(rounds):
            proc, _ = await launch(policy, port)
            stop = asyncio.Event()

            async def client(n: int, r: int = round_, stop: asyncio.Event = stop) -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        if await chat(port, f"k{r}-{n}-{i}") == 200:
                            completed.append(f"k{r}-{n}-{i}")
                    except Exception:  # the gateway was just killed
                        return

            tasks = [asyncio.create_task(client(n)) for n in range(4)]
            await asyncio.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)
            stop.set()
            await asyncio.gather(*tasks)
            await proc.wait()
        logged = {r["request_id"] for r in records(tmp)}
        out["chains_verify"] = _verify_chains(tmp)
        out["sigkills"] = rounds
        out["completed"] = len(completed)
        out["completed_missing_from_log"] = len(set(completed) - logged)
        await upstream.close()
    return out


async def logs() -> dict[str, Any]:
    upstream = FakeUpstream()
    await upstream.start()
    gw, runner = await run_gateway(make_policy(upstream.url), upstream)
    records = Records()
    root = logging.getLogger()
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    try:
        await gw.chat("acme", {"model": "smollm2", "messages": []}, **{"api-key": KEYS["globex"]})
    finally:
        root.removeHandler(records)
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
    text = "\n".join(str(r.__dict__) for r in records.records)
    return {"azure_api_key_in_debug_log": KEYS["globex"] in text}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(ENV)
    figures: dict[str, Any] = {"label": args.label}
    for name, section in (("edge", edge), ("body", body), ("handle", handle),
                          ("watcher", watcher), ("tamper", tamper), ("crash", crash),
                          ("logs", logs)):  # fmt: skip
        if args.only and name not in args.only:
            continue
        try:
            figures[name] = await section()
        except Exception as exc:  # a section the checkout cannot run
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if args.only and "processes" not in args.only:
        return figures
    try:
        figures["processes"] = await processes(args.rounds)
    except Exception as exc:  # the checkout cannot run it
        figures["processes"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--rounds", type=int, default=3, help="SIGKILL rounds")
    parser.add_argument("--only", nargs="*", help="sections to run (default: all)")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    text = json.dumps(figures, indent=2)
    print(text)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / f"hardening-{args.label}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
