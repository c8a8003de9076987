"""Accounts against a real PostgreSQL: argon2 hashes, hashed session tokens, logout, rate limit."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dashboard import auth
from tests.dashboard.support import PASSWORD, unique
from tidewatch.db.models import LoginAttempt, User, UserSession
from tidewatch.settings import Settings, get_settings

pytestmark = pytest.mark.integration


def test_sign_up_stores_an_argon2_hash_and_login_opens_a_session(sm: sessionmaker[Session]) -> None:
    name = unique()
    uid = auth.sign_up(sm, name, PASSWORD)
    with sm() as s:
        stored = s.scalar(sa.select(User.password_hash).where(User.id == uid))
    assert stored and stored.startswith("$argon2id$") and PASSWORD not in stored
    user = auth.login(sm, name, PASSWORD, client="10.0.0.1", settings=get_settings())
    assert user.username == name and len(user.token) >= 40
    with sm() as s:
        hashes = list(s.scalars(sa.select(UserSession.token_hash).where(UserSession.user_id == uid)))
    assert hashes == [auth.hash_token(user.token)] and user.token not in hashes
    assert auth.resolve(sm, user.token) == user
    auth.logout(sm, user.token)
    assert auth.resolve(sm, user.token) is None


def test_wrong_password_unknown_user_and_forged_token(sm: sessionmaker[Session]) -> None:
    name = unique()
    auth.sign_up(sm, name, PASSWORD)
    with pytest.raises(auth.AuthError, match="wrong user name or password"):
        auth.login(sm, name, PASSWORD + "x", settings=get_settings())
    with pytest.raises(auth.AuthError, match="wrong user name or password"):
        auth.login(sm, unique("ghost"), PASSWORD, settings=get_settings())
    assert auth.resolve(sm, "not-a-token") is None
    assert auth.resolve(sm, None) is None


@pytest.mark.parametrize(
    "username", ["", "<script>alert(1)</script>", "a' OR '1'='1", "x" * 65, "robert'); DROP TABLE users;--"]
)
def test_bad_user_names_are_refused(sm: sessionmaker[Session], username: str) -> None:
    with pytest.raises(auth.AuthError, match="user name"):
        auth.sign_up(sm, username, PASSWORD)
    with sm() as s:  # the tables are still there and hold no such user
        assert s.scalar(sa.select(sa.func.count()).select_from(User).where(User.username == username)) == 0


def test_password_rules_and_taken_names(sm: sessionmaker[Session]) -> None:
    name = unique()
    with pytest.raises(auth.AuthError, match="at least"):
        auth.sign_up(sm, name, "short")
    with pytest.raises(auth.AuthError, match="at most"):
        auth.sign_up(sm, name, "p" * 5000)
    auth.sign_up(sm, name, PASSWORD)
    with pytest.raises(auth.AuthError, match="taken"):
        auth.sign_up(sm, name, PASSWORD + "2")
    auth.login(sm, name, PASSWORD, settings=get_settings())  # the first password still works


def test_a_password_less_cli_user_claims_the_account_by_signing_up(sm: sessionmaker[Session]) -> None:
    name = unique()
    with sm.begin() as s:
        s.add(User(username=name, password_hash=None))
    with pytest.raises(auth.AuthError):
        auth.login(sm, name, "", settings=get_settings())  # no password set: no login
    auth.sign_up(sm, name, PASSWORD)
    assert auth.login(sm, name, PASSWORD, settings=get_settings()).username == name


def test_rate_limit_per_user_name_and_client(sm: sessionmaker[Session]) -> None:
    settings = Settings(login_max_failures=3, login_window_s=300)
    name = unique()
    auth.sign_up(sm, name, PASSWORD)
    for _ in range(3):
        with pytest.raises(auth.AuthError):
            auth.login(sm, name, "wrong-password", client="1.2.3.4", settings=settings)
    # locked for this client, even with the right password (not even checked)
    with pytest.raises(auth.RateLimited):
        auth.login(sm, name, PASSWORD, client="1.2.3.4", settings=settings)
    # another client, and another user from the same client, are not affected
    assert auth.login(sm, name, PASSWORD, client="5.6.7.8", settings=settings).username == name
    other = unique()
    auth.sign_up(sm, other, PASSWORD)
    assert auth.login(sm, other, PASSWORD, client="1.2.3.4", settings=settings).username == other
    with sm() as s:
        failures = s.scalar(
            sa.select(sa.func.count())
            .select_from(LoginAttempt)
            .where(LoginAttempt.username == name, LoginAttempt.succeeded.is_(False))
        )
    assert failures == 3
    # the window passed: the attempts age out
    with sm.begin() as s:
        s.execute(
            sa.update(LoginAttempt)
            .where(LoginAttempt.username == name)
            .values(attempted_at=sa.func.now() - sa.text("interval '10 minutes'"))
        )
    assert auth.login(sm, name, PASSWORD, client="1.2.3.4", settings=settings).username == name


def test_expired_sessions_do_not_resolve(sm: sessionmaker[Session]) -> None:
    name = unique()
    auth.sign_up(sm, name, PASSWORD)
    user = auth.login(sm, name, PASSWORD, settings=get_settings())
    with sm.begin() as s:
        s.execute(
            sa.update(UserSession)
            .where(UserSession.token_hash == auth.hash_token(user.token))
            .values(expires_at=sa.func.now() - sa.text("interval '1 second'"))
        )
    assert auth.resolve(sm, user.token) is None


def test_failures_from_many_clients_lock_the_user_name_for_every_client(sm: sessionmaker[Session]) -> None:
    settings = Settings(login_max_failures=3, login_max_failures_per_user=4, login_window_s=300)
    name, other = unique(), unique()
    auth.sign_up(sm, name, PASSWORD)
    auth.sign_up(sm, other, PASSWORD)
    for i in range(4):  # one or two failures each from four addresses: no single client hits 3
        with pytest.raises(auth.AuthError) as exc:
            auth.login(
                sm, name, "wrong-password", client=f"10.0.0.{i % 2 if i < 2 else i}", settings=settings
            )
        assert not isinstance(exc.value, auth.RateLimited)
    # a fresh address, with the right password: refused, the name is locked everywhere
    with pytest.raises(auth.RateLimited):
        auth.login(sm, name, PASSWORD, client="192.0.2.1", settings=settings)
    # other user names are not affected
    assert auth.login(sm, other, PASSWORD, client="10.0.0.1", settings=settings).username == other
    # the window passes: the name logs in again
    with sm.begin() as s:
        s.execute(
            sa.update(LoginAttempt)
            .where(LoginAttempt.username == name)
            .values(attempted_at=sa.func.now() - sa.text("interval '10 minutes'"))
        )
    assert auth.login(sm, name, PASSWORD, client="192.0.2.1", settings=settings).username == name
