"""Shared Streamlit helpers: the database handle, the logged-in user, safe text.

Rendering rule of the dashboard: text that came from a user (names, rule text, keys) is
shown with :func:`streamlit.text`, :func:`streamlit.code`, dataframes, or passed through
:func:`plain` where Streamlit would read Markdown (labels, headers).  ``unsafe_allow_html``
is never used.
"""

from __future__ import annotations

import re

import streamlit as st
from sqlalchemy.orm import Session, sessionmaker

from dashboard.auth import LoggedIn
from tidewatch.db.session import session_factory
from tidewatch.settings import Settings

# session_state keys
TOKEN = "tw_token"
CLIENT = "tw_client"
PAGE = "tw_page"
CATCHUP = "tw_catchup"
FLASH = "tw_flash"

PAGES = ["While you were away", "Alerts", "Subscribe", "Key detail", "Health"]

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=])")


def plain(text: object) -> str:
    """``text`` with every Markdown-significant character backslash-escaped, so Streamlit's
    Markdown renderer shows it literally (HTML is never enabled anyway)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")


def sessions(settings: Settings) -> sessionmaker[Session]:
    """The session factory of the configured database (``settings.sqlalchemy_url``)."""
    return session_factory(settings.sqlalchemy_url)


def current_user() -> LoggedIn:
    user = st.session_state.get("tw_user")
    assert isinstance(user, LoggedIn), "page rendered without a logged-in user"
    return user


def client_id(settings: Settings) -> str:
    return str(st.session_state.get(CLIENT) or settings.dashboard_client_id)


def client_address() -> str:
    """The browser's address for login rate limiting ("unknown" when Streamlit has none).

    Only a string is taken: without a real request (bare mode, AppTest) Streamlit's context
    can hand back a stand-in object whose text differs on every run, which would give every
    attempt a client of its own and so defeat the limit."""
    try:
        ip = st.context.ip_address
    except Exception:  # noqa: BLE001 - no request context (bare mode, tests)
        ip = None
    return ip[:128] if isinstance(ip, str) and ip else "unknown"


def go(page: str) -> None:
    st.session_state[PAGE] = page


def flash(kind: str, message: str) -> None:
    """A message shown once on the next run (after a button's rerun)."""
    st.session_state[FLASH] = (kind, message)


def show_flash() -> None:
    item = st.session_state.pop(FLASH, None)
    if item:
        kind, message = item
        {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(plain(message))


#: the heading of the page a user without subscriptions lands on (tests look for it)
EMPTY_TITLE = "Start with a subscription"


def empty_state(where: str) -> None:
    """What a user without subscriptions sees instead of an empty page: what a subscription
    is, three steps, and a button that opens Subscribe (``where``: a unique widget key part)."""
    with st.container(border=True):
        st.subheader(EMPTY_TITLE)
        st.markdown(
            "You have no subscriptions yet. A **subscription** is a standing rule over the live "
            "trade or packet stream, for example *the symbols whose volume over the last 5 minutes "
            "exceeds 1,000*. Tidewatch evaluates it continuously and tells you when a key "
            "**enters** its result (the rule became true) or **leaves** it."
        )
        st.markdown(
            "1. Open **Subscribe** and pick a template (or write a rule; it is checked as you type).\n"
            "2. Press **Subscribe**: the first results arrive within a few seconds.\n"
            "3. Come back here for a summary of what entered and left; when you return after a "
            "while, *While you were away* sums up what you missed."
        )
        st.button(
            "Subscribe to a rule", on_click=go, args=("Subscribe",), key=f"empty_{where}", type="primary"
        )
