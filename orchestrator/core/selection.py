"""Which hosts a run touches, and in which batches — pure functions, no I/O.

Four pieces, each Ansible's semantics unless said otherwise (orch's users
know Ansible; surprises here touch the wrong machines):

1. **Host ranges** in inventory names: ``gpu[01:50]`` is ``gpu01`` … ``gpu50``
   (a leading zero keeps the width), ``[1:9:2]`` has a step, ``[a:c]`` is
   ``a``, ``b``, ``c``, and several ranges multiply (``r[1:2]-g[a:b]``).
   Stricter than Ansible, which silently yields nothing or a surprise: a
   range whose begin is after its end, a zero or negative step, bounds that
   are neither both numbers nor both single letters, and unbalanced brackets
   are errors.
2. **``--limit PATTERN``** narrows the selected hosts: terms separated by
   ``,`` (or ``:`` when there is no comma), each a glob (``*``, ``?``,
   ``[seq]``) over host *and* group names (a group stands for its members),
   ``all``; a term may be a host range; ``!term`` excludes, ``&term``
   intersects. As Ansible orders them: the union of the plain terms first
   (``all`` if there is none), then every ``&``, then every ``!``. Unlike
   Ansible (which warns and goes on), a term that matches no host or group
   is an error — ``!gpu1O`` must not quietly deploy to ``gpu10`` — and so
   is a limit that leaves no host.
3. **Retry files**: ``@FILE`` in a limit is the hosts listed in FILE, one
   per line (``#`` comments and blank lines ignored). The caller reads the
   files (``limit_files`` names them) and passes their text; a run that stops
   early writes ``retry_file_text(hosts_to_retry(outcomes))``.
4. **Batches**: ``--serial N``, ``N%`` or a list ``1,25%,100%`` cuts the hosts,
   in order, into batches; the last size repeats. A percentage is of *all*
   the hosts, rounded down, at least 1 (Ansible's ``pct_to_int``: 25% of 10
   hosts is 2). orch rounds exactly; Ansible multiplies floats, which gives
   one host less where the product is a whole number that floats miss (29%
   of 100 hosts: Ansible 28, orch 29). ``--max-fail-percent P``: after a batch, stop when more than
   P% of *that batch* failed; with or without it, stop when every host of
   the batch failed (Ansible stops then too). Stricter than Ansible: a size
   of 0, ``0%`` or above ``100%`` is an error (Ansible reads 0 as "all" and
   ``0%`` as 1).

Errors are ``ConfigError`` with the option (or inventory key) as ``key``; the
caller adds the file and line (``ConfigError.located``).
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from orchestrator.core.outcomes import FAILED_OUTCOMES, RETRY_OUTCOMES
from orchestrator.errors import ConfigError

T = TypeVar("T")

# ----------------------------------------------------------------- 1. host ranges

_RANGE = re.compile(r"\[([^\[\]]*)\]")


def has_range(name: str) -> bool:
    """True when ``name`` holds a ``[begin:end]`` host range (a bracket with a colon)."""
    return any(":" in m.group(1) for m in _RANGE.finditer(name))


def expand_host_range(name: str, *, key: str = "hosts") -> list[str]:
    """Every name ``name``'s ranges stand for, in order; ``[name]`` when it has none.

    ``ConfigError`` (``key``) for a malformed range. Brackets without a colon
    are left alone (they are not ranges).
    """
    if name.count("[") != name.count("]"):
        raise ConfigError(f"unbalanced brackets in host range '{name}'", key=key)
    match = next((m for m in _RANGE.finditer(name) if ":" in m.group(1)), None)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end():]
    return [
        expanded
        for item in _range_items(match.group(1), name, key)
        for expanded in expand_host_range(head + item + tail, key=key)
    ]


def _range_items(spec: str, name: str, key: str) -> list[str]:
    """The items of one ``begin:end[:step]`` (without brackets)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"host range '[{spec}]' in '{name}' must be begin:end or begin:end:step", key=key)
    begin, end = parts[0].strip(), parts[1].strip()
    step_text = parts[2].strip() if len(parts) == 3 else "1"
    if not begin or not end:
        raise ConfigError(f"host range '[{spec}]' in '{name}' needs a begin and an end", key=key)
    if not step_text.isdigit() or int(step_text) < 1:
        raise ConfigError(f"host range '[{spec}]' in '{name}': step must be a whole number ≥ 1", key=key)
    step = int(step_text)
    if begin.isdigit() and end.isdigit():
        first, last = int(begin), int(end)
        if first > last:
            raise ConfigError(f"host range '[{spec}]' in '{name}': begin is after end", key=key)
        width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
        if width and len(end) != width:
            raise ConfigError(
                f"host range '[{spec}]' in '{name}': a zero-padded range needs begin and end "
                f"of the same width ({begin} has {width} digits, {end} has {len(end)})",
                key=key,
            )
        return [str(i).zfill(width) for i in range(first, last + 1, step)]
    letters = string.ascii_letters
    if len(begin) == 1 and len(end) == 1 and begin in letters and end in letters:
        first, last = letters.index(begin), letters.index(end)
        if first > last:
            raise ConfigError(f"host range '[{spec}]' in '{name}': begin is after end", key=key)
        return list(letters[first : last + 1 : step])
    raise ConfigError(
        f"host range '[{spec}]' in '{name}': begin and end must both be numbers or both single letters",
        key=key,
    )


def expand_inventory_hosts(hosts: Mapping[str, T], *, has_address: Mapping[str, bool] | None = None,
                           key: str = "hosts") -> dict[str, T]:
    """The inventory's ``hosts:`` mapping with every ranged name expanded (same entry for each).

    For the loader: ``Inventory.hosts = expand_inventory_hosts(raw_hosts, has_address=...)``
    before groups are checked, and each group's members through
    ``expand_group_members``. A name produced twice is an error, and so is a
    ranged entry with an ``address`` (``has_address[name]``): N hosts with one
    address would be one machine under N names, and an address *is* its host.
    """
    out: dict[str, T] = {}
    for name, entry in hosts.items():
        names = expand_host_range(name, key=f"{key}.{name}")
        if len(names) > 1 and has_address and has_address.get(name):
            raise ConfigError(f"host range '{name}' cannot share one address; "
                              "leave address out (each name is its own address)", key=f"{key}.{name}")
        for expanded in names:
            if expanded in out:
                raise ConfigError(f"host '{expanded}' is named twice (from '{name}')", key=f"{key}.{name}")
            out[expanded] = entry
    return out


def expand_group_members(members: Iterable[str], *, key: str = "groups") -> list[str]:
    """A group's member list with ranges expanded, duplicates dropped, order kept."""
    return list(dict.fromkeys(n for member in members for n in expand_host_range(member, key=key)))


# ----------------------------------------------------------------- 2. --limit

LIMIT_KEY = "--limit"


@dataclass(frozen=True)
class LimitItem:
    """One glob (or name) and where it came from when not typed as is."""

    pattern: str
    origin: str = ""  # "gpu[01:10]", "@retry.txt:3"


@dataclass(frozen=True)
class LimitTerm:
    """One term of a limit: the hosts its items match together, and how that set combines.

    A range or a retry file is one term of many items: ``&gpu[01:04]``
    intersects with all four hosts at once, not with each in turn.
    """

    items: tuple[LimitItem, ...]
    op: str = "+"  # "+" union, "&" intersect, "!" exclude


def split_limit(text: str) -> list[str]:
    """The raw terms of a limit, as Ansible splits them.

    With a comma, split at commas. Without one, a lone IPv6 address stays
    whole; otherwise split at colons outside ``[...]`` (so ``gpu[01:10]``
    stays one term). Whitespace around terms is dropped; empty terms too.
    """
    if "," in text:
        pieces = text.split(",")
    elif _is_ipv6(text.strip().lstrip("!&")):
        pieces = [text]
    else:
        pieces = re.findall(r"(?:[^\s:\[\]]|\[[^\]]*\])+", text)
    return [p.strip() for p in pieces if p.strip()]


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def limit_files(limit: str) -> list[str]:
    """The retry files a limit names (``@FILE`` terms), for the caller to read."""
    return [term[1:] for term in split_limit(limit) if term.startswith("@")]


def parse_limit(limit: str, files: Mapping[str, str] | None = None) -> list[LimitTerm]:
    """The limit's terms, ``@FILE`` replaced by the file's hosts and ranges expanded.

    ``files``: path → text of every file ``limit_files(limit)`` names.
    """
    terms: list[LimitTerm] = []
    raw_terms = split_limit(limit)
    if not raw_terms:
        raise ConfigError("empty limit", key=LIMIT_KEY)
    for raw in raw_terms:
        op, body = (raw[0], raw[1:].strip()) if raw[0] in "!&" else ("+", raw)
        if not body:
            raise ConfigError(f"'{raw}': nothing after '{op}'", key=LIMIT_KEY)
        if body.startswith("@"):
            path = body[1:]
            if not path:
                raise ConfigError(f"'{raw}': no file name after '@'", key=LIMIT_KEY)
            if files is None or path not in files:
                raise ValueError(f"the caller did not read retry file {path!r}")
            listed = parse_retry_file(files[path], path)
            if not listed and op != "!":
                # Without this, "@empty" would leave no plain term and mean "all".
                raise ConfigError(f"'{raw}': {path} lists no host", key=LIMIT_KEY)
            items = tuple(LimitItem(name, f"@{path}:{line_no}") for line_no, name in listed)
        elif has_range(body):
            items = tuple(LimitItem(name, body) for name in expand_host_range(body, key=LIMIT_KEY))
        else:
            items = (LimitItem(body),)
        terms.append(LimitTerm(items, op))
    return terms


def apply_limit(
    selected: Sequence[str],
    limit: str,
    *,
    hosts: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    files: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``selected`` host names that ``limit`` keeps, in ``selected``'s order.

    ``hosts``: the inventory's host names; ``groups``: group → member names
    (ranges already expanded). Names in ``selected`` that are not in the
    inventory (a bare address given to ``--host``) can be matched too.
    ``ConfigError`` for a term that matches nothing and for a limit that
    leaves no host.
    """
    known = list(dict.fromkeys([*hosts, *selected]))
    terms = parse_limit(limit, files)
    regular = [t for t in terms if t.op == "+"] or [LimitTerm((LimitItem("all"),))]
    kept: set[str] = set()
    for term in regular:
        kept |= _matches(term, known, groups)
    for term in (t for t in terms if t.op == "&"):
        kept &= _matches(term, known, groups)
    for term in (t for t in terms if t.op == "!"):
        kept -= _matches(term, known, groups)
    result = [name for name in selected if name in kept]
    if not result:
        raise ConfigError(f"'{limit}' leaves no host of the {len(selected)} selected", key=LIMIT_KEY)
    return result


def _matches(term: LimitTerm, known: Sequence[str], groups: Mapping[str, Sequence[str]]) -> set[str]:
    """The host names ``term``'s items stand for together; ``ConfigError`` for an item that matches none."""
    found: set[str] = set()
    for item in term.items:
        found |= _item_matches(item, known, groups)
    return found


def _item_matches(item: LimitItem, known: Sequence[str], groups: Mapping[str, Sequence[str]]) -> set[str]:
    if item.pattern == "all":
        return set(known)
    found = {h for h in known if fnmatch.fnmatchcase(h, item.pattern)}
    for group, members in groups.items():
        if fnmatch.fnmatchcase(group, item.pattern):
            found.update(members)
    if not found:
        shown = f"'{item.pattern}'" + (f" (from {item.origin})" if item.origin else "")
        close = difflib.get_close_matches(item.pattern, [*known, *groups], n=3, cutoff=0.6)
        hint = f"; did you mean: {', '.join(close)}" if close else ""
        raise ConfigError(f"{shown} matches no host or group{hint}", key=LIMIT_KEY)
    return found


# ----------------------------------------------------------------- 3. retry files

def parse_retry_file(text: str, path: str = "retry file") -> list[tuple[int, str]]:
    """``(line number, host name)`` for each host line; ``#`` comments and blank lines skipped."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if any(c.isspace() for c in name):
            raise ConfigError(f"one host name per line, got '{name}'", file=path, line=number, key=LIMIT_KEY)
        out.append((number, name))
    return out


def hosts_to_retry(outcomes: Mapping[str, str]) -> list[str]:
    """The hosts a rerun must cover (failed or not started), in the run's order."""
    return [host for host, outcome in outcomes.items() if outcome in RETRY_OUTCOMES]


def retry_file_text(hosts: Sequence[str]) -> str:
    """A retry file: one host per line (``--limit @FILE`` reads it back)."""
    return "".join(f"{host}\n" for host in hosts)


# ----------------------------------------------------------------- 4. batches

SERIAL_KEY = "--serial"
MAX_FAIL_KEY = "--max-fail-percent"


@dataclass(frozen=True)
class BatchSize:
    """One ``--serial`` item: a count of hosts, or a percentage of all of them."""

    value: int
    percent: bool = False

    def of(self, total: int) -> int:
        """Hosts in a batch of this size when the run has ``total`` hosts (Ansible's ``pct_to_int``)."""
        if not self.percent:
            return self.value
        return max(1, self.value * total // 100)

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_serial(text: str) -> list[BatchSize]:
    """``"1,25%,100%"`` → batch sizes; ``ConfigError`` for anything else."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ConfigError(f"'{text}': give sizes like 1, 25% or 1,25%,100%", key=SERIAL_KEY)
    sizes = []
    for item in items:
        percent = item.endswith("%")
        digits = item[:-1].strip() if percent else item
        if not digits.isdigit():
            raise ConfigError(f"'{item}' is not a whole number or a percentage", key=SERIAL_KEY)
        value = int(digits)
        if value < 1 or (percent and value > 100):
            bounds = "between 1% and 100%" if percent else "at least 1"
            raise ConfigError(f"'{item}': a batch size must be {bounds}", key=SERIAL_KEY)
        sizes.append(BatchSize(value, percent))
    return sizes


def plan_batches(hosts: Sequence[T], serial: Sequence[BatchSize] | None) -> list[list[T]]:
    """Cut ``hosts`` into batches, in order; no ``serial``: one batch of all.

    Sizes are taken in turn and the last one repeats; a percentage is of
    ``len(hosts)`` (all of them, not those left), rounded down, at least 1.
    """
    if not hosts:
        return []
    if not serial:
        return [list(hosts)]
    batches: list[list[T]] = []
    start, step = 0, 0
    while start < len(hosts):
        size = serial[min(step, len(serial) - 1)].of(len(hosts))
        batches.append(list(hosts[start : start + size]))
        start += size
        step += 1
    return batches


def parse_max_fail_percent(text: str) -> Fraction:
    """``"0"``, ``"20"``, ``"12.5"`` → the exact percentage (0 to 100)."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"'{text}' is not a number", key=MAX_FAIL_KEY) from None
    if not 0 <= value <= 100:
        raise ConfigError(f"'{text}' must be between 0 and 100", key=MAX_FAIL_KEY)
    return value


@dataclass(frozen=True)
class BatchVerdict:
    """After a batch: go on with the next one, or stop (and why, in one line)."""

    stop: bool
    failed: int
    size: int
    reason: str


def judge_batch(outcomes: Iterable[str], max_fail_percent: Fraction | int | None) -> BatchVerdict:
    """Stop or go on, from one batch's outcomes (``FAILED_OUTCOMES`` count as failures).

    Stop when every host of the batch failed, or when ``max_fail_percent``
    is given and the failed share of the batch is *above* it (Ansible's
    ``max_fail_percentage``: 0 stops at the first failure, 50 lets one of two
    fail but not two of three). Exact arithmetic: no float rounding.
    """
    results = list(outcomes)
    size = len(results)
    failed = sum(1 for o in results if o in FAILED_OUTCOMES)
    if size and failed == size:
        return BatchVerdict(True, failed, size, f"every host of the batch failed ({failed} of {size})")
    if max_fail_percent is not None and size and Fraction(failed * 100, size) > Fraction(max_fail_percent):
        share = f"{float(Fraction(failed * 100, size)):.4g}%"
        return BatchVerdict(True, failed, size,
                            f"{failed} of {size} hosts failed ({share}), above --max-fail-percent "
                            f"{float(Fraction(max_fail_percent)):g}")
    return BatchVerdict(False, failed, size, f"{failed} of {size} hosts failed")
