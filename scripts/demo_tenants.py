"""Demo tenants for scripts/up: mints an API key for each (once), writes the digest files that
policies/demo.yaml reads and .kvfence/demo.json for scripts; `--print` shows how to call."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvfence.apikey import key_digest, mint_key

TENANTS = ("acme", "globex")


def create(state: Path, port: int) -> None:
    pepper = (state / "secrets" / "pepper").read_bytes().rstrip(b"\r\n")
    (state / "tenants").mkdir(mode=0o700, exist_ok=True)
    keys = {}
    for tenant in TENANTS:
        key = mint_key()
        (state / "tenants" / f"{tenant}.digests").write_text(key_digest(pepper, key) + "\n")
        keys[tenant] = key
    demo = {"gateway_url": f"http://127.0.0.1:{port}/v1", "model": "smollm2", "keys": keys}
    path = state / "demo.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(demo, out, indent=2)


def show(state: Path) -> None:
    demo = json.loads((state / "demo.json").read_text())
    url, acme = demo["gateway_url"], demo["keys"]["acme"]
    print(f"""
kvfence is up. Gateway: {url}
  tenant acme:   {demo["keys"]["acme"]}
  tenant globex: {demo["keys"]["globex"]}
  (also in {state / "demo.json"})

Try it:
  curl -sS -i {url}/chat/completions \\
    -H "Authorization: Bearer {acme}" -H "Content-Type: application/json" \\
    -d '{{"model": "smollm2", "max_tokens": 32, "temperature": 0,
         "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  .venv/bin/python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{url}", api_key="{acme}")
answer = client.chat.completions.create(
    model="smollm2", max_tokens=32, temperature=0,
    messages=[{{"role": "user", "content": "What is the capital of France?"}}])
print(answer.choices[0].message.content)
PY
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("state", type=Path)
    parser.add_argument("port", type=int, nargs="?", default=8080)
    parser.add_argument("--print", action="store_true", dest="show")
    args = parser.parse_args()
    if args.show:
        show(args.state)
    else:
        create(args.state, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
