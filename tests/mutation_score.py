"""`make mutation`'s verdict: the share of mutants killed, from mutmut's own results.

Killed: a test failed (or timed out, or the mutant crashed the interpreter). Everything else a
mutant can end as (survived, no tests reached it, not checked, suspicious, skipped) counts as a
survivor. The mutants tests/mutants-equivalent.txt lists (one a line: the mutant's name, then
why it cannot change behaviour) are out of the count; a listed name that is killed now is
reported so that the list stays true. Exit 1 under the threshold (90% unless
MUTATION_THRESHOLD says otherwise), with the survivors not listed.

MUTANTS (mutmut's name globs, space-separated, as `make mutation` passes them): only the
mutants they name are counted (one module while working on it, or a sample, below).

Usage: python tests/mutation_score.py [--survivors] [results-file]  (default: runs
`mutmut results --all true`); --survivors prints the names of the survivors not listed, one
a line, and nothing else (`make mutation` runs them again: a cached survivor is not re-run
by mutmut when only the tests changed).

--sample K: prints the globs of a sample of the mutants: those whose number ends in one of
two digits (a fifth of every function's mutants when K is 5), the digits chosen by the commit
(git rev-parse HEAD) so that five commits in a row check them all.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EQUIVALENT = os.path.join(HERE, "mutants-equivalent.txt")
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def parse_results(text: str) -> dict[str, str]:
    """`mutmut results --all true` lines, "    NAME: STATUS" -> {name: status}."""
    out = {}
    for line in text.splitlines():
        name, sep, status = line.strip().partition(": ")
        if sep and "__mutmut_" in name:
            out[name] = status.strip()
    return out


def parse_equivalent(text: str) -> dict[str, str]:
    """NAME REASON lines (# comments, blank lines skipped) -> {name: reason}; a name without a
    reason is an error: every listed mutant says why it cannot change behaviour."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{EQUIVALENT}:{n}: {name} has no reason")
        if name in out:
            raise ValueError(f"{EQUIVALENT}:{n}: {name} listed twice")
        out[name] = reason.strip()
    return out


def score(results: dict[str, str], equivalent: dict[str, str]) -> tuple[int, int, list[str], list[str]]:
    """(killed, counted, survivors not listed, listed names that are not survivors now)."""
    stale = sorted(n for n in equivalent if n in results and results[n] in KILLED)
    counted = [n for n in results if n not in equivalent or results[n] in KILLED]
    killed = sum(1 for n in counted if results[n] in KILLED)
    unlisted = sorted(n for n in counted if results[n] not in KILLED)
    return killed, len(counted), unlisted, stale


def sample(k: int, commit: str) -> list[str]:
    """Globs of the mutants whose number's last digit is one of 10 // k digits, rotating with the commit."""
    per = max(1, 10 // k)
    first = (int(commit[-8:], 16) % k) * per if commit else 0
    return [f"*__mutmut_*{d % 10}" for d in range(first, first + per)]


def selected(results: dict[str, str], globs: list[str]) -> dict[str, str]:
    if not globs:
        return results
    return {n: s for n, s in results.items() if any(fnmatch.fnmatchcase(n, g) for g in globs)}


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] == ["--sample"]:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        print(" ".join(sample(int(args[1]), commit)))
        return 0
    survivors_only = args[:1] == ["--survivors"]
    args = args[1:] if survivors_only else args
    if args:
        with open(args[0]) as f:
            text = f.read()
    else:
        mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
        text = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    results = selected(parse_results(text), (os.environ.get("MUTANTS") or "").split())
    try:
        with open(EQUIVALENT) as f:
            equivalent = parse_equivalent(f.read())
    except (OSError, ValueError) as e:
        print(f"mutation: {e}", file=sys.stderr)
        return 2
    if not results:
        print("mutation: no results (run `mutmut run` first)", file=sys.stderr)
        return 2
    threshold = float(os.environ.get("MUTATION_THRESHOLD") or 90)
    killed, counted, unlisted, stale = score(results, equivalent)
    if survivors_only:
        print("\n".join(unlisted))
        return 0
    for name in unlisted:
        print(f"survivor: {name}: {results[name]}")
    for name in stale:
        print(f"listed as equivalent but killed: {name}")
    share = 100.0 * killed / counted if counted else 100.0
    print(f"mutation: {killed}/{counted} killed ({share:.1f}%), {len(unlisted)} survivors, "
          f"{sum(1 for n in equivalent if n in results) - len(stale)} equivalent listed; threshold {threshold:g}%")
    return 0 if share >= threshold else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
