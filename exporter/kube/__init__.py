"""A small client library for the Kubernetes side: API configuration and the lightkube client
(client.py), resource quantities (quantity.py), Node and Pod objects -> typed events
(convert.py).

A leaf: it imports nothing of the exporter above exporter.events. The sources that use it live
in exporter/sources/ (listwatch.py, kube_node.py, kube_pods.py, ...).
"""
