"""The ``pdpfl`` command-line tool.

Each sub-command lives in its own module and registers itself on the shared Typer app, so
that the CLI stays a thin layer over the library. Bad input exits with code 2 and a message
naming the offending option (see :func:`pdpfl.cli._common.fail`).
"""

from __future__ import annotations

import click
import typer
from typer.core import TyperGroup

from pdpfl.cli import (
    account,
    audit,
    calibrate,
    compare,
    data,
    export,
    flower,
    privacy,
    receipts,
    reproduce,
    run,
    tune,
)


def usage_error_line(err: click.UsageError) -> str:
    """``error: <field>: <message>`` for a usage error found by click (a value outside an
    option's range, a missing or unknown option), like every other bad input."""
    param = getattr(err, "param", None)
    if isinstance(err, click.NoSuchOption):
        return f"error: {err.option_name}: no such option (see --help)"
    if param is not None:
        field = param.opts[0] if getattr(param, "opts", None) else param.name
        if isinstance(err, click.MissingParameter):
            return f"error: {field}: required (see --help)"
        message = err.message if isinstance(err, click.BadParameter) else err.format_message()
        return f"error: {field}: {message}"
    return f"error: {err.format_message()}"


def missing_extra_line(err: ImportError, command: str | None) -> str | None:
    """``error: <field>: ... pip install 'pdpfl[EXTRA]'`` when ``err`` is a missing optional
    extra (:data:`pdpfl.errors.EXTRAS`), else None (a broken install keeps its traceback)."""
    from pdpfl.errors import MissingExtra, extra_of

    if isinstance(err, MissingExtra):
        return f"error: {err}"
    found = extra_of(err)
    if found is None:
        return None
    module, extra = found
    field = f"pdpfl {command}" if command else "pdpfl"
    return (
        f"error: {field}: needs the {extra} extra: pip install 'pdpfl[{extra}]' "
        f"({module} is not installed)"
    )


class _Commands(TyperGroup):
    """The root command: click's usage errors in pdpfl's one-line format (exit 2); a feature
    whose optional extra is not installed names the extra (exit 2, no traceback); SIGTERM and
    SIGHUP stop a command exactly as Ctrl-C does (:mod:`pdpfl.runtime.signals`), and a command
    stopped by one of them exits with 128 + the signal's number (130, 143, 129), without a
    traceback, whether or not it has its own clean-up."""

    def invoke(self, ctx: click.Context) -> object:
        from pdpfl.runtime.signals import exit_code, signal_name, signal_of, stop_signals_interrupt

        try:
            with stop_signals_interrupt():
                return super().invoke(ctx)
        except click.UsageError as err:
            click.echo(usage_error_line(err), err=True)
            raise click.exceptions.Exit(2) from None
        except KeyboardInterrupt as err:  # a command without clean-up of its own
            click.echo(f"\ninterrupted ({signal_name(signal_of(err))})", err=True)
            raise click.exceptions.Exit(exit_code(err)) from None
        except ImportError as err:
            line = missing_extra_line(err, ctx.invoked_subcommand)
            if line is None:
                raise
            click.echo(line, err=True)
            raise click.exceptions.Exit(2) from None


app = typer.Typer(
    cls=_Commands,
    help="pdpfl: cross-silo federated learning with personalized differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the pdpfl version and exit."),
    verbose: int = typer.Option(
        0,
        "-v",
        "--verbose",
        count=True,
        help="More log output (-v info, -vv debug); runs "
        "also write run.log in their output folder.",
    ),
    log_level: str | None = typer.Option(
        None, "--log-level", help="Log level: debug, info, warning (default) or error."
    ),
) -> None:
    """pdpfl: cross-silo federated learning with personalized differential privacy."""
    from pdpfl.cli._common import fail
    from pdpfl.logs import configure, level_of

    try:
        configure(level_of(verbose, log_level))
    except ValueError as err:
        fail(str(err))
    if version:
        from pdpfl._version import __version__

        typer.echo(__version__)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(code=2)


for _module in (
    account,
    calibrate,
    data,
    run,
    compare,
    tune,
    privacy,
    receipts,
    export,
    audit,
    reproduce,
    flower,
):
    _module.register(app)


#: Options of the root command that may be given anywhere on the command line.
_GLOBAL_FLAGS = {"-v", "-vv", "-vvv", "--verbose"}


def hoist_global_options(argv: list[str]) -> list[str]:
    """Move ``-v``/``--verbose``/``--log-level X`` given after a sub-command to the front, so
    that they work on every command (``pdpfl run cfg.yaml -v``)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            rest.extend(argv[i:])
            break
        if tok in _GLOBAL_FLAGS:
            front.append(tok)
        elif tok == "--log-level" and i + 1 < len(argv):
            front.extend(argv[i : i + 2])
            i += 1
        elif tok.startswith("--log-level="):
            front.append(tok)
        else:
            rest.append(tok)
        i += 1
    return front + rest


def main() -> None:
    """Console-script entry point (the process ends when it returns or raises).

    Tests and embedders call :data:`app` (e.g. through click's ``CliRunner``), not this: only
    here do commands pause the garbage collector while they import and parse, and does the
    exit skip the collector's passes over the module graph (:mod:`pdpfl.cli._process`).
    """
    import sys

    from pdpfl.cli import _process

    _process.ENDS_PROCESS = True
    try:
        app(args=hoist_global_options(sys.argv[1:]), prog_name="pdpfl")
    finally:
        _process.lighten_exit()
