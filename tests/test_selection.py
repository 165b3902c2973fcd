"""Host selection (orchestrator/core/selection.py): ranges, --limit, retry files, batches.

Pure functions: no host, no file. Examples pin Ansible's behaviour where orch
follows it; properties (hypothesis) cover the shapes examples miss.
"""

from __future__ import annotations

import string
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.selection import (
    BatchSize,
    apply_limit,
    expand_group_members,
    expand_host_range,
    expand_inventory_hosts,
    has_range,
    hosts_to_retry,
    judge_batch,
    limit_files,
    parse_limit,
    parse_max_fail_percent,
    parse_retry_file,
    parse_serial,
    plan_batches,
    retry_file_text,
    split_limit,
)
from orchestrator.errors import ConfigError

# ------------------------------------------------------------------ host ranges


def test_zero_padded_range_keeps_its_width() -> None:
    names = expand_host_range("gpu[01:50]")
    assert names[:3] == ["gpu01", "gpu02", "gpu03"]
    assert names[-1] == "gpu50"
    assert len(names) == 50


def test_unpadded_range_and_step_and_tail() -> None:
    assert expand_host_range("db[8:12]-node") == ["db8-node", "db9-node", "db10-node", "db11-node", "db12-node"]
    assert expand_host_range("w[1:9:4]") == ["w1", "w5", "w9"]


def test_letter_range_and_two_ranges_multiply() -> None:
    assert expand_host_range("rack[a:c]") == ["racka", "rackb", "rackc"]
    assert expand_host_range("r[1:2]-g[a:b]") == ["r1-ga", "r1-gb", "r2-ga", "r2-gb"]


def test_names_without_a_range_are_themselves() -> None:
    assert expand_host_range("blackwell-1") == ["blackwell-1"]
    assert expand_host_range("odd[1]") == ["odd[1]"]  # a bracket without a colon is no range
    assert not has_range("odd[1]")
    assert has_range("gpu[1:2]")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpu[5:1]", "begin is after end"),
        ("gpu[c:a]", "begin is after end"),
        ("gpu[01:100]", "same width"),
        ("gpu[1:5:0]", "step must be"),
        ("gpu[1:5:x]", "step must be"),
        ("gpu[:5]", "needs a begin and an end"),
        ("gpu[1:]", "needs a begin and an end"),
        ("gpu[1:2:3:4]", "begin:end or begin:end:step"),
        ("gpu[a:5]", "both be numbers or both single letters"),
        ("gpu[aa:ab]", "both be numbers or both single letters"),
        ("gpu[1:5", "unbalanced brackets"),
    ],
)
def test_bad_ranges_are_config_errors(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        expand_host_range(name, key="hosts.x")
    assert err.value.key == "hosts.x"


@given(first=st.integers(0, 500), count=st.integers(1, 60), width=st.integers(1, 4), step=st.integers(1, 7))
def test_numeric_range_properties(first: int, count: int, width: int, step: int) -> None:
    last = first + count - 1
    width = max(width, len(str(last)))
    begin, end = str(first).zfill(width), str(last).zfill(width)
    padded = begin.startswith("0") and len(begin) > 1
    names = expand_host_range(f"n[{begin}:{end}:{step}]x")
    numbers = list(range(first, last + 1, step))
    assert len(names) == len(numbers)
    assert len(set(names)) == len(names)
    assert [int(n[1:-1]) for n in names] == numbers
    if padded:
        assert all(len(n) == width + 2 for n in names)


@given(st.text(alphabet=string.ascii_lowercase + "-.0123456789", min_size=1, max_size=20))
def test_plain_names_expand_to_themselves(name: str) -> None:
    assert expand_host_range(name) == [name]


def test_inventory_hosts_expand_with_shared_entry_and_group_members() -> None:
    entry = {"vars": {"tp": 8}}
    hosts = expand_inventory_hosts({"gpu[1:3]": entry, "head": {}})
    assert list(hosts) == ["gpu1", "gpu2", "gpu3", "head"]
    assert hosts["gpu2"] is entry
    assert expand_group_members(["gpu[1:2]", "head", "gpu1"]) == ["gpu1", "gpu2", "head"]


def test_inventory_range_refuses_duplicates_and_a_shared_address() -> None:
    with pytest.raises(ConfigError, match="'gpu2' is named twice") as err:
        expand_inventory_hosts({"gpu2": {}, "gpu[1:3]": {}})
    assert err.value.key == "hosts.gpu[1:3]"
    with pytest.raises(ConfigError, match="cannot share one address"):
        expand_inventory_hosts({"gpu[1:3]": {}}, has_address={"gpu[1:3]": True})
    # one host from a one-item range may keep its address
    assert list(expand_inventory_hosts({"gpu[1:1]": {}}, has_address={"gpu[1:1]": True})) == ["gpu1"]


# ------------------------------------------------------------------ --limit

HOSTS = [f"gpu{i:02d}" for i in range(1, 11)] + ["cpu1", "cpu2", "head"]
GROUPS = {"blackwell": HOSTS[:5], "hopper": HOSTS[5:10], "cpus": ["cpu1", "cpu2"]}


def limit(text: str, selected: list[str] | None = None, files: dict[str, str] | None = None) -> list[str]:
    return apply_limit(selected if selected is not None else HOSTS, text, hosts=HOSTS, groups=GROUPS,
                       files=files)


def test_split_like_ansible() -> None:
    assert split_limit("a, b ,c") == ["a", "b", "c"]
    assert split_limit("a:b:!c") == ["a", "b", "!c"]
    assert split_limit("gpu[01:03]:head") == ["gpu[01:03]", "head"]
    assert split_limit("gpu[01:03],head") == ["gpu[01:03]", "head"]
    assert split_limit("fe80::1") == ["fe80::1"]  # an IPv6 address is one term
    assert split_limit("a,,b,") == ["a", "b"]


def test_globs_over_hosts_and_groups() -> None:
    assert limit("gpu0*") == HOSTS[:9]
    assert limit("blackwell") == HOSTS[:5]
    assert limit("cpu?") == ["cpu1", "cpu2"]
    assert limit("*well") == HOSTS[:5]  # a glob over group names stands for their members
    assert limit("all") == HOSTS


def test_exclude_and_intersect_in_ansible_order() -> None:
    assert limit("blackwell:!gpu03") == ["gpu01", "gpu02", "gpu04", "gpu05"]
    # the order written does not matter: plain terms, then &, then !
    assert limit("!gpu03,blackwell") == ["gpu01", "gpu02", "gpu04", "gpu05"]
    assert limit("gpu*:&hopper:!gpu10") == ["gpu06", "gpu07", "gpu08", "gpu09"]
    # only ! or & terms: they apply to all
    assert limit("!gpu*") == ["cpu1", "cpu2", "head"]
    assert limit("&cpus") == ["cpu1", "cpu2"]


def test_ranges_in_a_limit() -> None:
    assert limit("gpu[02:04]") == ["gpu02", "gpu03", "gpu04"]
    assert limit("all:!gpu[01:09]") == ["gpu10", "cpu1", "cpu2", "head"]
    # a range is one term: & intersects with all of its hosts at once
    assert limit("blackwell:&gpu[04:08]") == ["gpu04", "gpu05"]


def test_a_retry_file_is_one_term() -> None:
    files = {"r": "gpu01\ngpu02\ngpu07\n"}
    assert limit("blackwell:&@r", files=files) == ["gpu01", "gpu02"]
    assert limit("blackwell:!@r", files=files) == ["gpu03", "gpu04", "gpu05"]


def test_result_keeps_the_selection_order_and_only_selected_hosts() -> None:
    selected = ["head", "gpu02", "gpu01"]
    assert limit("gpu*,head", selected) == ["head", "gpu02", "gpu01"]
    assert limit("blackwell", selected) == ["gpu02", "gpu01"]


def test_a_bare_address_selected_can_be_limited_by_name() -> None:
    assert apply_limit(["10.0.0.7", "head"], "10.0.0.*", hosts=HOSTS, groups=GROUPS) == ["10.0.0.7"]


def test_a_term_that_matches_nothing_is_an_error_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"'gpu1O' matches no host or group; did you mean: gpu10") as err:
        limit("blackwell:!gpu1O")  # the typo must not quietly keep gpu10 in
    assert err.value.key == "--limit"
    assert str(err.value).startswith("--limit: ")
    with pytest.raises(ConfigError, match="'gpu11' \\(from gpu\\[09:11\\]\\) matches no host"):
        limit("gpu[09:11]")


def test_a_limit_that_leaves_nothing_is_an_error() -> None:
    with pytest.raises(ConfigError, match="leaves no host of the 2 selected"):
        limit("hopper", ["gpu01", "gpu02"])
    with pytest.raises(ConfigError, match="leaves no host"):
        limit("blackwell:!blackwell")


@pytest.mark.parametrize("text", ["", " , ", "!", "gpu01,&", "@"])
def test_empty_terms_are_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        limit(text)


names = st.sampled_from(HOSTS)
terms = st.one_of(names, st.sampled_from([*GROUPS, "gpu0*", "cpu?", "all", "gpu[01:04]"]))


@given(plain=st.lists(terms, min_size=1, max_size=3), excluded=st.lists(terms, max_size=2),
       inter=st.lists(terms, max_size=2), selected=st.lists(names, min_size=1, max_size=13, unique=True))
def test_limit_properties(plain: list[str], excluded: list[str], inter: list[str], selected: list[str]) -> None:
    text = ",".join([*plain, *(f"!{t}" for t in excluded), *(f"&{t}" for t in inter)])

    def members(term: str) -> set[str]:
        return set(apply_limit(HOSTS, term, hosts=HOSTS, groups=GROUPS))

    expected = set().union(*(members(t) for t in plain))
    for t in inter:
        expected &= members(t)
    for t in excluded:
        expected -= members(t)
    want = [h for h in selected if h in expected]
    if want:
        assert apply_limit(selected, text, hosts=HOSTS, groups=GROUPS) == want
    else:
        with pytest.raises(ConfigError, match="leaves no host"):
            apply_limit(selected, text, hosts=HOSTS, groups=GROUPS)


# ------------------------------------------------------------------ retry files


def test_retry_file_round_trip_through_a_limit() -> None:
    outcomes = {"gpu01": "changed", "gpu02": "rolled_back", "gpu03": "unreachable",
                "gpu04": "unchanged", "gpu05": "not_started", "gpu06": "failed",
                "gpu07": "rollback_failed", "gpu08": "planned"}
    retry = hosts_to_retry(outcomes)
    assert retry == ["gpu02", "gpu03", "gpu05", "gpu06", "gpu07"]
    text = retry_file_text(retry)
    assert text == "gpu02\ngpu03\ngpu05\ngpu06\ngpu07\n"
    assert limit_files("@run.retry") == ["run.retry"]
    assert limit("@run.retry", files={"run.retry": text}) == retry
    assert limit("@run.retry:!gpu03", files={"run.retry": text}) == ["gpu02", "gpu05", "gpu06", "gpu07"]


def test_retry_file_comments_blank_lines_and_errors_carry_file_and_line() -> None:
    assert parse_retry_file("# failed hosts\n\ngpu01  # canary\n gpu02 \n") == [(3, "gpu01"), (4, "gpu02")]
    with pytest.raises(ConfigError) as err:
        limit("@r.txt", files={"r.txt": "gpu01\n\ngpu99\n"})
    assert "'gpu99' (from @r.txt:3) matches no host" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_retry_file("gpu01 gpu02\n", "r.txt")
    assert str(err.value).startswith("r.txt:1: --limit: one host name per line")


def test_an_unread_retry_file_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="did not read"):
        parse_limit("@missing.txt", files={})


def test_an_empty_retry_file_is_an_error_not_all_hosts() -> None:
    with pytest.raises(ConfigError, match="r.txt lists no host"):
        limit("@r.txt", files={"r.txt": "# nothing failed\n"})
    with pytest.raises(ConfigError, match="lists no host"):
        limit("&@r.txt", files={"r.txt": ""})
    # excluding an empty list excludes nothing
    assert limit("cpus:!@r.txt", files={"r.txt": ""}) == ["cpu1", "cpu2"]


# ------------------------------------------------------------------ batches


def sizes(batches: list[list[str]]) -> list[int]:
    return [len(b) for b in batches]


def test_serial_parsing() -> None:
    assert parse_serial("1,25%,100%") == [BatchSize(1), BatchSize(25, True), BatchSize(100, True)]
    assert parse_serial(" 3 ") == [BatchSize(3)]
    assert str(BatchSize(25, True)) == "25%"


@pytest.mark.parametrize("text", ["", "0", "0%", "101%", "-1", "1,,2", "x", "2.5", "12.5%", "1, %"])
def test_bad_serial_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_serial(text)
    assert err.value.key == "--serial"


def test_batches_like_ansible() -> None:
    hosts = [f"h{i}" for i in range(10)]
    assert plan_batches(hosts, None) == [hosts]
    assert sizes(plan_batches(hosts, parse_serial("3"))) == [3, 3, 3, 1]
    # a canary, then 25% of all 10 hosts (2.5 rounds down to 2), then the rest
    assert sizes(plan_batches(hosts, parse_serial("1,25%,100%"))) == [1, 2, 7]
    assert sizes(plan_batches(hosts, parse_serial("1,25%"))) == [1, 2, 2, 2, 2, 1]  # the last size repeats
    assert sizes(plan_batches(hosts, parse_serial("5%"))) == [1] * 10  # never below 1
    assert sizes(plan_batches(hosts, parse_serial("1,100"))) == [1, 9]
    assert plan_batches([], parse_serial("1")) == []


@given(count=st.integers(0, 120),
       serial=st.lists(st.one_of(st.builds(BatchSize, st.integers(1, 40)),
                                 st.builds(BatchSize, st.integers(1, 100), st.just(True))),
                       min_size=1, max_size=4))
def test_batch_properties(count: int, serial: list[BatchSize]) -> None:
    hosts = list(range(count))
    batches = plan_batches(hosts, serial)
    assert [h for b in batches for h in b] == hosts  # every host once, in order
    assert all(batches)
    for i, batch in enumerate(batches[:-1]):
        assert len(batch) == serial[min(i, len(serial) - 1)].of(count)
    if batches:
        assert len(batches[-1]) <= serial[min(len(batches) - 1, len(serial) - 1)].of(count)


@given(pct=st.integers(1, 100), total=st.integers(1, 500))
def test_percentage_rounds_down_but_never_below_one(pct: int, total: int) -> None:
    n = BatchSize(pct, True).of(total)
    assert 1 <= n <= total
    assert n <= max(1, pct * total / 100) < n + 1
    # Ansible's float arithmetic agrees except where it lands just under a whole number
    ansible = max(1, int(pct / 100.0 * total))
    assert ansible == n or (ansible == n - 1 and pct * total % 100 == 0)


def test_percentage_is_exact_where_ansible_floats_are_not() -> None:
    assert BatchSize(29, True).of(100) == 29  # Ansible: int(0.29 * 100) == 28


# ------------------------------------------------------------------ max-fail-percent


def test_max_fail_percent_parsing() -> None:
    assert parse_max_fail_percent("0") == 0
    assert parse_max_fail_percent("12.5") == Fraction(25, 2)
    for bad in ("-1", "101", "x", ""):
        with pytest.raises(ConfigError) as err:
            parse_max_fail_percent(bad)
        assert err.value.key == "--max-fail-percent"


def test_judge_batch_like_ansible() -> None:
    ok, bad = "changed", "rolled_back"
    # 0: the first failure stops
    assert judge_batch([bad], 0).stop
    assert judge_batch([ok, ok, bad], 0).stop
    assert not judge_batch([ok, "unchanged"], 0).stop
    # strictly above: 1 of 2 is 50%, not above 50
    assert not judge_batch([ok, bad], 50).stop
    assert judge_batch([ok, bad, bad], 50).stop
    # no limit: go on unless the whole batch failed (Ansible stops then too)
    assert not judge_batch([ok, bad, "unreachable"], None).stop
    verdict = judge_batch(["unreachable", "failed"], None)
    assert verdict.stop and verdict.failed == 2 and verdict.size == 2
    assert "every host" in verdict.reason
    assert not judge_batch([], 0).stop


def test_judge_batch_is_exact_at_the_boundary() -> None:
    # 1 of 3 is 33.333…%: above 33.3 but not above 100/3; floats would blur this
    outcomes = ["failed", "changed", "changed"]
    assert judge_batch(outcomes, parse_max_fail_percent("33.3")).stop
    assert not judge_batch(outcomes, Fraction(100, 3)).stop
    verdict = judge_batch(outcomes, 20)
    assert verdict.reason == "1 of 3 hosts failed (33.33%), above --max-fail-percent 20"


@given(failed=st.integers(0, 50), ok=st.integers(0, 50), pct=st.integers(0, 100))
def test_judge_batch_property(failed: int, ok: int, pct: int) -> None:
    outcomes = ["failed"] * failed + ["changed"] * ok
    size = failed + ok
    verdict = judge_batch(outcomes, pct)
    expected = size > 0 and (failed == size or failed * 100 > pct * size)
    assert verdict.stop == expected
    assert (verdict.failed, verdict.size) == (failed, size)
