"""qmq.js as a package: its TypeScript declarations (qmq.d.ts) and its npm
package.json, both beside it in qmq/web/static.

Without node: the names qmq.js exports, and its classes' public methods,
are the ones qmq.d.ts declares; the versions agree.  With node and
C{npm ci} in tests/browser (which brings typescript): the package packed
with C{npm pack}, installed from the tarball into a new project (no
registry), imported by node, and a program using every declaration type
checked by C{tsc --noEmit} (strict; its C{@ts-expect-error} lines must be
errors).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from twisted.trial import unittest

import qmq

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "qmq" / "web" / "static"
BROWSER = ROOT / "tests" / "browser"
NODE = shutil.which("node")
NPM = shutil.which("npm")
TSC = BROWSER / "node_modules" / "typescript" / "bin" / "tsc"
#: Seconds one npm, node or tsc run may take.
TIMEOUT = 120


def js_exports(text: str) -> set[str]:
    return set(re.findall(r"^export (?:async )?(?:const|function|class) (\w+)", text, re.M))


def dts_exports(text: str) -> set[str]:
    return set(re.findall(r"^export declare (?:const|function|class) (\w+)", text, re.M))


def class_body(text: str, name: str) -> str:
    m = re.search(rf"^export (?:declare )?class {name}\b.*?^}}", text, re.M | re.S)
    assert m, name
    return m.group(0)


def js_methods(text: str, name: str) -> set[str]:
    """A class's public methods and getters in qmq.js (two-space indent)."""
    found = re.findall(r"^  (?:async )?(?:get )?([A-Za-z]\w*)\(", class_body(text, name), re.M)
    return set(found) - {"constructor"}


def dts_members(text: str, name: str) -> set[str]:
    return set(re.findall(r"^  (?:readonly )?([A-Za-z]\w*)[(<?:]", class_body(text, name), re.M))


class DeclarationTests(unittest.TestCase):
    def setUp(self) -> None:
        self.js = (STATIC / "qmq.js").read_text(encoding="utf-8")
        self.dts = (STATIC / "qmq.d.ts").read_text(encoding="utf-8")

    def test_same_exports(self) -> None:
        """Every name qmq.js exports is declared, and nothing else."""
        names = js_exports(self.js)
        self.assertIn("Transaction", names)
        self.assertEqual(dts_exports(self.dts), names)

    def test_methods_declared(self) -> None:
        """Each exported class's public methods are in its declaration."""
        for cls in ("Client", "Transaction", "Subscription", "FrameParser"):
            missing = js_methods(self.js, cls) - dts_members(self.dts, cls)
            self.assertEqual(missing, set(), cls)
        self.assertIn("begin", js_methods(self.js, "Client"))

    def test_versions(self) -> None:
        """package.json, qmq.js's VERSION and QMQ's release agree; the
        package points at the two files and ships only them."""
        pkg = json.loads((STATIC / "package.json").read_text(encoding="utf-8"))
        version = re.search(r'^export const VERSION = "([^"]+)";', self.js, re.M).group(1)
        self.assertEqual((pkg["version"], version), (qmq.__version__, qmq.__version__))
        self.assertEqual(pkg["exports"]["."], {"types": "./qmq.d.ts", "default": "./qmq.js"})
        self.assertEqual(sorted(pkg["files"]), ["qmq.d.ts", "qmq.js"])


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode:
        raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout


class NpmPackageTests(unittest.TestCase):
    if NODE is None or NPM is None:
        skip = "no node and npm on PATH (apt-get install nodejs npm)"
    elif not TSC.exists():
        skip = "tests/browser has no typescript (run: npm ci --prefix tests/browser)"

    def setUp(self) -> None:
        self.project = Path(self.mktemp()).resolve()
        self.project.mkdir()
        tarball = run([NPM, "pack", "--json", "--pack-destination", str(self.project)], STATIC)
        packed = json.loads(tarball)[0]
        self.assertEqual(sorted(f["path"] for f in packed["files"]),
                         ["package.json", "qmq.d.ts", "qmq.js"])
        (self.project / "package.json").write_text(
            json.dumps({"name": "app", "private": True, "type": "module"}), encoding="utf-8")
        run([NPM, "install", "--offline", "--no-audit", "--no-fund", f"./{packed['filename']}"],
            self.project)

    def test_import(self) -> None:
        """Installed from the packed tarball, node imports it by name."""
        out = run([NODE, "--input-type=module", "-e",
                   'import * as q from "@qmq/client"; '
                   "console.log(JSON.stringify([q.VERSION, Object.keys(q).sort(), "
                   "typeof q.Client.prototype.begin]));"], self.project)
        version, names, begin = json.loads(out)
        self.assertEqual(version, qmq.__version__)
        self.assertEqual(set(names), js_exports((STATIC / "qmq.js").read_text(encoding="utf-8")))
        self.assertEqual(begin, "function")

    def test_tsc(self) -> None:
        """A strict TypeScript program using the declarations type-checks;
        without its expected errors it would not (each is needed)."""
        shutil.copy(BROWSER / "qmqjs-usage.ts", self.project / "usage.ts")
        config = {"compilerOptions": {
            "strict": True, "noEmit": True, "target": "es2022", "module": "nodenext",
            "moduleResolution": "nodenext", "lib": ["es2022", "dom"], "types": [],
            "skipLibCheck": False}, "files": ["usage.ts"]}
        (self.project / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
        run([NODE, str(TSC), "--noEmit", "-p", "."], self.project)
        # An expected error that is not one is itself an error: remove the
        # directives and tsc must report exactly those lines.
        text = (self.project / "usage.ts").read_text(encoding="utf-8")
        (self.project / "usage.ts").write_text(text.replace("// @ts-expect-error", "//"),
                                               encoding="utf-8")
        done = subprocess.run([NODE, str(TSC), "--noEmit", "-p", "."], cwd=self.project,
                              capture_output=True, text=True, timeout=TIMEOUT)
        errors = re.findall(r"^usage\.ts\((\d+),", done.stdout, re.M)
        self.assertEqual(len(set(errors)), text.count("// @ts-expect-error"), done.stdout)
