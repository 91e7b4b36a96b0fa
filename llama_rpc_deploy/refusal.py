"""A refusal: our own line alone on stderr and exit status 1, wherever a pyinfra run stops (config.py's
preflight, deploy.py's checks while pyinfra loads it for every host at once).

pyinfra loads deploy.py for each host in its own gevent greenlet. Of what stops a load:
- a DeployError is shown once, as "--> pyinfra error in FILE line N: ...", FILE an internal path of ours;
- SystemExit is not an Exception: it goes through gevent's hub, which prints it with a traceback, once a host;
- a Refusal is a PyinfraError, so exec_file passes it on as it is, and a CliError, so pyinfra's CLI re-raises
  the first host's as it is (the others are dropped); click then calls its show(): the line alone, exit 1.
"""

from __future__ import annotations

from typing import NoReturn

import click
from pyinfra.api.exceptions import PyinfraError
from pyinfra_cli.exceptions import CliError


class Refusal(CliError, PyinfraError):
    def show(self, file=None) -> None:
        click.echo(self.format_message(), err=True)


def refuse(message: str) -> NoReturn:
    """Stop the run with this line (it names the file, key, value and what was expected, or the host and what
    it lacks)."""
    raise Refusal(message)
