"""Streamlit entry point: ``streamlit run dashboard/app.py`` (or ``tidewatch dashboard``).

Every run resolves the browser session's bearer token against ``user_sessions``; without a
live session only the login / sign-up page is shown.  After a login, "While you were
away" is the first page when anything happened since the client's cursor (PSoup).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by streamlit: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st  # noqa: E402

from dashboard import auth  # noqa: E402
from dashboard.ui import CATCHUP, PAGE, PAGES, TOKEN, plain, sessions, show_flash  # noqa: E402
from dashboard.views import alerts, away, health, key_detail, login, subscribe  # noqa: E402
from tidewatch.settings import Settings, get_settings  # noqa: E402

RENDER = {
    "While you were away": away.render,
    "Alerts": alerts.render,
    "Subscribe": subscribe.render,
    "Key detail": key_detail.render,
    "Health": health.render,
}


#: widget state kept when the user goes to another page and back (Streamlit drops the state
#: of a widget that a run did not draw): the rule being written, the filters, the key
KEEP: tuple[str, ...] = ("sub_edit", "sub_template", "sub_name", "sub_rule", "sub_budget")
KEEP += ("alerts_subs", "alerts_key", "alerts_kinds", "detail_pick", "detail_key")


def _keep_widget_state() -> None:
    """Re-assign the :data:`KEEP` keys: a value set through Session State survives runs that
    do not draw its widget, so a draft rule is still there after a look at the Alerts page."""
    for k in KEEP:
        if k in st.session_state:
            st.session_state[k] = st.session_state[k]


def _logout(settings: Settings) -> None:
    auth.logout(sessions(settings), st.session_state.get(TOKEN))
    for k in list(st.session_state.keys()):
        del st.session_state[k]


def main() -> None:
    # the app's entry point: read the settings once per script run, pass them to the views
    settings = get_settings()
    st.set_page_config(page_title="Tidewatch", layout="wide")
    user = auth.resolve(sessions(settings), st.session_state.get(TOKEN))
    if user is None:
        for k in (TOKEN, "tw_user", CATCHUP):
            st.session_state.pop(k, None)
        login.render(settings)
        return
    st.session_state["tw_user"] = user
    _keep_widget_state()
    with st.sidebar:
        st.text(f"Signed in as {user.username}")
        if PAGE not in st.session_state or st.session_state[PAGE] not in PAGES:
            st.session_state[PAGE] = "Alerts"
        st.radio("Page", PAGES, key=PAGE)
        st.button("Log out", on_click=_logout, args=(settings,), key="logout")
    show_flash()
    page = st.session_state[PAGE]
    if page != "While you were away":
        st.session_state.pop(CATCHUP, None)  # the next visit takes a fresh snapshot
    st.header(plain(page))
    RENDER[page](settings)


main()
