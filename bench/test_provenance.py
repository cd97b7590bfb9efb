"""bench/provenance.py: which files are measured code, the digest that
names a commit's measured code, and the table of what each generated
section of PERFORMANCE.md measured (on a throwaway git repository)."""

import ast
import fnmatch
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


class MeasuredCode(unittest.TestCase):
    def test_code_harness_and_build_files_are_measured_docs_tests_and_rendering_are_not(self):
        for p in ("libml/src/runtime/fragments.rs", "Cargo.lock", "Makefile", "bench/bench.py",
                  "scripts/bench-if.sh", "scripts/prepare_models.py", "configs/models.toml",
                  "engines/benches/layout.rs", "python/kneepoint/__init__.py"):
            self.assertTrue(provenance.is_measured(p), p)
        for p in ("README.md", "docs/PERFORMANCE.md", "docs/bench/runs/peers/rep-1/x/summary.json",
                  "tests/switchover.rs", "libml/tests/tx_bell.rs", "fuzz/fuzz_targets/wire.rs", ".ci/run",
                  "bench/test_report.py", "scripts/test_prepare_models.py", "python/tests/test_client.py",
                  "bench/report.py", "bench/provenance.py", ".gitignore"):
            self.assertFalse(provenance.is_measured(p), p)


REPO = Path(__file__).resolve().parent.parent
# Each generated section and the harness script that writes it.
ENTRY = {
    "bench-if-manager": "scripts/bench-if-manager.sh", "bench-idle": "scripts/bench-idle.sh",
    "bench-if-squeezenet": "scripts/bench-if.sh", "bench-if-resnet50-as-designed": "scripts/bench-if.sh",
    "bench-policy": "scripts/bench-policy.sh", "bench-orchestrator": "scripts/bench-orchestrator.sh",
    "bench-client": "bench/bench_client_all.sh", "bench-gateway": "bench/bench_gateway.sh",
    "bench-classify": "scripts/bench-classify.sh", "bench-layout": "scripts/bench-layout.sh",
    "bench-peers": "bench/bench.py",
}


PATH_IN_CODE = re.compile(r"\b((?:bench|scripts)/[\w./-]+\.(?:sh|py))\b")


def runs(path: str, tracked: set[str]) -> set[str]:
    """The repository's harness files PATH runs or imports, not counting
    what its comments and docstrings mention: paths written in its code,
    and for Python the modules of bench/ and bench/peers/ it imports."""
    text = (REPO / path).read_text()
    found = set()
    if path.endswith(".py"):
        tree = ast.parse(text)
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                found.update(PATH_IN_CODE.findall(n.value))
            mods = ([a.name for a in n.names] if isinstance(n, ast.Import)
                    else [n.module] if isinstance(n, ast.ImportFrom) and n.module else [])
            found.update(f"{d}/{m}.py" for m in mods for d in ("bench", "bench/peers"))
    else:
        for line in text.splitlines():
            found.update(PATH_IN_CODE.findall(line.split("#", 1)[0]))
    return {f for f in found if f in tracked}


class Owners(unittest.TestCase):
    def test_every_owned_harness_file_is_in_the_repository(self):
        tracked = set(subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                                     check=True).stdout.split())
        for owned, _ in provenance.OWNERS:
            hit = any(fnmatch.fnmatchcase(t, owned) for t in tracked)
            self.assertTrue(hit, f"OWNERS names {owned}, which is not in the repository")

    def test_each_section_measures_every_harness_file_its_script_reaches(self):
        # An owned file that a section's script runs but OWNERS does not
        # give to it would let that section claim code it ran is "the same".
        tracked = set(subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                                     check=True).stdout.split())
        for section, entry in ENTRY.items():
            seen, todo = set(), [entry]
            while todo:
                f = todo.pop()
                if f in seen:
                    continue
                seen.add(f)
                if provenance.is_measured(f):  # rendering code runs nothing measured
                    todo += runs(f, tracked)
            for f in sorted(seen):
                if provenance.is_measured(f):
                    self.assertTrue(provenance.is_measured(f, section), f"{section} runs {f}")

    def test_a_harness_file_is_measured_by_its_own_sections_the_product_by_all(self):
        m = provenance.is_measured
        for s in ("bench-if-squeezenet", "bench-if-resnet50-as-designed", "bench-policy"):
            self.assertTrue(m("scripts/bench-if.sh", s), s)
        for s in ("bench-peers", "bench-if-manager", "bench-orchestrator"):
            self.assertFalse(m("scripts/bench-if.sh", s), s)
            self.assertFalse(m("bench/bench_if.py", s), s)
        self.assertTrue(m("bench/peers/triton/model.py", "bench-peers"))
        self.assertFalse(m("bench/bench.py", "bench-if-squeezenet"))
        self.assertFalse(m("scripts/gpu-check.sh", "bench-peers"))
        for s in ("bench-peers", "bench-if-manager", "bench-layout"):
            for p in ("libml/src/lib.rs", "Makefile", "bench/host.py", "scripts/netns.sh", "configs/models.toml"):
                self.assertTrue(m(p, s), (p, s))
        self.assertFalse(m("docs/PERFORMANCE.md", "bench-peers"))


class TheMakefile(unittest.TestCase):
    def test_each_recipe_line_is_measured_by_the_sections_that_run_it(self):
        text = (REPO / "Makefile").read_text()
        lines = provenance.makefile_lines
        sq, peers, orch = (lines(text, s) for s in ("bench-if-squeezenet", "bench-peers", "bench-orchestrator"))
        build = next(x for x in lines(text) if x.startswith("$(CARGO) build"))
        bench_if = next(x for x in lines(text) if x.endswith("scripts/bench-if.sh"))
        spin = next(x for x in lines(text) if x.startswith("PEERS_KP_SPIN_MS"))
        for mine in (sq, peers, orch):
            self.assertIn(build, mine)  # building the product: every section's
            self.assertFalse(any(x.startswith("#") for x in mine))
            self.assertFalse(any("cargo test" in x or "$(CARGO) test" in x for x in mine))  # make test: none's
        self.assertIn(bench_if, sq)
        self.assertIn(bench_if, lines(text, "bench-policy"))
        self.assertNotIn(bench_if, peers)
        self.assertNotIn(bench_if, orch)
        self.assertIn(spin, peers)
        self.assertNotIn(spin, sq)
        self.assertTrue(any("bench/bench.py --combine" in x for x in peers))
        self.assertFalse(any("bench/bench.py" in x for x in sq + orch))
        self.assertTrue(any("scripts/bench-orchestrator.sh" in x for x in orch))
        self.assertFalse(any("scripts/bench-orchestrator.sh" in x for x in sq))
        # Continuation lines are one line: the whole variable is bench-peers'.
        self.assertTrue(any(x.startswith("PEERS_RESNET50") and "BENCH_START=" in x for x in peers))
        self.assertFalse(any("BENCH_START=" in x for x in sq))


MAKEFILE = """# The build.
CARGO ?= cargo
build:
\t$(CARGO) build --bins
# A benchmark of the platform, one of the side-by-side.
bench-platform: build
\tscripts/bench-if.sh
\tscripts/bench-orchestrator.sh
PEERS_SPIN ?= 1000
bench-peers: build
\tenv SPIN=$(PEERS_SPIN) bench/bench.py
test: build
\t$(CARGO) test
"""


class OnARepository(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name)
        git(self.repo, "init", "-q")
        git(self.repo, "config", "user.email", "t@example.org")
        git(self.repo, "config", "user.name", "t")

    def tearDown(self):
        self.tmp.cleanup()

    def commit(self, files: dict[str, str]) -> str:
        for p, text in files.items():
            f = self.repo / p
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "x")
        return git(self.repo, "rev-parse", "--short", "HEAD")

    def test_a_results_commit_keeps_the_digest_a_code_commit_changes_it(self):
        a = self.commit({"libml/src/lib.rs": "1", "docs/PERFORMANCE.md": "x"})
        b = self.commit({"docs/PERFORMANCE.md": "y", "tests/t.rs": "t", "bench/report.py": "r"})
        c = self.commit({"libml/src/lib.rs": "2"})
        d = lambda x: provenance.measured_digest(x, self.repo)  # noqa: E731
        self.assertEqual(d(a), d(b))
        self.assertIsNone(d(a + "+dirty"))  # what a dirty tree ran is not known
        self.assertNotEqual(d(b), d(c))
        self.assertIsNone(d("0123456789abc"))
        self.assertEqual(provenance.measured_changes(a, b, self.repo), [])
        self.assertEqual(provenance.measured_changes(a, c, self.repo), ["libml/src/lib.rs"])
        self.assertIsNone(provenance.measured_changes(a, "0123456789abc", self.repo))

    def test_another_benchmarks_harness_leaves_a_sections_code_the_same(self):
        a = self.commit({"libml/src/lib.rs": "1", "bench/bench.py": "p", "scripts/bench-if.sh": "1"})
        b = self.commit({"scripts/bench-if.sh": "2"})
        d = lambda x, s=None: provenance.measured_digest(x, self.repo, s)  # noqa: E731
        self.assertEqual(d(a, "bench-peers"), d(b, "bench-peers"))
        self.assertNotEqual(d(a, "bench-if-squeezenet"), d(b, "bench-if-squeezenet"))
        self.assertNotEqual(d(a), d(b))  # the whole measured code did change
        self.assertEqual(provenance.measured_changes(a, b, self.repo, "bench-peers"), [])
        self.assertEqual(provenance.verdict(a, b, self.repo, "bench-peers"), "the same")
        self.assertEqual(provenance.verdict(a, b, self.repo, "bench-policy"), "differs: scripts (1 file)")

    def test_a_makefile_change_is_measured_by_the_sections_whose_lines_changed(self):
        files = {"bench/bench.py": "p", "scripts/bench-if.sh": "i", "scripts/bench-orchestrator.sh": "o"}
        # Each commit changes one more thing.
        texts = [MAKEFILE]
        for before, after in (("# The build.", "# How it builds."), ("\t$(CARGO) test", "\t$(CARGO) test -q"),
                              ("PEERS_SPIN ?= 1000", "PEERS_SPIN ?= 500"),
                              ("scripts/bench-if.sh", "MODEL=x scripts/bench-if.sh"),
                              ("--bins", "--bins --workspace")):
            texts.append(texts[-1].replace(before, after))
        a = self.commit({**files, "Makefile": texts[0]})
        b = self.commit({"Makefile": texts[2]})
        c = self.commit({"Makefile": texts[3]})
        d = self.commit({"Makefile": texts[4]})
        e = self.commit({"Makefile": texts[5]})
        ch = lambda x, y, s: provenance.measured_changes(x, y, self.repo, s)  # noqa: E731
        dg = lambda x, s=None: provenance.measured_digest(x, self.repo, s)  # noqa: E731
        sections = ("bench-peers", "bench-if-squeezenet", "bench-orchestrator")
        # Comments and the tests' rule: no section's.
        for s in sections:
            self.assertEqual(ch(a, b, s), [], s)
            self.assertEqual(dg(a, s), dg(b, s), s)
        self.assertEqual(dg(a), dg(b))
        # The side-by-side's variable: its own.
        self.assertEqual(ch(b, c, "bench-peers"), ["Makefile"])
        self.assertNotEqual(dg(b, "bench-peers"), dg(c, "bench-peers"))
        for s in ("bench-if-squeezenet", "bench-orchestrator"):
            self.assertEqual(ch(b, c, s), [], s)
            self.assertEqual(dg(b, s), dg(c, s), s)
        # bench-platform's line for bench-if: bench-if's sections' (and bench-policy's).
        self.assertEqual(ch(c, d, "bench-if-squeezenet"), ["Makefile"])
        self.assertEqual(ch(c, d, "bench-policy"), ["Makefile"])
        self.assertEqual(ch(c, d, "bench-peers"), [])
        self.assertEqual(ch(c, d, "bench-orchestrator"), [])
        # The build: every section's.
        for s in sections:
            self.assertEqual(ch(d, e, s), ["Makefile"], s)
            self.assertNotEqual(dg(d, s), dg(e, s), s)
        # Against the work tree.
        (self.repo / "Makefile").write_text(texts[5].replace("PEERS_SPIN ?= 500", "PEERS_SPIN ?= 7"))
        self.assertEqual(ch(e, None, "bench-if-squeezenet"), [])
        self.assertEqual(ch(e, None, "bench-peers"), ["Makefile"])

    def test_the_table_says_which_sections_measured_the_code_as_it_is(self):
        a = self.commit({"libml/src/lib.rs": "1", "if-manager/src/main.rs": "1"})
        b = self.commit({"libml/src/lib.rs": "2", "libml/src/x.rs": "2", "if-manager/src/main.rs": "2"})
        c = self.commit({"docs/x.md": "notes"})
        doc = (f"<!-- provenance:begin -->\nold\n<!-- provenance:end -->\n"
               f"<!-- bench-a:begin (generated) -->\n#### A (2026-11-30 05:40 UTC, commit {a}, CPU, 2 CPUs)\n"
               f"<!-- bench-a:end -->\n"
               f"<!-- bench-b:begin -->\n2026-11-30 20:12 UTC, AMD EPYC, 2 CPUs, git {b}; load\n<!-- bench-b:end -->\n"
               f"<!-- bench-c:begin -->\n3 runs: 2026-11-29 21:15 UTC at {a}; 2026-11-30 09:56 UTC at {b}\n"
               f"<!-- bench-c:end -->\n"
               f"<!-- bench-d:begin -->\nno commit here\n<!-- bench-d:end -->\n")
        self.assertEqual([s["name"] for s in provenance.sections(doc)], ["bench-a", "bench-b", "bench-c", "bench-d"])
        self.assertEqual(provenance.sections(doc)[2]["commits"], [a, b])
        t = provenance.table(doc, c, self.repo)
        self.assertIn(f"| bench-a | {a} | 2026-11-30 05:40 | differs: if-manager (1 file), libml (2 files) |", t)
        self.assertIn(f"| bench-b | {b} | 2026-11-30 20:12 | the same |", t)
        self.assertIn(f"| bench-c | {a}, {b} | 2026-11-29 21:15 – 2026-11-30 09:56 | {a}: differs: if-manager "
                      f"(1 file), libml (2 files); {b}: the same |", t)
        self.assertIn("| bench-d | no commit named | ? | unknown |", t)
        self.assertIn("1 of 4 sections measured the code as it is now.", t)
        self.assertIn(f"Measured code now: commit {c}, digest {provenance.measured_digest(b, self.repo)}", t)
        # Written between its markers only.
        f = self.repo / "P.md"
        f.write_text(doc)
        self.assertTrue(provenance.update(f, "new\n"))
        self.assertEqual(f.read_text(), doc.replace("old\n", "new\n"))
        f.write_text("no markers")
        self.assertFalse(provenance.update(f, "new\n"))


if __name__ == "__main__":
    unittest.main()
