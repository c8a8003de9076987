"""Subscribe: write a rule (templates from RULES.md), see it validated and compiled as you
type, give it a staleness budget if you like (:mod:`subscriptions.budget`), save it; pause,
resume, edit or delete your subscriptions.

Changes go through :class:`subscriptions.service.SubscriptionService`, scoped to the
logged-in user (another user's subscription behaves as if it did not exist).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import catchup, degraded, detail
from dashboard.catchup import format_values
from dashboard.rules import TEMPLATES, Validation, validate
from dashboard.timefmt import span_text, table_time, utc_text
from dashboard.ui import current_user, flash, plain, sessions
from subscriptions.budget import (
    HELP,
    MAX_BUDGET_MS,
    budget_input,
    budget_text,
    check_budget,
    lookup_period_ms,
    parse_budget,
)
from subscriptions.errors import InvalidBudget, RuleError
from subscriptions.service import SubscriptionError, SubscriptionService, SubscriptionView
from tidewatch.settings import Settings

BLANK = "(blank)"
NEW = "(new subscription)"


def _service(settings: Settings) -> SubscriptionService:
    return SubscriptionService(sessions(settings), settings=settings)


def _use_template() -> None:
    name = st.session_state.get("sub_template", BLANK)
    st.session_state["sub_rule"] = TEMPLATES.get(name, "")


def _pick(subs: dict[str, SubscriptionView]) -> None:
    sel = st.session_state.get("sub_edit", NEW)
    sub = subs.get(sel)
    st.session_state["sub_name"] = sub.name if sub else ""
    st.session_state["sub_rule"] = sub.rule_text if sub else ""
    st.session_state["sub_budget"] = budget_input(sub.staleness_budget_ms) if sub else ""


def _budget(settings: Settings) -> tuple[int | None, str | None]:
    """The Staleness budget field as milliseconds (None: no budget) and the reason it cannot be
    saved (None: it can)."""
    try:
        return check_budget(parse_budget(st.session_state.get("sub_budget", "")), settings), None
    except InvalidBudget as exc:
        return None, str(exc)


def _save(settings: Settings, editing: SubscriptionView | None) -> None:
    user = current_user()
    name = st.session_state.get("sub_name", "").strip() or None
    rule = st.session_state.get("sub_rule", "")
    try:
        budget = check_budget(parse_budget(st.session_state.get("sub_budget", "")), settings)
        if editing is None:
            sub = _service(settings).create(user.username, rule, name=name, staleness_budget_ms=budget)
            flash("success", f"Subscribed: {sub.name}. Its first results arrive within one micro-batch.")
            st.session_state["sub_edit"] = str(sub.id)
        else:
            sub = _service(settings).update(
                user.username, editing.id, rule_text=rule, name=name, staleness_budget_ms=budget
            )
            flash("success", f"Saved {sub.name} (version {sub.version}).")
    except RuleError as err:
        flash("error", f"Not saved: line {err.line}, column {err.column}: {err.message}")
    except SubscriptionError as exc:
        flash("error", f"Not saved: {exc}")


def _change(settings: Settings, action: str, sub_id: str) -> None:
    user = current_user()
    svc = _service(settings)
    try:
        sub = getattr(svc, action)(user.username, sub_id)
    except SubscriptionError as exc:
        flash("error", str(exc))
        return
    flash("success", f"{action.capitalize()}d {sub.name}." if action != "pause" else f"Paused {sub.name}.")
    if action == "delete":
        st.session_state["sub_edit"] = NEW
        st.session_state["sub_name"] = ""
        st.session_state["sub_rule"] = ""
        st.session_state["sub_budget"] = ""
        st.session_state["sub_confirm_delete"] = False


def _preview(settings: Settings, v: Validation) -> None:
    """Keys satisfying the (unsaved) rule now: the backtest evaluator over the stream's recent events."""
    assert v.plan is not None
    lookback = v.plan.domain_ms or int(settings.dashboard_detail_minutes * 60_000)
    try:
        cols, truncated = detail.recent_events(v.plan.stream, v.plan.key, None, lookback, settings)
    except detail.KafkaUnavailable as exc:  # Kafka down or restarting: say so
        st.warning(str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - any other failure: say so, keep the editor usable
        st.warning(f"Cannot read the {v.plan.stream} stream from Kafka: {type(exc).__name__}")
        return
    keys, now = detail.preview_keys(v.plan, cols, settings.pane_ms, settings.ci_p)
    if now is None:
        st.caption(f"No {v.plan.stream} events in the last {span_text(lookback / 1000)}.")
        return
    note = " (only part of the window was read: limit or timeout)" if truncated else ""
    st.text(f"{len(keys)} key(s) match at {utc_text(now)}{note}")
    if keys:
        st.code("\n".join(keys[:500]), language=None)


def _list(subs: list[SubscriptionView]) -> None:
    st.subheader("Your subscriptions")
    if not subs:
        st.info("None yet.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "name": s.name,
                    "state": s.state,
                    "version": s.version,
                    "staleness budget": budget_text(s.staleness_budget_ms),
                    "rule": s.rule_text,
                    "id": str(s.id),
                }
                for s in subs
            ],
            columns=["name", "state", "version", "staleness budget", "rule", "id"],
        ),
        hide_index=True,
        width="stretch",
    )


def render(settings: Settings) -> None:
    user = current_user()
    subs = _service(settings).list(user.username)
    by_id = {str(s.id): s for s in subs}
    _list(subs)

    st.subheader("Rule editor")
    if st.session_state.get("sub_edit", NEW) not in (NEW, *by_id):
        st.session_state["sub_edit"] = NEW
    top = st.columns(2)
    top[0].selectbox(
        "Edit",
        [NEW, *by_id],
        format_func=lambda i: i if i == NEW else f"{by_id[i].name} ({by_id[i].state})",
        key="sub_edit",
        on_change=_pick,
        args=(by_id,),
    )
    editing = by_id.get(st.session_state.get("sub_edit", NEW))
    top[1].selectbox(
        "Template (examples of RULES.md)", [BLANK, *TEMPLATES], key="sub_template", on_change=_use_template
    )
    fields = st.columns([3, 1])
    fields[0].text_input("Name", key="sub_name", max_chars=128)
    period = lookup_period_ms(settings)
    fields[1].text_input(
        "Staleness budget (optional)",
        key="sub_budget",
        max_chars=32,
        placeholder="none (e.g. 30s, 2m)",
        help=f"{HELP} From {budget_text(period)} (the engine's lookup period) to {budget_text(MAX_BUDGET_MS)}.",
    )
    budget_error = _budget(settings)[1]
    if budget_error is not None:
        fields[1].error(plain(budget_error))
    st.caption(
        "Staleness budget: when the engine is overloaded, it looks this subscription up less often, "
        "never more than the budget apart (loosest budgets first), before latency grows for every "
        f"subscription; every event still counts. {budget_text(period)} to {budget_text(MAX_BUDGET_MS)}, "
        "e.g. 30s or 2m; empty: never degraded."
    )
    st.text_area(
        "Rule",
        key="sub_rule",
        height=160,
        max_chars=settings.max_rule_chars,
        placeholder="SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000",
    )
    text = st.session_state.get("sub_rule", "")
    v = validate(text, settings) if text.strip() else None
    if v is None:
        st.info("Write a rule or pick a template; it is checked as you type.")
    elif v.ok:
        st.success("The rule is valid.")
        with st.expander("Compiled plan (rules explain)", expanded=False):
            st.code(v.explain, language=None)
        if st.toggle(
            "Preview the keys that match now (reads the rule's window of the stream from Kafka)",
            key="sub_preview",
        ):
            _preview(settings, v)
    else:
        st.error(plain(v.summary))
        st.code(v.display, language=None)

    buttons = st.columns(4)
    buttons[0].button(
        "Save changes" if editing else "Subscribe",
        disabled=not (v and v.ok) or budget_error is not None,
        on_click=_save,
        args=(settings, editing),
        key="sub_save",
    )
    if editing is not None:
        if editing.state == "active":
            buttons[1].button(
                "Pause", on_click=_change, args=(settings, "pause", str(editing.id)), key="sub_pause"
            )
        else:
            buttons[1].button(
                "Resume", on_click=_change, args=(settings, "resume", str(editing.id)), key="sub_resume"
            )
        confirm = buttons[3].checkbox("really delete", key="sub_confirm_delete")
        buttons[2].button(
            "Delete",
            disabled=not confirm,
            on_click=_change,
            args=(settings, "delete", str(editing.id)),
            key="sub_delete",
        )
        with sessions(settings)() as s:
            current = [c for c in catchup.current_sets(s, user.username) if c.subscription_id == editing.id]
            spaced = [
                d for d in degraded.read(s, user.username).items if d.subscription_id == str(editing.id)
            ]
        if spaced:
            st.warning(
                plain(f"Degraded now (the engine is overloaded): {spaced[0].text(editing.name)}."), icon="🐢"
            )
        st.subheader("Current result set")
        rows = current[0].rows if current else []
        if rows:
            st.dataframe(
                pd.DataFrame(
                    [
                        {"key": r.key, "since (UTC)": table_time(r.since), "values": format_values(r.values)}
                        for r in rows
                    ],
                    columns=["key", "since (UTC)", "values"],
                ),
                hide_index=True,
                column_config={"since (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
            )
        else:
            st.caption("No key satisfies it at the engine's latest lookup.")
