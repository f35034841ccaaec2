"""Helpers shared by the tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The single google.rpc.ErrorInfo of a failed call, from domain electric.v1."""
    status = rpc_status.from_call(exc)
    assert status is not None, f"no rich status on {exc.code()}: {exc.details()}"
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, f"expected one ErrorInfo in {status}"
    assert infos[0].domain == "electric.v1"
    return infos[0]
