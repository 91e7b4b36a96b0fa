"""The inventory as pyinfra loads it, and the checked Cluster from it.

One way for the deploy and for every command: pyinfra's own loader (`make_inventory`, as `pyinfra INVENTORY
deploy.py` makes it in the current folder), then each host's settings in pyinfra's scopes (settings.scopes)
and the checks of cluster_checks. `cluster_of` takes an Inventory pyinfra loaded (the deploy's run);
`offline_cluster` loads one from the files alone (config.py's preflight before pyinfra connects, the commands,
the verification suite). A bad setting is one SettingsError naming its file, key, value and what was expected.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import cluster as cluster_
from .cluster import Cluster
from .cluster_checks import check_inventory_shape, checked_cluster
from .settings import COORDINATOR, ROLES, WORKERS, SettingsError, scopes


def inventory_file(argv: list[str] = sys.argv) -> str:
    """The inventory file pyinfra was given (the first .py argument), for error messages."""
    return next((a for a in argv[1:] if a.endswith(".py")), "inventory.py")


def cluster_of(inventory, inventory_file: str = "inventory.py", deploying: bool = True) -> Cluster:
    """The checked Cluster from pyinfra's Inventory: each host's data in pyinfra's layers (--data, the host's
    own, every group it is in, group_data/all). The deploy and every command read the hosts this one way."""
    groups = {g for h in inventory for g in h.groups}
    for group in groups:
        if not isinstance(inventory.get_group_data(group), dict):  # ("a", "b"): pyinfra reads (hosts, data)
            raise SettingsError(
                f"{inventory_file}: group {group} = {inventory.get_group_data(group)!r} as its data: "
                "expected a list of hosts [...], or a (hosts, {data}) tuple"
            )
    names = {role: [h.name for h in inventory.get_group(role, [])] for role in ROLES}  # a role is its group
    role_of = {name: role for role in ROLES for name in names[role]}
    # another group of the inventory applies to the one role its hosts have (a setting no host of it reads is
    # refused there, as in group_data/workers.yml), or to every host when it holds both
    group_roles = {}
    for group in groups - set(ROLES):
        roles = {role_of.get(h.name) for h in inventory.get_group(group, [])} - {None}
        if len(roles) == 1:
            group_roles[group] = roles.pop()

    def plan(name: str, role: str):
        host = inventory.get_host(name)
        return cluster_.cluster_host(
            name,
            scopes(
                name,
                role,
                overrides=inventory.get_override_data(),
                host_data=inventory.get_host_data(name),
                groups=[(g, inventory.get_group_data(g)) for g in host.groups],
                all_data=inventory.get_data(),
                inventory_file=inventory_file,
                group_roles=group_roles,
            ),
        )

    check_inventory_shape(names[COORDINATOR], names[WORKERS], inventory_file)  # before a host's own checks
    hosts = {role: [plan(name, role) for name in names[role]] for role in ROLES}
    return checked_cluster(hosts[COORDINATOR], hosts[WORKERS], inventory_file, deploying)


def _quiet_import():
    """pyinfra_cli monkey-patches ssl on import (gevent), and warns that it does."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pyinfra_cli.inventory
        import pyinfra_cli.util
    return pyinfra_cli.inventory, pyinfra_cli.util


def _error_line(error: BaseException, filename: str) -> int | str:
    """The line of filename where error was raised (the innermost frame in that file)."""
    import traceback

    tb = getattr(error, "_traceback", None) or error.__traceback__
    return next(
        (
            f.lineno
            for f in reversed(traceback.extract_tb(tb))
            if Path(f.filename).resolve() == Path(filename).resolve()
        ),
        "?",
    )


def group_data_folders(inventory_path: Path) -> list[Path]:
    """The group_data/ folders pyinfra reads for this inventory run from the current folder (those that exist)."""
    folders = dict.fromkeys((Path.cwd() / "group_data", Path(inventory_path).resolve().parent / "group_data"))
    return [f for f in folders if f.is_dir()]


def load_inventory(inventory_path: Path, overrides: dict | None = None, group_data: Path | None = None):
    """pyinfra's own Inventory of an inventory file, made by pyinfra's own loader exactly as
    `pyinfra INVENTORY deploy.py` makes it in the current folder: every group of the file, group_data/ of the
    current folder and of the inventory's folder (and group_data, as --group-data), --data overrides.
    A file that does not run is one SettingsError naming its file and line."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    inventory_mod, util = _quiet_import()
    from pyinfra_cli.exceptions import UnexpectedExternalError

    path = Path(inventory_path)
    if not path.is_file():
        raise SettingsError(f"{path}: no such file: expected an inventory file (see inventory.py)")
    util.PYTHON_CODES.clear()  # pyinfra compiles each file once a process: a file may have changed since
    try:
        with ctx_state.use(State()):  # pyinfra's loader notes the file it runs on the current State
            inventory = inventory_mod.make_inventory(
                str(path),
                override_data=dict(overrides or {}),
                cwd=os.getcwd(),
                group_data_directories=[str(group_data)] if group_data else None,
            )
            hosts_listed_once(path, inventory_mod._get_groups_from_filename(str(path)))
            return inventory
    except SyntaxError as error:
        raise SettingsError(
            f"{error.filename}:{error.lineno}: {error.msg}: expected Python (name = value lines)"
        ) from None
    except UnexpectedExternalError as wrapped:
        error = wrapped.exception
        if isinstance(error, SettingsError):  # group_data's YAML loader says what is wrong itself
            raise error from None
        raise SettingsError(
            f"{wrapped.filename}:{_error_line(error, wrapped.filename)}: {type(error).__name__}: "
            f"{error}: expected Python that runs (name = value lines)"
        ) from None
    except SettingsError:
        raise
    except (TypeError, AttributeError, ValueError, KeyError) as error:  # pyinfra's loader on a group it cannot read
        raise SettingsError(
            f"{path}: {type(error).__name__}: {error}: expected each group a list of host names or "
            "(name, {data}) tuples, as in inventory.py"
        ) from None


def hosts_listed_once(path: Path, groups: dict) -> None:
    """A host listed twice in coordinator or in workers (pyinfra merges the two, the later one's data winning,
    without a word): refused. groups: the inventory file's groups as pyinfra reads them (hosts, or (hosts, data))."""
    first = _quiet_import()[0]._get_any_tuple_first  # pyinfra's own: a group or a host, with its data or without
    for role in ROLES:
        names = [first(h) for h in first(groups.get(role) or [])]
        twice = sorted({str(n) for n in names if names.count(n) > 1})
        if twice:
            raise SettingsError(
                f"{path}: {', '.join(twice)} is listed {max(names.count(n) for n in twice)} times in "
                f"group {role}: expected each host once (one line, with all its data)"
            )


def offline_cluster(
    inventory_path: Path, group_data: Path | None = None, overrides: dict | None = None, deploying: bool = True
) -> Cluster:
    """The Cluster as deploy.py computes it, from pyinfra's own Inventory (load_inventory), before connecting;
    for a plan (deploying=False), without the checks only a deploy needs (cluster_checks.DEPLOY_ONLY)."""
    return cluster_of(load_inventory(inventory_path, overrides, group_data), str(inventory_path), deploying)


def data_overrides(items: list[str]) -> dict:
    """--data KEY=VALUE items as pyinfra reads them (its own parse_cli_arg: 999 an int, null None, ...)."""
    parse_cli_arg = _quiet_import()[1].parse_cli_arg
    overrides = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise SettingsError(f"--data {item!r} on the command line: expected KEY=VALUE")
        overrides[key] = parse_cli_arg(raw)
    return overrides
