"""Lyceum's answers as one line of text: the API's `detail` (a string, or FastAPI's validation list), or
the title of a proxy's HTML error page. Shared by the client's errors and its retry log line."""

from __future__ import annotations

import json
import re


def one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def detail_text(body: bytes) -> str:
    """The API's `detail` as one line: a string, or FastAPI's list of {loc, msg}; a body that is
    not JSON (a proxy's error page) as its text, tags stripped."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace")
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        return one_line(title.group(1) if title else re.sub(r"<[^>]*>", " ", text))
    detail = data.get("detail", data) if isinstance(data, dict) else data
    if isinstance(detail, list):
        items = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                items.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                items.append(str(item))
        detail = "; ".join(items)
    return one_line(str(detail))
