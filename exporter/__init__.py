"""node-resize-exporter: makes Kubernetes node resizing observable."""
__version__ = "0.3.0"
