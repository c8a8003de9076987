"""Dashboard accounts: sign-up, login, sessions, logout, login rate limiting.

Pure logic over SQLAlchemy sessions (no Streamlit), so it is tested against a real
PostgreSQL without a browser.

* Passwords are hashed with argon2id (``argon2-cffi``'s :class:`~argon2.PasswordHasher`,
  RFC 9106 defaults); the hash is re-computed on login when the parameters changed.
* A login returns a random bearer token (``secrets.token_urlsafe(32)``); only its SHA-256
  is stored in ``user_sessions``, so a copy of the table does not let anyone log in.
* Every attempt is recorded in ``login_attempts``; after ``settings.login_max_failures``
  failures of one user name from one client within ``settings.login_window_s`` seconds,
  further attempts from that client are refused without checking the password (and are
  not recorded, so the lock ends ``login_window_s`` after the last counted failure).
  Client addresses can be many (or spoofed), so ``settings.login_max_failures_per_user``
  failures of one user name from all clients together lock that name for every client.
* Unknown user names cost the same argon2 verification as known ones (no timing oracle),
  and the message never says which of the two was wrong.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dashboard.errors import DashboardError
from subscriptions.service import InvalidName, check_username
from tidewatch.db.models import LoginAttempt, User, UserSession
from tidewatch.settings import Settings

MIN_PASSWORD = 8
MAX_PASSWORD = 1024  # argon2 hashes anything, but a megabyte "password" is an attack, not a password

_hasher = PasswordHasher()
#: verified against for unknown user names, so both paths cost one argon2 verification
_DUMMY_HASH = _hasher.hash("tidewatch-no-such-user")


class AuthError(DashboardError):
    """A refusal with a message fit to show the user."""


class RateLimited(AuthError):
    """Too many failed logins of this user name from this client."""


@dataclass(frozen=True)
class LoggedIn:
    """A logged-in user as the dashboard holds it: the bearer token stays in the browser session."""

    user_id: int
    username: str
    token: str
    expires_at: datetime


def hash_token(token: str) -> str:
    """What ``user_sessions.token_hash`` stores for a bearer token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _check_password(password: str) -> None:
    if not isinstance(password, str) or len(password) < MIN_PASSWORD:
        raise AuthError(f"a password has at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise AuthError(f"a password has at most {MAX_PASSWORD} characters")


def sign_up(sessions: sessionmaker[Session], username: str, password: str) -> int:
    """Create an account; returns the user id.  A user created from the CLI without a password
    (``password_hash`` NULL) claims it here by setting one."""
    try:
        check_username(username)
    except InvalidName as exc:
        raise AuthError(str(exc)) from None
    _check_password(password)
    pw_hash = _hasher.hash(password)
    with sessions.begin() as s:
        user = s.scalars(select(User).where(User.username == username).with_for_update()).first()
        if user is not None:
            if user.password_hash is not None:
                raise AuthError("that user name is taken")
            user.password_hash = pw_hash
            return user.id
        user = User(username=username, password_hash=pw_hash)
        s.add(user)
        try:
            s.flush()
        except IntegrityError:
            raise AuthError("that user name is taken") from None
        return user.id


def recent_failures(s: Session, username: str, client: str | None, settings: Settings) -> int:
    """Failed logins of ``username`` within ``login_window_s``: from ``client``, or from every
    client when ``client`` is None."""
    since = func.now() - timedelta(seconds=settings.login_window_s)
    q = (
        select(func.count())
        .select_from(LoginAttempt)
        .where(
            LoginAttempt.username == username,
            LoginAttempt.succeeded.is_(False),
            LoginAttempt.attempted_at > since,
        )
    )
    if client is not None:
        q = q.where(LoginAttempt.client == client)
    return int(s.scalar(q) or 0)


def login(
    sessions: sessionmaker[Session],
    username: str,
    password: str,
    client: str = "unknown",
    *,
    settings: Settings,
) -> LoggedIn:
    """Check the password and open a session; raises :class:`AuthError` / :class:`RateLimited`
    (limits: ``settings.login_*``, lifetime: ``settings.session_ttl_hours``)."""
    st = settings
    username = (username or "")[:64]
    client = (client or "unknown")[:128]
    with sessions.begin() as s:
        if (
            recent_failures(s, username, client, st) >= st.login_max_failures
            or recent_failures(s, username, None, st) >= st.login_max_failures_per_user
        ):
            raise RateLimited(
                f"too many failed logins for this user name; try again in {st.login_window_s // 60 or 1} minute(s)"
            )
    user_id: int | None = None
    ok = False
    new_hash: str | None = None
    with sessions() as s:
        row = s.execute(select(User.id, User.password_hash).where(User.username == username)).first()
    stored = row[1] if row is not None and row[1] else _DUMMY_HASH
    if isinstance(password, str) and len(password) <= MAX_PASSWORD:
        try:
            ok = _hasher.verify(stored, password) and row is not None and bool(row[1])
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            ok = False
    if ok and row is not None:
        user_id = int(row[0])
        if _hasher.check_needs_rehash(stored):
            new_hash = _hasher.hash(password)
    with sessions.begin() as s:
        s.add(LoginAttempt(username=username, client=client, succeeded=ok))
        if not ok or user_id is None:
            s.flush()
            failure = AuthError("wrong user name or password")
        else:
            if new_hash is not None:
                s.execute(update(User).where(User.id == user_id).values(password_hash=new_hash))
            token = secrets.token_urlsafe(32)
            now = s.scalar(select(func.now()))
            assert isinstance(now, datetime)
            expires = now + timedelta(hours=st.session_ttl_hours)
            s.add(UserSession(token_hash=hash_token(token), user_id=user_id, expires_at=expires))
            return LoggedIn(user_id, username, token, expires)
    raise failure


def resolve(sessions: sessionmaker[Session], token: str | None) -> LoggedIn | None:
    """The user of a live session token, or None (unknown, expired or logged out)."""
    if not token:
        return None
    with sessions() as s:
        row = s.execute(
            select(User.id, User.username, UserSession.expires_at)
            .join(UserSession, UserSession.user_id == User.id)
            .where(UserSession.token_hash == hash_token(token), UserSession.expires_at > func.now())
        ).first()
    if row is None:
        return None
    return LoggedIn(int(row[0]), str(row[1]), token, row[2])


def logout(sessions: sessionmaker[Session], token: str | None) -> None:
    """End a session (the token stops resolving at once); expired sessions are swept too."""
    with sessions.begin() as s:
        if token:
            s.execute(delete(UserSession).where(UserSession.token_hash == hash_token(token)))
        s.execute(delete(UserSession).where(UserSession.expires_at <= func.now()))
