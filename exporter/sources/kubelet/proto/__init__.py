"""Generated gRPC bindings (see scripts/gen-proto.sh); the .proto files are the source."""
