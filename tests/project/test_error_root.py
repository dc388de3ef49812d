"""One error root: every public exception class of the ``cod`` package derives from CodError.

The modules are found by walking the installed package (so a new module is checked without
being listed here); an exception class is public when its name does not start with ``_``.
Where callers catch a built-in base (``ValueError``, ``OSError``) it is kept as a second base.
"""

from __future__ import annotations

import errno
import importlib
import inspect
import pkgutil

import pytest

from cod.protocol.errors import CodError


# The namespace's parts (the top-level folders, fixed): an editable install hides them from
# walking ``cod`` itself, so each is walked.
PARTS = ("protocol", "client", "cli", "skb", "rm", "facts", "stored_procedures")


def cod_modules() -> list[str]:
    names = []
    for part in PARTS:
        package = importlib.import_module(f"cod.{part}")
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.rsplit(".", 1)[-1] != "__main__":  # importing it would run it
                names.append(info.name)
    return sorted(names)


def public_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in cod_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and not attr.startswith("_")
                    and value.__module__ == name):
                found[f"{name}.{attr}"] = value
    return [found[k] for k in sorted(found)]


EXCEPTIONS = public_exceptions()


def test_the_walk_finds_the_roots_that_were_outside() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"DeployError", "ElasticError", "PerfError", "ShellError", "ConnectionProblem", "SKBError",
            "RMError", "EnforceError"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_public_exception_derives_from_cod_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, CodError), f"{cls.__module__}.{cls.__name__} bases {cls.__mro__[1:]}"


def test_the_built_in_bases_callers_catch_are_kept() -> None:
    from cod.cli.shell.errors import ConnectionProblem, ShellError
    from cod.rm.deploy.errors import DeployError, InfeasibleError
    from cod.rm.deploy.measure.perf import PerfError
    from cod.rm.elastic.errors import ElasticError, GroupGone

    assert issubclass(InfeasibleError, DeployError) and issubclass(DeployError, ValueError)
    err = PerfError(errno.ENOSYS, "perf_event_open: unknown syscall number")
    assert isinstance(err, OSError) and err.errno == errno.ENOSYS and err.strerror.startswith("perf_event_open")
    assert issubclass(GroupGone, ElasticError)
    shell = ShellError("bad argument", kind="usage", detail=["x"])
    assert (shell.kind, shell.detail, str(shell)) == ("usage", ["x"], "bad argument")
    assert ConnectionProblem("gone", lost=True).lost is True


def test_the_shell_still_tells_its_own_errors_from_a_lost_connection() -> None:
    from cod.cli.shell.errors import describe
    from cod.cli.shell.topology import TopologyError
    from cod.client.errors import ConnectionLost

    assert describe(ConnectionLost("the RM closed the connection")).kind == "lost"
    assert describe(CodError("call: no reply within 5 s")).kind == "lost"
    assert describe(TopologyError("the SKB holds no CPUs")).kind == "internal"
