# -*- test-case-name: tests.test_web_console -*-
"""C{/console}: the web console, a static page (C{static/console/}).

The page holds no power of its own: its script calls the site's JSON API
(C{/api/v1}) and C{/metrics} with the credentials its user types in, kept
in the page's memory (no cookie, so no request the browser makes on its
own carries them: nothing for a cross-site request to borrow). What each
user sees and may do is what the API allows that user
(docs/console.rst).

The files are served as the site's other files (L{StaticFile}), with
headers that keep the page to itself: a Content-Security-Policy that loads
scripts, styles and data from this origin only and forbids framing (a
framed console could be clicked through by another site), and no
C{Referer}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.web.resource import Resource

from qmq.web.site import StaticFile

__all__ = ["CONSOLE", "CSP", "ConsoleFiles", "console_resource"]

#: The console's files.
CONSOLE = Path(__file__).parent / "static" / "console"

#: Everything from this origin, nothing inline, never in a frame.
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def console_resource(ctx: Any) -> Resource:
    """The resource mounted at C{/console} (L{qmq.web.site.MOUNTS})."""
    return ConsoleFiles(CONSOLE)


class ConsoleFiles(StaticFile):
    """The console's files, with the headers above."""

    def render(self, request: Any) -> bytes:
        request.setHeader(b"content-security-policy", CSP)
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"referrer-policy", b"no-referrer")
        return super().render(request)
