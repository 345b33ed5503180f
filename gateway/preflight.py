"""Start-up checks: refuse to serve on an aiohttp without its C HTTP parser or below 3.14.3."""

from __future__ import annotations

import importlib
import os

import aiohttp
from aiohttp import http_parser

MIN_AIOHTTP = (3, 14, 3)


def problems() -> list[str]:
    found = []
    if os.environ.get("AIOHTTP_NO_EXTENSIONS"):
        found.append("AIOHTTP_NO_EXTENSIONS is set: aiohttp's C HTTP parser is off")
    try:
        c_parser = importlib.import_module("aiohttp._http_parser").HttpRequestParser
    except ImportError:
        found.append("aiohttp's C HTTP parser is not installed")
    else:
        if http_parser.HttpRequestParser is not c_parser:
            found.append("aiohttp is using its pure-Python HTTP parser")
    version = tuple(int(p) for p in aiohttp.__version__.split(".")[:3] if p.isdigit())
    if version < MIN_AIOHTTP:
        found.append(f"aiohttp {aiohttp.__version__} is older than 3.14.3 (known parser CVEs)")
    return found
