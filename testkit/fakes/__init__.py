"""Programs that speak a real protocol where no real peer runs here (kubelet, API server,
OTLP collector)."""
