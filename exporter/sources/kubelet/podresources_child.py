"""One podresources GetAllocatableResources call, made by a short-lived child process.

`python -m exporter.sources.kubelet.podresources_child` reads its request on stdin (JSON: the
socket, the gRPC timeout, the answer's size bound, the CPU ids the kernel can have), makes the
call with gRPC and writes one JSON line on stdout: the answer reduced to what the exporter
keeps, or the gRPC error's code and details. gRPC's C core and protobuf (~15 MiB of RSS, seven
threads) live only in this child, for the ~0.1 s of a poll, never in the long-running exporter.

The reply is bounded whatever the kubelet sends: only the CPU ids the kernel can have are
listed (the others are counted, the first five shown), memory entries are cut at
`max_memory` and their names at 64 characters, error details at 500.
"""
from __future__ import annotations

import json
import sys
from typing import Any

MAX_DETAILS = 500


def call(request: dict[str, Any]) -> dict[str, Any]:
    """The child's reply to `request` (a dict as sent on stdin)."""
    import grpc

    from exporter.sources.kubelet.proto import podresources_pb2, podresources_pb2_grpc
    with grpc.insecure_channel(
            f"unix://{request['socket']}",
            options=[("grpc.max_receive_message_length", int(request["max_bytes"]))]) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer = stub.GetAllocatableResources(
                podresources_pb2.AllocatableResourcesRequest(),  # type: ignore[attr-defined]
                timeout=float(request["timeout"]))
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = (e.details() if hasattr(e, "details") else "") or ""
            return {"error": {"code": code.name if code is not None else "",
                              "details": details[:MAX_DETAILS]}}
    return {"answer": reduce(answer, frozenset(request["possible"]), int(request["max_memory"]))}


def reduce(answer: Any, possible: frozenset[int], max_memory: int) -> dict[str, Any]:
    """An AllocatableResourcesResponse as the reply carries it: the CPU ids in `possible`, the
    others counted (the first five kept), the first `max_memory` memory entries."""
    ids = set(answer.cpu_ids)  # C-speed; ids repeated any number of times count once
    kept = ids & possible
    bad = sorted(ids - kept)
    entries = answer.memory
    memory = [[(block.memory_type or "memory")[:64], int(block.size)]
              for block in entries[:max_memory]]
    return {"cpu_ids": sorted(kept), "bad_count": len(bad), "bad_first": bad[:5],
            "memory": memory, "memory_entries": len(entries)}


def main() -> None:
    reply = call(json.loads(sys.stdin.buffer.read()))
    sys.stdout.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
