"""Before scripts/up or scripts/sidecar start anything: every port they are about to listen on is
free, or one line per busy port naming it and the option that moves it. Exit 0 or 2.

    check_ports.py SCRIPT OPTION=PORT ...     e.g. check_ports.py scripts/up --port=8080
"""

from __future__ import annotations

import sys

from kvfence.listen import ListenError, check_listen


def main(argv: list[str]) -> int:
    script, *pairs = argv
    busy = 0
    for pair in pairs:
        option, _, port = pair.partition("=")
        what = f"{script} ({option} {port})"
        try:
            check_listen("127.0.0.1", int(port), what, f"choose another: {script} {option} N")
        except ListenError as exc:
            print(f"{script}: {exc}", file=sys.stderr)
            busy += 1
    return 2 if busy else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
