"""``modstage verify a.ko b.ko``: files named together are one bundle in the order given,
judged exactly as intake judges a drop whose manifest lists the same modules in that order."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from service.cli import main
from service.errors import Refusal
from service.layout import Layout
from service.verify.bundle import in_order
from service.verify.verdict import Verdict
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.conftest import HostTree
from tests.service.fakes import make_intake


@pytest.fixture
def host(host_tree: HostTree) -> Layout:
    """A host tree trusting the RSA key, running the test modules' kernel."""
    return host_tree()


@pytest.fixture(scope="session")
def no_depends(
    modules: dict[str, Path], rsa_key: SigningKey, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """ms_consumer with its ``depends=ms_exporter`` blanked (as a module built apart from
    its exporter carries none), signed with the trusted key."""
    data = modules["ms_consumer"].read_bytes()
    field = b"depends=ms_exporter\0"
    assert data.count(field) == 1
    unsigned = tmp_path_factory.mktemp("no-depends") / "ms_consumer.ko"
    unsigned.write_bytes(data.replace(field, b"depends=" + b"\0" * (len(field) - 8)))
    return sign(unsigned, rsa_key, unsigned.with_name("ms_consumer.signed.ko"))


def verify(host: Layout, kernel: str, *paths: Path | str, as_json: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    argv = ["verify", "--root", str(host.root), "--kernel", kernel, *(["--json"] * as_json)]
    return main([*argv, *map(str, paths)], out), out.getvalue()


def test_a_consumer_named_after_its_exporter_is_accepted_and_the_output_says_why(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Named alone the consumer is refused (its symbol is nobody's); named after its
    exporter it is accepted, and the output (a note; ``bundle`` and ``notes`` in JSON)
    says the files were judged as one bundle in the order given."""
    exporter, consumer = signed["ms_exporter"], signed["ms_consumer"]
    code, out = verify(host, kernel, consumer)
    assert code == 1 and "ENOENT: Unknown symbol ms_exporter_value" in out
    code, out = verify(host, kernel, exporter, consumer)
    note = f"note: judged as one bundle in the order given: {exporter}, {consumer}"
    assert code == 0 and note in out.splitlines(), out
    code, out = verify(host, kernel, exporter, consumer, as_json=True)
    objs = json.loads(out)
    assert [o["bundle"] for o in objs] == [[str(exporter), str(consumer)]] * 2
    assert all(note.removeprefix("note: ") in o["notes"] for o in objs)


def test_a_consumer_named_before_its_exporter_is_refused_naming_the_exporter(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Nothing is reordered: the consumer named first is refused with ENOENT, its reason
    naming the file that exports what it needs (its ``depends=``); the exporter is fine."""
    exporter, consumer = signed["ms_exporter"], signed["ms_consumer"]
    code, out = verify(host, kernel, consumer, exporter)
    lines = out.splitlines()
    assert code == 1 and lines[1].startswith(f"ok        {exporter}")
    assert lines[0].startswith(f"REJECTED  {consumer}")
    assert lines[0].endswith(
        f"reason: ENOENT: depends on ms_exporter ({exporter}), which the bundle loads later; "
        "modules load in manifest order, put it first"
    )


def test_without_depends_the_unknown_symbol_names_the_later_file_exporting_it(
    host: Layout, signed: dict[str, Path], no_depends: Path, kernel: str
) -> None:
    """A consumer without ``depends=`` named before its exporter: the kernel's unknown
    symbol, and which named file exports it but loads after it."""
    exporter = signed["ms_exporter"]
    code, out = verify(host, kernel, no_depends, exporter, as_json=True)
    first = json.loads(out)[0]
    assert code == 1 and first["errno"] == "ENOENT"
    assert first["reason"] == (
        "ENOENT: Unknown symbol ms_exporter_value (no export of that name); "
        f"{exporter} exports it but loads after it"
    )
    assert verify(host, kernel, exporter, no_depends)[0] == 0


def test_the_same_module_named_twice_is_refused_the_second_time(
    host: Layout, signed: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """Two files registering one name cannot load together: the second is EEXIST."""
    again = sign(signed["ms_params"], rsa_key, tmp_path / "again.ko")
    code, out = verify(host, kernel, signed["ms_params"], again)
    lines = out.splitlines()
    assert code == 1 and lines[0].startswith("ok ")
    assert lines[1].endswith(f"reason: EEXIST: module ms_params is also {signed['ms_params']}, "
                             "earlier in the bundle")  # fmt: skip


def test_apart_judges_each_file_alone(
    host: Layout, signed: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """``--apart``: each file is judged alone, so two builds of one module are both accepted,
    a consumer named after its exporter is refused (the exporter is not loaded for it), and
    no bundle note is printed."""
    again = sign(signed["ms_params"], rsa_key, tmp_path / "again.ko")
    exporter, consumer = signed["ms_exporter"], signed["ms_consumer"]
    code, out = verify(host, kernel, "--apart", signed["ms_params"], again, exporter, consumer)
    lines = out.splitlines()
    assert code == 1 and "judged as one bundle" not in out, out
    assert [line.split()[0] for line in lines[:4]] == ["ok", "ok", "ok", "REJECTED"], out
    assert "ENOENT: Unknown symbol ms_exporter_value" in lines[3]


def test_each_drop_is_its_own_bundle_and_the_files_around_it_are_one(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A drop named among files is judged alone (its manifest's order), and the files
    named around it are one bundle that does not see the drop's exports."""
    exporter, consumer = signed["ms_exporter"], signed["ms_consumer"]
    drop = stage(
        host.incoming,
        bundle="b",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(exporter, ""), ModuleSpec(consumer, "")],
    )
    code, out = verify(host, kernel, exporter, drop, consumer)
    assert code == 0, out
    assert f"note: judged as one bundle in the order given: {exporter}, {consumer}" in out
    code, out = verify(host, kernel, drop, consumer, as_json=True)
    objs = json.loads(out)
    assert [o["ok"] for o in objs] == [True, True, False]
    assert objs[2]["reason"].startswith("ENOENT: Unknown symbol ms_exporter_value")
    assert objs[0]["bundle"] == [str(drop / "modules" / p.name) for p in (exporter, consumer)]


@pytest.mark.parametrize("depends", [True, False], ids=["depends", "no-depends"])
@pytest.mark.parametrize("exporter_first", [True, False], ids=["exporter-first", "consumer-first"])
def test_verify_judges_named_files_as_intake_judges_the_drop(
    host: Layout,
    signed: dict[str, Path],
    no_depends: Path,
    kernel: str,
    depends: bool,
    exporter_first: bool,
) -> None:
    """For the files of a drop named in its manifest's order, verify accepts exactly when
    intake takes the drop in, and every refusal verify gives is one of intake's reasons,
    about a file intake names."""
    pair = [signed["ms_exporter"], signed["ms_consumer"] if depends else no_depends]
    files = pair if exporter_first else pair[::-1]
    drop = stage(
        host.incoming,
        bundle="b",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(f, "") for f in files],
    )
    named = [drop / "modules" / f.name for f in files]
    code, out = verify(host, kernel, *named, as_json=True)
    verdicts = json.loads(out)
    [outcome] = make_intake(host).run()
    assert outcome.accepted == (code == 0) == exporter_first, outcome.reasons
    # intake names the drop where it is kept (quarantine/<drop>): compare beneath the drop
    at = re.compile(rf"\S*/{re.escape(drop.name)}/")
    refused = {at.sub("", f"{v['file']}: {v['reason']}") for v in verdicts if not v["ok"]}
    reasons = {at.sub("", r) for r in outcome.reasons}
    assert refused <= reasons, (refused, reasons)
    assert {r.split(": ", 1)[0] for r in reasons} == {r.split(": ", 1)[0] for r in refused}


def test_an_order_refusal_does_not_hide_an_earlier_check_of_the_kernel() -> None:
    """The order becomes the reason of an accepted module, or of one refused by a policy
    or an unknown symbol (what the order causes); a refusal by a check the kernel makes
    before symbol resolution (the signature) stays."""
    unsigned = Refusal("ENODATA", "module is unsigned")
    for was, stays in [
        (None, False),
        (Refusal("ENOENT", "Unknown symbol x (no export of that name)"), False),
        (Refusal("EINVAL", "policy", policy=True), False),
        (unsigned, True),
    ]:
        verdicts = [
            Verdict("a.ko", was is None, was, name="consumer", depends=("exporter",)),
            Verdict("b.ko", True, name="exporter"),
        ]
        first = in_order(verdicts)[0]
        assert not first.ok and first.errno is not None
        assert (first.refusal == was) == stays, first
