"""A kubelet podresources gRPC server on a unix socket, answering what a test sets."""
from __future__ import annotations

from concurrent import futures

import grpc

from exporter.sources.kubelet.proto import podresources_pb2 as pb
from exporter.sources.kubelet.proto import podresources_pb2_grpc as pb_grpc


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """Answers like a kubelet; tests change `answer` between polls."""

    def __init__(self) -> None:
        self.answer = pb.AllocatableResourcesResponse()
        self.calls = 0

    def GetAllocatableResources(self, request, context):  # noqa: N802 - gRPC naming
        self.calls += 1
        return self.answer


class Server:
    def __init__(self, path: str, servicer=None, handler=None) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        if servicer is not None:
            pb_grpc.add_PodResourcesListerServicer_to_server(servicer, self.server)
        if handler is not None:
            self.server.add_generic_rpc_handlers((handler,))
        assert self.server.add_insecure_port(f"unix://{path}") == 1
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None).wait()
