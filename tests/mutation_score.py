"""`make mutation`'s verdict: the share of mutants killed, from mutmut's own results.

Killed: a test failed (or timed out, or the mutant crashed the interpreter). Everything else a
mutant can end as (survived, no tests reached it, not checked, suspicious, skipped) counts as a
survivor. The mutants tests/mutants-equivalent.txt lists (one a line: the mutant's name, then
why it cannot change behaviour) are out of the count; a listed name that is gone, or that is
killed now, is reported so that the list stays true. Exit 1 under the threshold (90% unless
MUTATION_THRESHOLD says otherwise), with the survivors not listed.

Usage: python tests/mutation_score.py [results-file]  (default: runs `mutmut results --all true`)
"""

from __future__ import annotations

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
    counted = [n for n in results if n not in equivalent]
    killed = sum(1 for n in counted if results[n] in KILLED)
    unlisted = sorted(n for n in counted if results[n] not in KILLED)
    stale = sorted(n for n in equivalent if results.get(n, "killed") in KILLED)
    return killed, len(counted), unlisted, stale


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        with open(argv[1]) as f:
            text = f.read()
    else:
        mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
        text = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    results = parse_results(text)
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
    for name in unlisted:
        print(f"survivor: {name}: {results[name]}")
    for name in stale:
        print(f"listed as equivalent but {'gone' if name not in results else 'killed'}: {name}")
    share = 100.0 * killed / counted if counted else 100.0
    print(f"mutation: {killed}/{counted} killed ({share:.1f}%), {len(unlisted)} survivors, "
          f"{len(equivalent) - len(stale)} equivalent listed; threshold {threshold:g}%")
    return 0 if share >= threshold else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
