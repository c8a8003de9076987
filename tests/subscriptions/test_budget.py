"""The staleness budget as text and as a range (no services): parsing, checking, showing."""

from __future__ import annotations

import pytest

from subscriptions.budget import (
    MAX_BUDGET_MS,
    budget_input,
    budget_text,
    check_budget,
    lookup_period_ms,
    parse_budget,
)
from subscriptions.errors import InvalidBudget, SubscriptionError, SubscriptionsError
from tidewatch.settings import Settings, get_settings


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30s", 30_000),
        ("2m", 120_000),
        ("2min", 120_000),
        (" 1.5h ", 5_400_000),
        ("250ms", 250),
        ("45", 45_000),
        ("1d", 86_400_000),
        ("10S", 10_000),
        ("none", None),
        ("None", None),
        ("", None),
        ("  ", None),
        (None, None),
    ],
)
def test_durations_parse_like_the_rest_of_the_cli(text, ms):
    assert parse_budget(text) == ms


@pytest.mark.parametrize("text", ["soon", "30 parsecs", "-5s", "1e3", "5s5", "'; DROP TABLE x;--"])
def test_a_text_that_is_no_duration_is_refused_with_what_to_write(text):
    with pytest.raises(InvalidBudget) as err:
        parse_budget(text)
    assert err.value.code == InvalidBudget.NOT_A_DURATION
    assert "e.g. 30s, 2m or 1h" in str(err.value) and "'none'" in str(err.value)


def test_the_range_is_one_lookup_period_to_a_day():
    s = get_settings().model_copy(update={"pane_ms": 1000, "engine_lookup_every_ms": None})
    assert lookup_period_ms(s) == 1000
    assert check_budget(None, s) is None
    assert check_budget(1000, s) == 1000 and check_budget(MAX_BUDGET_MS, s) == MAX_BUDGET_MS
    cases = [
        (0, InvalidBudget.NOT_POSITIVE),
        (-5, InvalidBudget.NOT_POSITIVE),
        (999, InvalidBudget.BELOW_LOOKUP),
        (MAX_BUDGET_MS + 1, InvalidBudget.ABOVE_MAX),
        (True, InvalidBudget.NOT_A_DURATION),
        (1.5, InvalidBudget.NOT_A_DURATION),
    ]
    for ms, code in cases:
        with pytest.raises(InvalidBudget) as err:
            check_budget(ms, s)  # type: ignore[arg-type]
        assert err.value.code == code, ms
    with pytest.raises(InvalidBudget) as err:
        check_budget(999, s)
    assert str(err.value) == (
        "a staleness budget of 999 ms is shorter than the engine's lookup period (1 s), so it would "
        "change nothing: enter at least 1 s, or 'none' for no budget"
    )


def test_the_lookup_period_is_the_engines_when_set():
    s: Settings = get_settings().model_copy(update={"pane_ms": 1000, "engine_lookup_every_ms": 5000})
    assert lookup_period_ms(s) == 5000
    with pytest.raises(InvalidBudget) as err:
        check_budget(4000, s)
    assert err.value.code == InvalidBudget.BELOW_LOOKUP and "enter at least 5 s" in str(err.value)
    assert check_budget(5000, s) == 5000


def test_the_error_is_a_refusal_of_the_service_and_a_value_error():
    assert issubclass(InvalidBudget, SubscriptionError)
    assert issubclass(InvalidBudget, SubscriptionsError) and issubclass(InvalidBudget, ValueError)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "none"),
        (250, "250 ms"),
        (1000, "1 s"),
        (1500, "1.5 s"),
        (8000, "8 s"),
        (30_000, "30 s"),
        (120_000, "2 min"),
        (150_000, "2 min 30 s"),
        (3_600_000, "1 h"),
        (5_400_000, "1 h 30 min"),
        (MAX_BUDGET_MS, "24 h"),
    ],
)
def test_budgets_read_as_people_say_them(ms, text):
    assert budget_text(ms) == text


@pytest.mark.parametrize(
    "ms", [None, 1000, 1500, 30_000, 90_000, 120_000, 5_400_000, 7_200_000, MAX_BUDGET_MS]
)
def test_the_input_text_reads_back_exactly(ms):
    assert parse_budget(budget_input(ms)) == ms
    assert budget_input(30_000) == "30s" and budget_input(120_000) == "2m" and budget_input(1500) == "1500ms"
