"""The errors of the ``subscriptions`` package: its root, and the rule language's error.

:class:`SubscriptionsError` is the root of every error of the package (under
:class:`tidewatch.errors.TidewatchError`): :class:`RuleError` here, the service's refusals
(:class:`SubscriptionError` and its subclasses, most in :mod:`subscriptions.service`;
:class:`InvalidBudget` here), :class:`subscriptions.outbox.RelayBusy`.
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError

__all__ = ["InvalidBudget", "RuleError", "SubscriptionError", "SubscriptionsError"]


class SubscriptionsError(TidewatchError):
    """The root of every error of the ``subscriptions`` package."""


class SubscriptionError(SubscriptionsError):
    """Base of the subscription service's refusals (each has a message fit for a user);
    re-exported by :mod:`subscriptions.service`."""


class InvalidBudget(SubscriptionError, ValueError):
    """A staleness budget that cannot be accepted (:mod:`subscriptions.budget`).

    ``code`` says which rule it broke, for callers that compare (never the text):
    :data:`NOT_A_DURATION`, :data:`NOT_POSITIVE`, :data:`BELOW_LOOKUP` (shorter than the engine's
    lookup period), :data:`ABOVE_MAX`.  The message says what to enter instead.
    """

    NOT_A_DURATION = "not_a_duration"
    NOT_POSITIVE = "not_positive"
    BELOW_LOOKUP = "below_lookup_period"
    ABOVE_MAX = "above_max"

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class RuleError(SubscriptionsError, ValueError):
    """A rule that does not parse or type-check.

    ``line`` and ``column`` are 1-based; ``snippet`` is the offending line of the rule text;
    ``expected`` lists what would have been accepted there (may be empty).
    ``str(err)`` shows the message, the line and a caret under the column.
    """

    def __init__(
        self,
        message: str,
        line: int = 1,
        column: int = 1,
        snippet: str = "",
        expected: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.snippet = snippet
        self.expected = list(expected)
        super().__init__(self.display())

    @classmethod
    def at(
        cls, text: str, message: str, pos: tuple[int, int] | None, expected: list[str] | tuple[str, ...] = ()
    ) -> RuleError:
        """An error at ``pos`` (line, column) of ``text`` (start of the rule when None)."""
        line, column = pos if pos is not None else (1, 1)
        lines = text.splitlines() or [""]
        snippet = lines[line - 1] if 0 < line <= len(lines) else ""
        return cls(message, line, column, snippet, expected)

    def display(self) -> str:
        """Multi-line text: ``line L, column C: message``, the line, a caret, what was expected."""
        out = [f"line {self.line}, column {self.column}: {self.message}"]
        if self.snippet:
            line, col = self.snippet, max(self.column - 1, 0)
            if len(line) > 100:  # show a window around the column
                start = max(0, col - 50)
                piece = line[start : start + 100]
                prefix = "..." if start > 0 else ""
                line = prefix + piece + ("..." if start + 100 < len(self.snippet) else "")
                col = col - start + len(prefix)
            out.append("  " + line)
            out.append("  " + " " * col + "^")
        if self.expected:
            out.append("expected: " + ", ".join(self.expected))
        return "\n".join(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "message": self.message,
            "line": self.line,
            "column": self.column,
            "snippet": self.snippet,
            "expected": self.expected,
        }
