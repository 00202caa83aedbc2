#!/bin/sh
# Regenerate exporter/sources/kubelet/proto/podresources_pb2{,_grpc}.py from podresources.proto.
# Needs grpcio-tools (the test extra). The generated _grpc module imports its sibling with an
# absolute "import podresources_pb2"; we make it package-relative so `exporter.sources.kubelet.proto` imports
# cleanly without touching sys.path.
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I exporter/sources/kubelet/proto \
    --python_out=exporter/sources/kubelet/proto --grpc_python_out=exporter/sources/kubelet/proto \
    exporter/sources/kubelet/proto/podresources.proto
sed -i 's/^import podresources_pb2 as /from . import podresources_pb2 as /' \
    exporter/sources/kubelet/proto/podresources_pb2_grpc.py
grep -q '^from . import podresources_pb2 as ' exporter/sources/kubelet/proto/podresources_pb2_grpc.py || {
    echo "gen-proto.sh: could not make the _grpc import package-relative" >&2; exit 1; }
