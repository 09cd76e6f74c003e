"""`make mutation`'s verdict: the share of mutants killed, from mutmut's own results.

Killed: a test failed (or timed out, or the mutant crashed the interpreter). Everything else a
mutant can end as (survived, no tests reached it, not checked, suspicious, skipped) counts as a
survivor. The mutants tests/mutants-equivalent.txt lists (one a line: the mutant's name, then
why it cannot change behaviour) are out of the count; a listed name that is killed now is
reported so that the list stays true. Exit 1 under the threshold (90% unless
MUTATION_THRESHOLD says otherwise), with the survivors not listed.

MUTANTS (mutmut's name globs, space-separated, as `make mutation` passes them): only the
mutants they name are counted (one module while working on it, or a sample, below; with
MUTATION_SAMPLE set the verdict also says the margin of the sample's score).

Usage: python tests/mutation_score.py [--survivors] [results-file]  (default: runs
`mutmut results --all true`); --survivors prints the names of the survivors not listed, one
a line, and nothing else (`make mutation` runs them again: a cached survivor is not re-run
by mutmut when only the tests changed).

--sample K [SEED]: prints the globs of a sample of the mutants: those whose number ends in one
of 10 // K digits (two digits, a fifth, when K is 5), the digits drawn with SEED (MUTATION_SEED,
default 28): the same sample on every run. A mutant's number counts up within its function,
so the sample takes about every K-th mutant of every function, of every module: a stratified
sample, each function and module in proportion. Its verdict names the margin within which the
score of every mutant lies (95%), and --slices FILE tells, from a whole run's results, how far
each of the ten one-digit slices lands from the whole (how representative such a sample is).
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
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


DEFAULT_SEED = "28"


def sample(k: int, seed: str = DEFAULT_SEED) -> list[str]:
    """Globs of the mutants whose number's last digit is one of 10 // k digits drawn with seed."""
    ranked = sorted(range(10), key=lambda d: hashlib.sha256(f"{seed}:{d}".encode()).hexdigest())
    digits = sorted(ranked[: max(1, 10 // k)])
    return [f"*__mutmut_*{d}" for d in digits]


def module_of(name: str) -> str:
    """gpuhook.plan.policy.x_least_used__mutmut_3 -> gpuhook.plan.policy (a method's: its module too)."""
    head = name.partition("__mutmut_")[0]
    parts = head.split(".")
    while parts and not parts[-1].startswith("x"):
        parts.pop()
    return ".".join(parts[:-1]) if parts else head


def by_module(results: dict[str, str], equivalent: dict[str, str]) -> dict[str, tuple[int, int]]:
    """{module: (killed, counted)}, counted as score() counts."""
    out: dict[str, tuple[int, int]] = {}
    for mod in sorted({module_of(n) for n in results}):
        part = {n: s for n, s in results.items() if module_of(n) == mod}
        killed, counted, _u, _s = score(part, equivalent)
        out[mod] = (killed, counted)
    return out


def margin(killed: int, counted: int, population: int) -> float:
    """Half the width, in points, of the 95% interval of the whole score from a sample of
    `counted` out of `population` (normal approximation, finite population corrected)."""
    if not counted or population <= counted:
        return 0.0
    p = killed / counted
    p = min(max(p, 0.05), 0.95)  # never claim less spread than at 95% killed
    return 100.0 * 1.96 * math.sqrt(p * (1 - p) / counted * (population - counted) / (population - 1))


def slices(results: dict[str, str], equivalent: dict[str, str]) -> list[str]:
    """From a whole run: the score of each one-digit slice (a tenth) against the whole."""
    killed, counted, _u, _s = score(results, equivalent)
    lines = [f"whole: {killed}/{counted} killed ({100.0 * killed / counted:.1f}%)"]
    for d in range(10):
        k, c, _u, _s = score(selected(results, [f"*__mutmut_*{d}"]), equivalent)
        lines.append(f"digit {d}: {k}/{c} killed ({100.0 * k / c:.1f}%)" if c else f"digit {d}: none")
    return lines


def selected(results: dict[str, str], globs: list[str]) -> dict[str, str]:
    if not globs:
        return results
    return {n: s for n, s in results.items() if any(fnmatch.fnmatchcase(n, g) for g in globs)}


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] == ["--sample"]:
        print(" ".join(sample(int(args[1]), (args[2:3] or [os.environ.get("MUTATION_SEED") or DEFAULT_SEED])[0])))
        return 0
    slicing = args[:1] == ["--slices"]
    args = args[1:] if slicing else args
    survivors_only = args[:1] == ["--survivors"]
    args = args[1:] if survivors_only else args
    if args:
        with open(args[0]) as f:
            text = f.read()
    else:
        mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
        text = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    every = parse_results(text)
    results = selected(every, (os.environ.get("MUTANTS") or "").split())
    try:
        with open(EQUIVALENT) as f:
            equivalent = parse_equivalent(f.read())
    except (OSError, ValueError) as e:
        print(f"mutation: {e}", file=sys.stderr)
        return 2
    if not results:
        print("mutation: no results (run `mutmut run` first)", file=sys.stderr)
        return 2
    if slicing:
        print("\n".join(slices(results, equivalent)))
        return 0
    threshold = float(os.environ.get("MUTATION_THRESHOLD") or 90)
    killed, counted, unlisted, stale = score(results, equivalent)
    if survivors_only:
        print("\n".join(unlisted))
        return 0
    for name in unlisted:
        print(f"survivor: {name}: {results[name]}")
    for name in stale:
        print(f"listed as equivalent but killed: {name}")
    for mod, (k, c) in by_module(results, equivalent).items():
        print(f"  {mod}: {k}/{c} killed ({100.0 * k / c if c else 100.0:.1f}%)")
    share = 100.0 * killed / counted if counted else 100.0
    print(f"mutation: {killed}/{counted} killed ({share:.1f}%), {len(unlisted)} survivors, "
          f"{sum(1 for n in equivalent if n in results) - len(stale)} equivalent listed; threshold {threshold:g}%")
    if os.environ.get("MUTATION_SAMPLE") and len(results) < len(every):
        population = sum(1 for n in every if n not in equivalent or every[n] in KILLED)
        m = margin(killed, counted, population)
        print(f"mutation: a sample of {counted} of {population} mutants: the score of all of them is "
              f"{share:.1f} +- {m:.1f} points (95%): at least {max(0.0, share - m):.1f}%")
    return 0 if share >= threshold else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
