"""node-resize-exporter: makes Kubernetes node resizing observable."""
__version__ = "0.2.0"
