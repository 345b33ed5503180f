"""`kvfence witness`: keep a gateway's audit log honest from the outside.

  kvfence witness keygen --name NAME --out FILE     a witness key (mode 0600); prints its vkey
  kvfence witness run --url URL --api-key-file F --key-file FILE --name NAME --log-key VKEY
      --state DIR [--log ORIGIN ...]                fetch each log's checkpoint with its
                                                    consistency proof from the last size this
                                                    witness cosigned, check, cosign, hand the
                                                    cosignature back to the gateway
  kvfence witness cosign --key-file FILE --name NAME --log-key VKEY --state DIR BUNDLE
                                                    the same, offline: BUNDLE is `old N`, the
                                                    proof and the note; prints the cosigned note

Exit 0 when every log was cosigned; 1 when one was refused (rolled back, forked, not signed by
the log's key); 2 when an input, the key or the gateway cannot be used.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import orjson

from kvfence.keys.keyfile import KeyFileError, generate_key, load_private_key, write_private_key
from kvfence.keys.secrets import SecretError, from_file
from kvfence.receipts.checkpoint import ConsistencyProof, FormatError
from kvfence.receipts.note import COSIGNATURE, NoteError, Signer, Verifier
from kvfence.receipts.witness import WitnessError, WitnessState, cosign

OK, REFUSED, UNUSABLE = 0, 1, 2
TIMEOUT_S = 30.0


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    keygen = sub.add_parser("keygen", help="create a witness key and print its verifier key")
    keygen.add_argument("--name", required=True, help="the witness's name (e.g. example.com/w1)")
    keygen.add_argument("--out", required=True, type=Path, help="the private key file to write")
    for name, text in (("run", "witness a gateway's logs"), ("cosign", "cosign one bundle")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--key-file", required=True, type=Path, help="the witness's private key")
        cmd.add_argument("--name", required=True, help="the witness's name")
        cmd.add_argument("--log-key", required=True, help="the log's verifier key (vkey)")
        cmd.add_argument("--state", required=True, type=Path, help="the witness's state folder")
        if name == "cosign":
            cmd.add_argument("bundle", type=Path, help="old N, the proof, a blank line, the note")
        else:
            cmd.add_argument("--url", required=True, help="the gateway's base URL")
            cmd.add_argument("--api-key-file", required=True, type=Path, help="an API key")
            cmd.add_argument("--log", action="append", default=[], help="only this log origin")


def _call(request: urllib.request.Request) -> bytes:
    if urllib.parse.urlsplit(request.full_url).scheme not in ("http", "https"):
        raise ValueError(f"--url must be an http or https URL, not {request.full_url}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310
            return bytes(answer.read(1 << 20))
    except urllib.error.HTTPError as exc:
        raise ValueError(f"the gateway answered {exc.code}: {_said(exc.read(1 << 16))}") from None


def _said(body: bytes) -> str:
    """The gateway's own message in an error answer (its `error.message`), else the body."""
    try:
        error = orjson.loads(body)["error"]
        return str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip()[:500] or "(no body)"


def _get(url: str, key: str) -> bytes:
    headers = {"authorization": f"Bearer {key}"}
    return _call(urllib.request.Request(url, headers=headers))  # noqa: S310 (checked in _call)


def _post(url: str, key: str, body: str) -> None:
    headers = {"authorization": f"Bearer {key}", "content-type": "text/plain; charset=utf-8"}
    data = body.encode()
    _call(urllib.request.Request(url, data=data, headers=headers, method="POST"))  # noqa: S310


def _one(args: argparse.Namespace, origin: str, signer: Signer, log_key: Verifier, key: str) -> int:
    state = WitnessState(args.state)
    last = state.last(origin)
    query = urllib.parse.urlencode({"log": origin, "old": last.size if last else 0})
    base = args.url.rstrip("/")
    try:
        bundle = ConsistencyProof.parse(
            _get(f"{base}/v1/kvfence/log/checkpoint?{query}", key).decode()
        )
        done = cosign(bundle, log_key, signer, state)
    except WitnessError as exc:
        print(f"kvfence witness: REFUSED {exc}", file=sys.stderr)
        return REFUSED
    except (FormatError, NoteError) as exc:
        print(f"kvfence witness: REFUSED log {origin}: {exc}", file=sys.stderr)
        return REFUSED
    _post(
        f"{base}/v1/kvfence/log/cosignature?{urllib.parse.urlencode({'log': origin})}",
        key,
        done.note,
    )
    grew = f"from {done.previous} " if done.previous else "first seen, "
    print(f"{origin}: cosigned {done.checkpoint.size} entries ({grew}consistent)")
    return OK


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "keygen":
            key = generate_key()
            write_private_key(args.out, key)
            print(Signer(args.name, COSIGNATURE, key).verifier.vkey)
            return OK
        signer = Signer(args.name, COSIGNATURE, load_private_key(args.key_file))
        log_key = Verifier.parse(args.log_key)
        args.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        if args.action == "cosign":
            bundle = ConsistencyProof.parse(args.bundle.read_text(encoding="utf-8"))
            try:
                print(cosign(bundle, log_key, signer, WitnessState(args.state)).note, end="")
            except WitnessError as exc:
                print(f"kvfence witness: REFUSED {exc}", file=sys.stderr)
                return REFUSED
            return OK
        api_key = from_file(args.api_key_file).decode()
        base = args.url.rstrip("/")
        origins = args.log or [
            log["origin"] for log in orjson.loads(_get(f"{base}/v1/kvfence/log", api_key))["logs"]
        ]
        if not origins:
            print("kvfence witness: the gateway lists no logs", file=sys.stderr)
            return UNUSABLE
        return max(_one(args, o, signer, log_key, api_key) for o in origins)
    except (
        KeyFileError,
        SecretError,
        NoteError,
        FormatError,
        OSError,
        ValueError,
        KeyError,
    ) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"kvfence witness: {reason}", file=sys.stderr)
        return UNUSABLE
