"""Sphinx configuration of QMQ's documentation.

Built with ``sphinx-build -W -b html docs <output>`` (warnings are errors in
CI).  No extension that needs the network: the build must work offline.
"""

import re
from pathlib import Path

_setup = (Path(__file__).resolve().parent.parent / "setup.py").read_text(encoding="utf-8")
_version = re.search(r'version="([^"]+)"', _setup)

project = "QMQ"
author = "the QMQ developers"
copyright = "the QMQ developers, MIT license"
release = _version.group(1) if _version else "0"
version = ".".join(release.split(".")[:2])

extensions: list[str] = []
exclude_patterns = ["_build"]
root_doc = "index"
highlight_language = "none"
pygments_style = "sphinx"
html_theme = "alabaster"
html_title = f"QMQ {release}"
