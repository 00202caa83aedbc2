"""node-resize-exporter: makes Kubernetes node resizing observable."""
__version__ = "0.1.0"
