"""Log in / sign up."""

from __future__ import annotations

import streamlit as st

from dashboard import auth, catchup
from dashboard.ui import CATCHUP, CLIENT, PAGE, TOKEN, client_address, plain, sessions
from tidewatch.settings import Settings


def _start(settings: Settings, user: auth.LoggedIn, client: str) -> None:
    """After a login: remember the token, and open "While you were away" when anything happened."""
    st.session_state[TOKEN] = user.token
    st.session_state[CLIENT] = client
    st.session_state["tw_user"] = user
    snap = catchup.catch_up(sessions(settings), user.username, client)
    st.session_state[CATCHUP] = snap
    st.session_state[PAGE] = "While you were away" if snap.has_news else "Alerts"


def render(settings: Settings) -> None:
    st.title("Tidewatch")
    st.caption("Standing rules over live trade and packet streams.")
    login_tab, signup_tab = st.tabs(["Log in", "Sign up"])
    with login_tab, st.form("login"):
        username = st.text_input("User name", key="login_username")
        password = st.text_input("Password", type="password", key="login_password")
        client = st.text_input(
            "Client name",
            value=settings.dashboard_client_id,
            key="login_client",
            help="Your cursor of seen alerts is kept per user and client name.",
        )
        if st.form_submit_button("Log in", key="login_submit"):
            try:
                user = auth.login(
                    sessions(settings), username, password, client=client_address(), settings=settings
                )
            except auth.AuthError as exc:
                st.error(plain(exc))
            else:
                _start(
                    settings,
                    user,
                    (client or settings.dashboard_client_id).strip()[:128] or settings.dashboard_client_id,
                )
                st.rerun()
    with signup_tab, st.form("signup"):
        username = st.text_input("User name", key="signup_username")
        password = st.text_input("Password", type="password", key="signup_password")
        again = st.text_input("Password again", type="password", key="signup_password2")
        if st.form_submit_button("Sign up", key="signup_submit"):
            if password != again:
                st.error("the two passwords differ")
            else:
                try:
                    auth.sign_up(sessions(settings), username, password)
                    user = auth.login(
                        sessions(settings), username, password, client=client_address(), settings=settings
                    )
                except auth.AuthError as exc:
                    st.error(plain(exc))
                else:
                    _start(settings, user, settings.dashboard_client_id)
                    st.rerun()
