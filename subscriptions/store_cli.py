"""``tidewatch subscribe`` and ``tidewatch subscriptions list|show|update|pause|resume|delete|relay``.

A thin shell over :class:`subscriptions.service.SubscriptionService`; every command acts
as the user named by ``--user`` (on this machine the CLI is trusted like a database
client: it creates the user, without a password, if needed).
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from subscriptions import budget
from subscriptions.errors import RuleError
from subscriptions.service import UNCHANGED, SubscriptionError, SubscriptionService, SubscriptionView

out = Console()
err = Console(stderr=True)

subs_app = typer.Typer(
    help="Your stored subscriptions (PostgreSQL; changes go to Kafka via the outbox).", no_args_is_help=True
)

UserOpt = Annotated[str, typer.Option("--user", "-u", help="act as this user")]
RefArg = Annotated[str, typer.Argument(help="subscription id or name")]
StalenessOpt = Annotated[
    str | None,
    typer.Option(
        "--staleness",
        metavar="DURATION",
        help="staleness budget: 30s, 2m, 1h, ... (at least the engine's lookup period, at most 24 h), "
        f"or 'none'. {budget.HELP}",
    ),
]


def _service() -> SubscriptionService:
    """The service of the configured database (the commands' settings)."""
    from tidewatch.settings import get_settings

    return SubscriptionService(settings=get_settings())


def _fail(exc: Exception) -> typer.Exit:
    if isinstance(exc, RuleError):
        err.print(f"[red]rule refused[/]\n{exc}", highlight=False, soft_wrap=True)
    else:
        err.print(f"[red]error:[/] {exc}", highlight=False)
    return typer.Exit(1)


def _show(v: SubscriptionView, verb: str) -> None:
    out.print(
        f"{verb} [bold]{v.name}[/] ({v.id}) state={v.state} version={v.version} "
        f"staleness={budget.budget_text(v.staleness_budget_ms).replace(' ', '')}",
        highlight=False,
    )


def _staleness(text: str) -> int | None:
    """``--staleness`` as milliseconds (None: ``none``, no budget); the service checks its range."""
    return budget.parse_budget(text)


def subscribe(
    rule: Annotated[
        str, typer.Argument(help='the rule text, e.g. "SELECT symbol FROM trades GROUP BY symbol HAVING …"')
    ],
    user: UserOpt,
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="a name for it (default: rule-<id>)")
    ] = None,
    staleness: StalenessOpt = None,
) -> None:
    """Store a new subscription for --user (validated and compiled first)."""
    svc = _service()
    try:
        budget_ms = _staleness(staleness) if staleness is not None else None
        svc.ensure_user(user)
        _show(svc.create(user, rule, name=name, staleness_budget_ms=budget_ms), "subscribed")
    except (RuleError, SubscriptionError) as exc:
        raise _fail(exc) from None


@subs_app.command("list")
def list_(
    user: UserOpt,
    all_: Annotated[bool, typer.Option("--all", help="include deleted ones")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON lines")] = False,
) -> None:
    """List --user's subscriptions."""
    try:
        subs = _service().list(user, include_deleted=all_)
    except SubscriptionError as exc:
        raise _fail(exc) from None
    if as_json:
        for v in subs:
            print(
                json.dumps(
                    {
                        "id": str(v.id),
                        "name": v.name,
                        "state": v.state,
                        "version": v.version,
                        "staleness_budget_ms": v.staleness_budget_ms,
                        "rule": v.rule_text,
                    }
                )
            )
        return
    table = Table(title=f"subscriptions of {user}")
    for col in ("name", "id", "state", "version", "staleness", "updated", "rule"):
        table.add_column(col, overflow="fold")
    for v in subs:
        table.add_row(
            v.name,
            str(v.id),
            v.state,
            str(v.version),
            budget.budget_text(v.staleness_budget_ms),
            f"{v.updated_at:%Y-%m-%d %H:%M:%S}",
            v.rule_text,
        )
    out.print(table)


@subs_app.command("show")
def show(ref: RefArg, user: UserOpt) -> None:
    """Show one subscription with its compiled plan and its history."""
    svc = _service()
    try:
        v = svc.get(user, ref)
        hist = svc.history(user, ref)
    except SubscriptionError as exc:
        raise _fail(exc) from None
    _show(v, "subscription")
    out.print(v.rule_text, highlight=False)
    out.print(f"staleness budget: {budget.budget_text(v.staleness_budget_ms)}", highlight=False)
    for h in hist:
        out.print(
            f"  v{h['version']} {h['change']:<7} {h['state']:<8} {h['changed_at']:%Y-%m-%d %H:%M:%S} "
            f"staleness={budget.budget_text(h['staleness_budget_ms']).replace(' ', '')}",
            highlight=False,
        )


@subs_app.command("update")
def update_(
    ref: RefArg,
    user: UserOpt,
    rule: Annotated[str | None, typer.Option("--rule", help="new rule text")] = None,
    name: Annotated[str | None, typer.Option("--name", help="new name")] = None,
    staleness: StalenessOpt = None,
) -> None:
    """Change the rule, the name and/or the staleness budget of a subscription (--staleness none
    clears the budget)."""
    try:
        budget_ms = UNCHANGED if staleness is None else _staleness(staleness)
        _show(
            _service().update(user, ref, rule_text=rule, name=name, staleness_budget_ms=budget_ms), "updated"
        )
    except (RuleError, SubscriptionError) as exc:
        raise _fail(exc) from None


def _state_command(verb: str, done: str):  # type: ignore[no-untyped-def]
    def command(ref: RefArg, user: UserOpt) -> None:
        try:
            _show(getattr(_service(), verb)(user, ref), done)
        except SubscriptionError as exc:
            raise _fail(exc) from None

    command.__doc__ = f"{verb.capitalize()} one of --user's subscriptions."
    return command


subs_app.command("pause")(_state_command("pause", "paused"))
subs_app.command("resume")(_state_command("resume", "resumed"))
subs_app.command("delete")(_state_command("delete", "deleted"))


@subs_app.command("relay")
def relay(
    once: Annotated[bool, typer.Option("--once", help="publish what is pending, then exit")] = False,
) -> None:
    """Run the outbox relay: publish subscription changes to Kafka exactly once."""
    from subscriptions.outbox import OutboxRelay, RelayBusy
    from tidewatch.settings import get_settings

    try:
        r = OutboxRelay.from_settings(get_settings())
    except RelayBusy as exc:
        raise _fail(exc) from None
    with r:
        if r.recovered:
            err.print(f"recovered {r.recovered} change(s) already on {r.topic}")
        if once:
            out.print(f"published {r.drain()} change(s) to {r.topic}")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        err.print(f"outbox relay publishing to {r.topic} on {r.bootstrap}")
        r.run(stop)


def register(app: typer.Typer) -> None:
    app.command("subscribe")(subscribe)
    app.add_typer(subs_app, name="subscriptions")
