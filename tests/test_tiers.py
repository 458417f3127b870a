"""What a test needs is read from its code (tests/tiers.py): the fast tier (tests/fast) holds
no test that builds or signs a module, reads the installed kernel or runs what only root may."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import tests.kmod
import tests.service.conftest as service
from tests import kmod
from tests.kmod import build_modules, kernel_release
from tests.tiers import Needs


def _builds() -> object:
    return build_modules()


def _through_a_helper() -> object:
    return _builds()


def _through_the_package() -> object:
    return kmod.sign


def _through_a_local_import() -> object:
    from tests.mountns import run

    return run


def _in_a_lambda() -> object:
    return lambda: kernel_release()


def _mounts(at: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(at)], check=True)


def _another_uid() -> None:
    import os

    os.setuid(65534)


def _ping(n: int) -> object:
    return _pong(n - 1) if n else None


def _pong(n: int) -> object:
    return _ping(n - 1) if n else build_modules()


class _Builder:
    def build(self) -> object:
        return tests.kmod.build_modules()


def _plain(tmp_path: Path) -> str:
    return (tmp_path / "x").read_text()


@pytest.mark.parametrize(
    "code",
    [_builds, _through_a_helper, _through_the_package, _in_a_lambda, _Builder],
    ids=lambda f: f.__name__,
)
def test_code_reaching_the_kernel_packages_needs_kbuild(code: object) -> None:
    """A function that names one of tests/kmod's entry points into the kernel packages, itself,
    through a helper, a module attribute, a lambda or a class's method, needs ``kbuild``."""
    assert Needs().of(code) == {"kbuild"}


@pytest.mark.parametrize(
    "code", [_mounts, _another_uid, _through_a_local_import], ids=lambda f: f.__name__
)
def test_code_that_mounts_or_changes_uid_needs_root(code: object) -> None:
    """Running mount (or unshare, through tests/mountns.py imported in the function's body) or
    changing uid needs ``root``."""
    assert Needs().of(code) == {"root"}


@pytest.mark.parametrize("first, then", [(_ping, _pong), (_pong, _ping)], ids=["ping", "pong"])
def test_each_of_two_functions_calling_each_other_needs_what_either_needs(
    first: object, then: object
) -> None:
    """A cycle (``_ping`` calls ``_pong``, which calls ``_ping`` and builds) costs neither
    function the other's needs, whichever is read first."""
    needs = Needs()
    assert (needs.of(first), needs.of(then)) == ({"kbuild"}, {"kbuild"})


def test_code_of_the_standard_library_alone_needs_nothing() -> None:
    """A function that reads a file under the test's own directory needs nothing."""
    assert Needs().of(_plain) == frozenset()


def test_the_service_fixtures_that_build_or_sign_need_kbuild_and_the_keys_do_not() -> None:
    """The session fixtures that build (``modules``), sign (``signed``) or read the installed
    kernel (``kernel``, ``target``) need ``kbuild``; a key made with openssl does not."""
    needs = Needs()
    for fixture in (service.modules, service.signed, service.kernel, service.target):
        assert needs.of(fixture) == {"kbuild"}, fixture
    assert needs.of(service.rsa_key) == frozenset()


def test_every_test_here_is_in_the_fast_tier(request: pytest.FixtureRequest) -> None:
    """The hook in tests/conftest.py marked this test with nothing: it needs nothing."""
    names = {m.name for m in request.node.iter_markers()}
    assert not names & {"kbuild", "root", "debian", "vm"}
