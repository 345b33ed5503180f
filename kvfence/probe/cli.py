"""`kvfence probe`: a black-box cache-isolation scan of an OpenAI-compatible endpoint with two
credentials. Exit 0 isolated, 1 shared, 2 inconclusive (and command-line usage errors),
3 the probe could not run (credential unreadable, endpoint refused, model not served).

Invariant: a key is never printed; stdout carries only the summary (or the JSON report),
stderr only progress and the one-line error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson

from kvfence.probe import credentials
from kvfence.probe.client import Api, Endpoint, Identity, make_sender
from kvfence.probe.decision import EXIT_ERROR
from kvfence.probe.errors import ProbeError, UsageError
from kvfence.probe.method import ProbeConfig, ProbeResult, run_probe
from kvfence.probe.pacing import Pacer, RetryPolicy
from kvfence.probe.plot import _pyplot, write_plot
from kvfence.probe.progress import ProgressBar
from kvfence.probe.report import summary, to_json
from kvfence.probe.stats import TimingTest

DEFAULTS = ProbeConfig()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="e.g. https://api.example.com/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api", choices=[a.value for a in Api], default=Api.CHAT.value)
    credentials.add_options(parser)
    run = parser.add_argument_group("method")
    run.add_argument("--budget", type=int, default=DEFAULTS.budget, help="cross rounds (n per arm)")
    run.add_argument(
        "--max-budget",
        type=int,
        metavar="N",
        help="run up to N cross rounds when the control's measured effect needs more than "
        "--budget for the timing test's power (a noisy host); default: exactly --budget",
    )
    run.add_argument("--control-rounds", type=int, default=DEFAULTS.control_rounds)
    run.add_argument(
        "--prompt-tokens",
        type=int,
        default=DEFAULTS.letters,
        help="prompt length (letters, about tokens)",
    )
    run.add_argument(
        "--partial-tokens",
        type=int,
        default=DEFAULTS.partial_letters,
        help="the partial arm's shared prefix (0: off)",
    )
    run.add_argument(
        "--partial-rounds",
        type=int,
        default=DEFAULTS.partial_rounds,
        help="cross rounds that also run the partial arm",
    )
    run.add_argument(
        "--primes", type=int, default=DEFAULTS.primes, help="times the victim sends its prompt"
    )
    run.add_argument(
        "--alpha", type=float, default=DEFAULTS.alpha, help="significance level of `shared`"
    )
    run.add_argument("--test", choices=[t.value for t in TimingTest], default=DEFAULTS.test.value)
    run.add_argument(
        "--min-effect",
        type=float,
        default=DEFAULTS.min_effect,
        help="share of B's requests that must hit for `isolated` to claim power",
    )
    run.add_argument(
        "--block-tokens",
        type=int,
        default=DEFAULTS.block_tokens,
        help="cached tokens that count as a hit",
    )
    run.add_argument("--timing-only", action="store_true", help="ignore the cached-token counter")
    net = parser.add_argument_group("network")
    net.add_argument("--rate", type=float, default=None, help="requests per second at most")
    net.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    net.add_argument(
        "--retries", type=int, default=4, help="retries per request on 429/5xx/timeouts"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", help="print the JSON report instead of the summary"
    )
    out.add_argument("--report", type=Path, metavar="FILE.json", help="write the JSON report here")
    out.add_argument("--plot", type=Path, metavar="FILE.png", help="plot both time distributions")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _endpoint(args: argparse.Namespace) -> Endpoint:
    parts = urlsplit(args.base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--base-url must be an http(s) URL with a host")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return Endpoint(args.base_url, args.model, Api(args.api), args.timeout)


def _config(args: argparse.Namespace) -> ProbeConfig:
    config = ProbeConfig(
        letters=args.prompt_tokens,
        partial_letters=args.partial_tokens,
        partial_rounds=args.partial_rounds,
        primes=args.primes,
        control_rounds=args.control_rounds,
        budget=args.budget,
        max_budget=args.max_budget,
        alpha=args.alpha,
        test=TimingTest(args.test),
        min_effect=args.min_effect,
        block_tokens=args.block_tokens,
        use_metadata=not args.timing_only,
    )
    try:
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


async def probe(
    endpoint: Endpoint,
    a: Identity,
    b: Identity,
    config: ProbeConfig,
    *,
    rate: float | None = None,
    retries: int = 4,
    progress: ProgressBar | None = None,
) -> ProbeResult:
    """The whole probe with its own HTTP session (one connection: requests go one at a time)."""
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be positive")
    if retries < 0:
        raise UsageError("--retries must be >= 0")
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        send = make_sender(session, endpoint, RetryPolicy(attempts=retries + 1), Pacer(rate))
        try:
            return await run_probe(send, a, b, config, progress=progress)
        finally:
            if progress is not None:
                progress.close()


def main(args: argparse.Namespace) -> int:
    try:
        endpoint, config = _endpoint(args), _config(args)
        a, b = credentials.identities(args)
        if args.plot is not None:
            _pyplot()  # fail before spending requests, not after
        progress = None if args.quiet else ProgressBar()
        result = asyncio.run(
            probe(endpoint, a, b, config, rate=args.rate, retries=args.retries, progress=progress)
        )
        report = to_json(result, endpoint, a, b)
        if args.report is not None:
            args.report.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        if args.plot is not None:
            write_plot(result, args.plot, f"kvfence probe {endpoint.model}")
    except ProbeError as exc:
        print(f"kvfence probe: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nkvfence probe: interrupted; no verdict", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"kvfence probe: error: cannot write output: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(summary(result, endpoint))
    return result.decision.exit_code
