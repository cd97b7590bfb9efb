"""Which code each generated section of docs/PERFORMANCE.md measured.

A benchmark measures the *measured code*: every tracked file that can
change what a run does or finds (the crates, the Python package, the
models' recipe, configs, the harness's scripts and measuring code, the
build files). It does not measure documentation, tests, fuzz targets, CI
or the code that only renders a report from a run's saved results. Two
commits whose measured code is identical are one record, however many
commits of documentation lie between them, so runs taken in different
sessions (each session commits its own run's results) still combine into
one series; two commits whose measured code differs are not, even when
the difference looks harmless.

Most harness files are one benchmark's own (`OWNERS`): a change to
bench-if's script is measured by the bench-if sections (and the batching
policy's, which runs it), not by the side-by-side with the peers. Each
section's measured code is the rest of the measured code plus its own
harness files, so that a series of runs taken over several sessions is
not broken by work on another benchmark's harness. A file not in
`OWNERS` (the product, the models' recipe, the shared harness helpers)
is measured by every section. The Makefile is measured line by line
(`makefile_lines`): a recipe line that runs one benchmark's harness is
that benchmark's sections', the side-by-side's rule and variables are
its own (`MAKEFILE_OWNERS`), rules no benchmark runs (the tests, the
demo, the tools) and comments are no section's, the rest (build, models,
their variables) every section's.

`measured_digest` names the measured code of a commit (a hash over its
measured files' blob ids), of every section or of one; `measured_changes`
lists the measured files that differ between two commits. `python3 bench/provenance.py [--update]`
reads the commit each generated section names, compares its measured
code with HEAD's and prints (or writes, between the `provenance` markers)
a table of what each section measured, so that which numbers still
describe the product is computed, not asserted by hand.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "PERFORMANCE.md"

# Folders whose files a benchmark never runs.
NOT_MEASURED_DIRS = ("docs/", ".ci/", ".github/", "tests/", "fuzz/", "python/tests/")
# Single files that only document, lint or render.
NOT_MEASURED_FILES = (".gitignore", "bench/report.py", "bench/provenance.py")


# Harness files that only some sections run (shell-style patterns over
# repository paths, `*` crossing folders), and those sections (a regular
# expression over section names, matched whole). What a harness script
# runs is its own too: bench-policy runs scripts/bench-if.sh. GPU files
# are measured by no section of PERFORMANCE.md (the GPU's figures are in
# docs/bench/gpu/).
_IF = r"bench-if-(?!manager$).+"
OWNERS: tuple[tuple[str, str], ...] = (
    ("scripts/bench-if.sh", f"{_IF}|bench-policy"),
    ("bench/bench_if.py", f"{_IF}|bench-policy"),
    ("scripts/bench-policy.sh", "bench-policy"),
    ("bench/policy_report.py", "bench-policy"),
    ("scripts/bench-orchestrator.sh", "bench-orchestrator"),
    ("bench/bench_orchestrator.py", "bench-orchestrator"),
    ("scripts/bench-if-manager.sh", "bench-if-manager"),
    ("scripts/bench-idle.sh", "bench-idle"),
    ("bench/bench_client*", "bench-client"),
    ("bench/client_report.py", "bench-client"),
    ("bench/bench_gateway.*", "bench-gateway"),
    ("bench/platform.sh", "bench-client|bench-gateway"),
    ("scripts/bench-classify.sh", "bench-classify"),
    ("if-manager/benches/*", "bench-classify"),
    ("scripts/bench-layout.sh", "bench-layout"),
    ("libml/benches/*", "bench-layout"),
    ("scripts/criterion-section.sh", "bench-classify|bench-layout"),
    ("bench/criterion_report.py", "bench-classify|bench-layout"),
    ("bench/bench.py", "bench-peers"),
    ("bench/capacity_search.py", "bench-peers"),
    ("bench/engine_limit.py", "bench-peers|bench-gateway"),
    ("bench/schedule_bound.py", "bench-peers"),
    ("bench/hindsight.py", "bench-peers"),
    # The engine limit's model wrapper: bench-gateway's SLO runs it too.
    ("bench/peers/kp_peer_model.py", "bench-peers|bench-gateway"),
    ("bench/peers/*", "bench-peers"),
    ("bench/gpu-check/*", "gpu-.+"),
    ("scripts/gpu[-_]*", "gpu-.+"),
    ("scripts/knee.py", "gpu-.+"),
)


# The Makefile's parts that only some sections run: a rule (its target
# line and recipe) or a variable, by the rule's first target or the
# variable's name (a regular expression, matched whole), and the sections
# that run it (as in OWNERS); NOBODY for rules that no benchmark runs and
# the variables only they use. The rest of the Makefile is every section's.
NOBODY = r"(?!)"
MAKEFILE = "Makefile"
MAKEFILE_OWNERS: tuple[tuple[str, str], ...] = (
    (r"bench-peers|PEER_RUNS|PEERS_\w+", "bench-peers"),
    (r"gpu-[\w-]+", "gpu-.+"),
    (r"\.PHONY|all|test|test-models|demo|demo-offline|bench|bench-provenance|chaos|overload|fuzz|miri"
     r"|lint|fmt|clean|(?:CHAOS|OVERLOAD|FUZZ)_\w+", NOBODY),
)
_MAKE_RULE = re.compile(r"([^\s:=#][^:=#]*?)\s*::?(?!=)")
_MAKE_VAR = re.compile(r"([\w.]+)\s*(?:\?=|:=|::=|\+=|!=|=)")
_HARNESS_PATH = re.compile(r"\b(?:bench|scripts)/[\w./*-]+")


def makefile_lines(text: str, section: str | None = None) -> list[str]:
    """The logical lines (continuations joined) of a Makefile's TEXT that
    are measured code of SECTION, or of any section without one. Comments
    and blank lines are no section's. A recipe line that runs measured
    harness files all owned by some benchmarks (bench-platform's lines:
    `scripts/bench-if.sh` and the like) is those benchmarks' sections';
    other lines are their rule's or variable's (`MAKEFILE_OWNERS`), or
    every section's."""
    logical, cur = [], ""
    for raw in text.splitlines():
        cur += raw
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        logical.append(cur)
        cur = ""
    if cur:
        logical.append(cur)

    def owner_of(name: str) -> str | None:
        return next((o for pat, o in MAKEFILE_OWNERS if re.fullmatch(pat, name)), None)

    def wanted(owner: str | None) -> bool:
        if owner is None:
            return True
        return owner != NOBODY if section is None else re.fullmatch(owner, section) is not None

    kept, rule_owner = [], None
    for line in logical:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("\t"):
            owner = rule_owner
            if owner is None:
                paths = [p for p in _HARNESS_PATH.findall(line) if is_measured(p)]
                theirs = [owners(p) for p in paths]
                if theirs and all(o is not None for o in theirs):
                    owner = "|".join(f"(?:{o})" for o in dict.fromkeys(theirs))
        elif m := _MAKE_VAR.match(line):
            owner, rule_owner = owner_of(m.group(1)), None
        elif m := _MAKE_RULE.match(line):
            owner = rule_owner = owner_of(m.group(1).split()[0])
        else:  # a directive (include, ifeq, ...): every section's
            owner = rule_owner = None
        if wanted(owner):
            kept.append(line.strip())
    return kept


def _makefile_digest(text: str | None, section: str | None) -> str:
    lines = makefile_lines(text, section) if text is not None else []
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def owners(path: str) -> str | None:
    """The sections (a regular expression) that alone run harness file
    PATH, or None when every section runs it."""
    return next((sections for pattern, sections in OWNERS if fnmatch.fnmatchcase(path, pattern)), None)


def is_measured(path: str, section: str | None = None) -> bool:
    """Whether PATH (relative to the repository root) is measured code: of
    any section, or of SECTION (by name) when given."""
    if path.endswith(".md") or path in NOT_MEASURED_FILES or path.startswith(NOT_MEASURED_DIRS):
        return False
    if "/tests/" in path:  # a crate's integration tests
        return False
    name = path.rsplit("/", 1)[-1]
    if re.fullmatch(r"test_.*\.py", name):
        return False
    if section is None:
        return True
    theirs = owners(path)
    return theirs is None or re.fullmatch(theirs, section) is not None


def git(repo: Path, *args: str) -> str | None:
    """git's output, or None when git fails (no checkout, unknown commit)."""
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def measured_digest(commit: str, repo: Path = REPO, section: str | None = None) -> str | None:
    """A short name for COMMIT's measured code (of SECTION, when given):
    the same for every commit whose measured files are the same; None
    when git cannot read COMMIT, or for a tree with uncommitted changes
    ("+dirty": its code is not known)."""
    if commit.endswith("+dirty"):
        return None
    out = git(repo, "ls-tree", "-r", "--full-tree", commit)
    if out is None:
        return None
    h = hashlib.sha256()
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        if is_measured(path, section):
            blob = meta.split()[2]
            if path == MAKEFILE:  # its measured lines, not its bytes
                blob = _makefile_digest(git(repo, "cat-file", "blob", blob), section)
            h.update(f"{blob} {path}\n".encode())
    return h.hexdigest()[:12]


def measured_changes(a: str, b: str | None = None, repo: Path = REPO,
                     section: str | None = None) -> list[str] | None:
    """The measured files (of SECTION, when given) that differ between
    commits A and B, or between A and the work tree without B (sorted);
    None when git cannot compare them."""
    out = git(repo, "diff", "--name-only", a, *([b] if b else []))
    if out is None:
        return None
    changed = sorted(p for p in out.splitlines() if is_measured(p, section))
    if MAKEFILE in changed:
        before = git(repo, "show", f"{a}:{MAKEFILE}")
        if b:
            after = git(repo, "show", f"{b}:{MAKEFILE}")
        else:
            f = repo / MAKEFILE
            after = f.read_text() if f.exists() else None
        if (before is not None and after is not None
                and makefile_lines(before, section) == makefile_lines(after, section)):
            changed.remove(MAKEFILE)
    return changed


def by_folder(paths: list[str]) -> str:
    """'libml (3 files), if-manager (1 file)': where changed files lie."""
    count: dict[str, int] = {}
    for p in paths:
        top = p.split("/", 1)[0] if "/" in p else p
        count[top] = count.get(top, 0) + 1
    return ", ".join(f"{k} ({n} file{'s' if n != 1 else ''})" for k, n in sorted(count.items()))


SECTION = re.compile(r"<!-- ([\w-]+):begin[^>]*-->(.*?)<!-- \1:end -->", re.S)
COMMIT = re.compile(r"\b(?:commit|git|at) ([0-9a-f]{7,40}(?:\+dirty)?)\b")
WHEN = re.compile(r"\b(20\d\d-\d\d-\d\d(?: \d\d:\d\d(?::\d\d)?)?)")


def sections(doc_text: str) -> list[dict]:
    """Each generated section of DOC_TEXT (but this table's own): its
    name, the commits it names (in order of first mention) and the dates."""
    found = []
    for m in SECTION.finditer(doc_text):
        name, body = m.group(1), m.group(2)
        if name in ("provenance", "NAME"):
            continue
        commits = list(dict.fromkeys(COMMIT.findall(body)))
        dates = sorted(set(WHEN.findall(body)))
        found.append({"name": name, "commits": commits, "dates": dates})
    return found


def verdict(commit: str, head: str, repo: Path = REPO, section: str | None = None) -> str:
    """What COMMIT's measured code (of SECTION) is against HEAD's, in words."""
    if commit.endswith("+dirty"):
        return "a tree with uncommitted changes: not a record"
    changes = measured_changes(commit, head, repo=repo, section=section)
    if changes is None:
        return "unknown (git cannot read the commit here)"
    if not changes:
        return "the same"
    return f"differs: {by_folder(changes)}"


def table(doc_text: str, head: str, repo: Path = REPO) -> str:
    """The generated table: each section, the commits it measured and
    whether their measured code is HEAD's."""
    digest = measured_digest(head, repo)
    L = [f"Measured code now: commit {head}, digest {digest} (bench/provenance.py; written "
         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). A section whose code is \"the same\" "
         "describes this product; the others describe an earlier one. Each section is compared on the "
         "code it runs: the product and shared harness, and its own benchmark's harness files, not other "
         "benchmarks' (provenance.OWNERS).", "",
         "| section | measured at | dates | its measured code against now |", "|---|---|---|---|"]
    found = sections(doc_text)
    stale = 0
    for s in found:
        if not s["commits"]:
            L.append(f"| {s['name']} | no commit named | {', '.join(s['dates']) or '?'} | unknown |")
            stale += 1
            continue
        words = [verdict(c, head, repo, s["name"]) for c in s["commits"]]
        if len(words) > 1:
            words = [f"{c}: {w}" for c, w in zip(s["commits"], words)]
        stale += any(not w.endswith("the same") for w in words)
        dates = s["dates"]
        span = dates[0] if len(dates) == 1 else (f"{dates[0]} – {dates[-1]}" if dates else "?")
        L.append(f"| {s['name']} | {', '.join(s['commits'])} | {span} | {'; '.join(words)} |")
    n = len(found)
    L += ["", f"{n - stale} of {n} sections measured the code as it is now."
          if stale else f"All {n} sections measured the code as it is now."]
    return "\n".join(L) + "\n"


def update(doc: Path, text: str) -> bool:
    """Write TEXT between DOC's provenance markers; False without them."""
    t = doc.read_text()
    m = re.search(r"(<!-- provenance:begin[^>]*-->\n)(.*?)(<!-- provenance:end -->)", t, re.S)
    if not m:
        return False
    doc.write_text(t[:m.start(2)] + text + t[m.end(2):])
    return True


def main(argv: list[str]) -> int:
    if argv not in ([], ["--update"]):
        print("usage: provenance.py [--update]", file=sys.stderr)
        return 2
    head = git(REPO, "rev-parse", "--short", "HEAD")
    if head is None:
        print("provenance: not a git checkout", file=sys.stderr)
        return 1
    head = head.strip()
    dirty = measured_changes(head) or []
    text = table(DOC.read_text(), head)
    if dirty:
        text = (f"**The tree has uncommitted changes to measured code ({by_folder(dirty)}): "
                "compared with its last commit.**\n\n" + text)
    if argv == ["--update"]:
        if not update(DOC, text):
            print(f"provenance: no provenance markers in {DOC}", file=sys.stderr)
            return 1
        print(f"provenance: updated {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
