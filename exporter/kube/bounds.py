"""The bound on what one list from the API server may hold, everywhere the exporter lists: the
watch sources (exporter/sources/apiserver/listwatch.py), the one-shot Node-and-pods list of
`check` and `plan` (exporter/kube/client.py node_and_pods) and the words that name it."""
from __future__ import annotations

LIST_MAX_OBJECTS = 10_000  # objects one list may hold; past it the list is refused
