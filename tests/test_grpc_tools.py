"""gRPC tools against a real `electric server` on loopback: the real buf binary.

buf curl lists the methods through reflection under each of its names
(``--reflect-protocol grpc-v1`` and ``grpc-v1alpha``, each without falling back
to the other), calls ``Health/List``, and receives an error whose
``google.rpc.ErrorInfo`` detail it names; buf convert decodes that detail with
the descriptors reflection serves (buf curl itself decodes only the detail types
compiled into it, so it prints the value as base64). Methods and services the
server does not have are answered ``UNIMPLEMENTED``; every test ends by stopping
the server and reading its whole log: no traceback, no error. The banners of
`electric server` and `electric dev` (what `make run` runs) print a buf curl
line that works as printed.

buf is the Makefile's, from npm (installed here if it is missing): without
Node.js/npm these tests skip, except with CI=true, where they must run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from helpers import OutputPump

from electric_sdk._proto.electric.v1 import entity_service_pb2 as api

ROOT = Path(__file__).resolve().parent.parent
BUF = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
PROTOCOLS = {"grpc-v1": "grpc.reflection.v1", "grpc-v1alpha": "grpc.reflection.v1alpha"}
# buf curl exits with the status code times 8.
NOT_FOUND_EXIT, UNIMPLEMENTED_EXIT = 5 * 8, 12 * 8
STARTUP_S = 60.0


@pytest.fixture(scope="module")
def buf() -> Path:
    if not BUF.exists():
        if shutil.which("npm") is None:
            if os.environ.get("CI") == "true":
                pytest.fail("buf is installed from npm, and Node.js/npm is missing: CI must run these tests")
            pytest.skip("Node.js/npm is not installed: buf (installed from npm) cannot be")
        subprocess.run(["make", "--no-print-directory", str(BUF.relative_to(ROOT))], cwd=ROOT, check=True)
    return BUF


@dataclass
class Served:
    """A server process, its output read all along, and its gRPC address."""

    proc: subprocess.Popen[str]
    output: OutputPump
    address: str

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def banner_command(self, buf: Path) -> list[str]:
        """The banner's buf curl line, as a user would paste it (buf: the Makefile's)."""
        line = self.output.wait_for(r"grpc:\s+(buf curl .*)$", STARTUP_S).group(1)
        return [str(buf), *shlex.split(line)[1:]]

    def stopped_log(self) -> str:
        """Drain the server (SIGTERM) and return everything it printed."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(STARTUP_S) == 0, self.output.text()
        return self.output.ended(STARTUP_S)


@contextlib.contextmanager
def serve(*command: str) -> Iterator[Served]:
    proc = subprocess.Popen(
        [*ELECTRIC, *command, "--listen", "127.0.0.1:0", "--http", "off"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = OutputPump(proc)
    try:
        address = output.wait_for(r"^electric server listening on (\S+)", STARTUP_S).group(1)
        output.wait_for(r"stop: ", STARTUP_S)  # the banner's last line
        yield Served(proc, output, address)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(STARTUP_S)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serve("server", "--data", str(tmp_path / "data")) as server:
        yield server


def assert_clean(log: str) -> None:
    assert "Traceback" not in log, log
    assert not re.search(r"^\S+ \S+ (ERROR|CRITICAL) ", log, re.MULTILINE), log


def curl(buf: Path, *args: str, body: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    data = [] if body is None else ["-d", json.dumps(body)]
    return subprocess.run(
        [str(buf), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *data, *args],
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=False,
    )


def methods_of(service: Any) -> set[str]:
    return {f"{service.full_name}/{m.name}" for m in service.methods}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_buf_lists_the_methods_through_reflection(buf: Path, served: Served, protocol: str) -> None:
    listed = curl(buf, "-v", "--reflect-protocol", protocol, "--list-methods", served.url)

    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) == {
        *methods_of(api.DESCRIPTOR.services_by_name["EntityService"]),
        "grpc.health.v1.Health/Check",
        "grpc.health.v1.Health/List",
        "grpc.health.v1.Health/Watch",
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    }
    # Through the name asked for, and that one only (buf falls back only when none is given).
    asked = {m.group(1) for m in re.finditer(r"POST /(grpc\.reflection\.\w+)\.", listed.stderr)}
    assert asked == {PROTOCOLS[protocol]}
    assert_clean(served.stopped_log())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_buf_calls_health_list(buf: Path, served: Served, protocol: str) -> None:
    listed = curl(buf, "--reflect-protocol", protocol, f"{served.url}/grpc.health.v1.Health/List")

    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {
        "statuses": {
            name: {"status": "SERVING"}
            for name in ("", "electric.v1.EntityService", "electric.v1.RuntimeService", "electric.v1.writes")
        }
    }
    assert_clean(served.stopped_log())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_buf_decodes_an_error_info(buf: Path, served: Served, protocol: str, tmp_path: Path) -> None:
    """The error names its detail; the descriptors reflection serves for that name decode it."""
    missing = {"ref": {"type": "nope", "id": "x"}}
    failed = curl(
        buf,
        "--reflect-protocol",
        protocol,
        f"{served.url}/electric.v1.EntityService/GetEntity",
        body=missing,
    )
    assert failed.returncode == NOT_FOUND_EXIT, failed.stderr
    error = json.loads(failed.stderr)
    assert (error["code"], error["message"]) == ("not_found", "No entity /nope/x")
    (detail,) = error["details"]
    assert detail["type"] == "google.rpc.ErrorInfo"

    reflection = PROTOCOLS[protocol]
    described = curl(
        buf,
        "--reflect-protocol",
        protocol,
        f"{served.url}/{reflection}.ServerReflection/ServerReflectionInfo",
        body={"fileContainingSymbol": detail["type"]},
    )
    assert described.returncode == 0, described.stderr
    files = json.loads(described.stdout)["fileDescriptorResponse"]["fileDescriptorProto"]
    image = tmp_path / "reflected.binpb"
    image.write_bytes(
        descriptor_pb2.FileDescriptorSet(
            file=[descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(f)) for f in files]
        ).SerializeToString()
    )
    value = tmp_path / "detail.binpb"
    value.write_bytes(base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4)))  # sent unpadded
    decoded = subprocess.run(
        [
            str(buf),
            "convert",
            str(image),
            "--type",
            detail["type"],
            "--from",
            str(value),
            "--to",
            "-#format=json",
        ],
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=False,
    )

    assert decoded.returncode == 0, decoded.stderr
    assert json.loads(decoded.stdout) == {
        "reason": "ENTITY_NOT_FOUND",
        "domain": "electric.v1",
        "metadata": {"entity": "/nope/x"},
    }
    assert_clean(served.stopped_log())


# A service the server does not have, and a method that its own service does not have.
PROBES = {"probe.v1": ("Nowhere", "Call"), "electric.v1": ("EntityService", "Vanish")}


def probe_schema(folder: Path) -> Path:
    """A schema declaring PROBES, for buf curl to call them by (reflection knows none of them)."""
    for package, (service, method) in PROBES.items():
        path = folder / package.replace(".", "/") / "probe.proto"
        path.parent.mkdir(parents=True)
        path.write_text(
            f'syntax = "proto3";\npackage {package};\nimport "google/protobuf/empty.proto";\n'
            f"service {service} {{\n  rpc {method}(google.protobuf.Empty) returns (google.protobuf.Empty);\n}}\n"
        )
    return folder


def test_unknown_methods_answer_unimplemented_and_log_nothing(
    buf: Path, served: Served, tmp_path: Path
) -> None:
    schema = probe_schema(tmp_path / "schema")
    for package, (service, method) in PROBES.items():
        answer = curl(buf, "--schema", str(schema), f"{served.url}/{package}.{service}/{method}")
        assert answer.returncode == UNIMPLEMENTED_EXIT, answer.stderr
        assert json.loads(answer.stderr)["code"] == "unimplemented"
    unknown = curl(buf, f"{served.url}/grpc.health.v1.Health/Check", body={"service": "nope.Svc"})
    assert unknown.returncode == NOT_FOUND_EXIT, unknown.stderr

    assert_clean(served.stopped_log())


def test_the_server_banner_line_works_as_printed(buf: Path, served: Served) -> None:
    listed = subprocess.run(
        served.banner_command(buf), capture_output=True, text=True, timeout=STARTUP_S, check=False
    )

    assert listed.returncode == 0, listed.stderr
    assert "grpc.health.v1.Health/List" in listed.stdout.split()
    assert f"grpcurl -plaintext {served.address} list" in served.output.text()
    assert_clean(served.stopped_log())


def test_the_dev_banner_line_works_as_printed(buf: Path, tmp_path: Path) -> None:
    """`make run` is `electric dev`: its banner has the same line, for its own server."""
    with serve("dev", "examples.agents:app", "--data", str(tmp_path / "data")) as dev:
        listed = subprocess.run(
            dev.banner_command(buf), capture_output=True, text=True, timeout=STARTUP_S, check=False
        )

        assert listed.returncode == 0, listed.stderr
        assert "electric.v1.EntityService/SignalEntity" in listed.stdout.split()
        assert_clean(dev.stopped_log())
