"""The ``pdpfl`` command-line tool.

Each sub-command lives in its own module and registers itself on the shared Typer app, so
that the CLI stays a thin layer over the library. Bad input exits with code 2 and a message
naming the offending option (see :func:`pdpfl.cli._common.fail`).
"""

from __future__ import annotations

import typer

from pdpfl.cli import account, audit, calibrate, compare, data, flower, privacy, run

app = typer.Typer(
    help="pdpfl: cross-silo federated learning with personalized differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the pdpfl version and exit."),
) -> None:
    """pdpfl: cross-silo federated learning with personalized differential privacy."""
    if version:
        from pdpfl._version import __version__

        typer.echo(__version__)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(code=2)


for _module in (account, calibrate, data, run, compare, privacy, audit, flower):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
