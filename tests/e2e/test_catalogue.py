"""docs/metrics.md is the metric catalogue: checked against a real scrape, both ways.

A real `node-resize-exporter run` joined to a fake API server (a Node and a balloon pod) and a
kubelet podresources socket, so every family of the Collector is declared, and most have
samples. Every exposed family must have a row, every row must be exposed, with the same type,
and a family's label names must be the row's.
"""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit import metrics_doc

EXAMPLE = """
| metric | type | labels | meaning | source |
| --- | --- | --- | --- | --- |
| `a_total` | counter | `resource` (cpu, memory), `direction` (online) | x | y |
| `b_seconds` | histogram | - | x | y |
"""


@pytest.fixture(scope="module")
def scrape(tmp_path_factory) -> str:
    """One live scrape's text."""
    from exporter.sources.kubelet.proto import podresources_pb2 as pb
    from testkit.exporter_proc import RunningExporter
    from testkit.fakes.apiserver import FakeApiServer
    from testkit.fakes.podresources import Kubelet, Server

    tmp = tmp_path_factory.mktemp("catalogue")
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0])
    server = Server(str(tmp / "kubelet.sock"), kubelet)
    try:
        with FakeApiServer() as api:
            api.set_node("cat-node", cpu="2", memory="8Gi")
            api.put_pod("balloon", node="cat-node", priority_class="system-balloon",
                        requests={"cpu": "500m", "memory": "1Gi"})
            kubeconfig = api.write_kubeconfig(str(tmp / "kubeconfig"))
            with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                                 "--node-name", "cat-node",
                                 "--podresources-socket", str(tmp / "kubelet.sock"),
                                 "--journal", str(tmp / "journal.db")) as exp:  # sink_up
                # Families with samples once the Node, the balloon pod, the kubelet and the
                # first sysfs read (the kernel families) are in: four threads, any order.
                text = exp.wait_for(
                    lambda s: (
                        s.value("node_resize_podresources_allocatable_cpus") == 1.0
                        and s.value("node_resize_balloon_pods") == 1.0
                        and s.series("node_resize_kubelet_capacity")
                        and s.series("node_resize_kernel_capacity")
                    ),
                    timeout=30,
                ).text
    finally:
        server.stop()
    return text


@pytest.fixture(scope="module")
def exposed(scrape: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Catalogue name -> (type, label names seen in samples) of one live scrape."""
    found = {}
    for family in text_string_to_metric_families(scrape):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        found[name] = (family.type, frozenset(labels))
    return found


def test_parser_reads_rows(tmp_path):
    path = tmp_path / "metrics.md"
    path.write_text(EXAMPLE)
    rows = metrics_doc.rows(path)
    assert rows["a_total"].labels == {"resource", "direction"}
    assert rows["b_seconds"].labels == frozenset()
    assert metrics_doc.sample_names(rows["b_seconds"]) == {
        "b_seconds_bucket",
        "b_seconds_sum",
        "b_seconds_count",
    }


def test_parser_rejects_an_unknown_type(tmp_path):
    path = tmp_path / "metrics.md"
    path.write_text(EXAMPLE.replace("| histogram |", "| summary |"))
    with pytest.raises(AssertionError, match="metrics.md:5: type 'summary'"):
        metrics_doc.rows(path)


def test_every_exposed_metric_is_in_the_catalogue(exposed):
    rows = metrics_doc.rows()
    missing = sorted(set(exposed) - set(rows))
    assert not missing, (
        "exposed by the exporter but missing from docs/metrics.md (add a row): "
        + ", ".join(missing)
    )


def test_every_catalogue_row_is_exposed(exposed):
    rows = metrics_doc.rows()
    missing = [
        f"{name} (docs/metrics.md:{rows[name].line})" for name in sorted(set(rows) - set(exposed))
    ]
    assert not missing, "in docs/metrics.md but not exposed by the exporter: " + ", ".join(missing)


def test_catalogue_types_and_labels_match_the_scrape(exposed):
    wrong = []
    for name, row in sorted(metrics_doc.rows().items()):
        if name not in exposed:
            continue  # reported by test_every_catalogue_row_is_exposed
        kind, labels = exposed[name]
        if kind != row.type:
            wrong.append(
                f"{name} (docs/metrics.md:{row.line}): type {row.type} in the "
                f"catalogue, {kind} in the scrape"
            )
        if labels and labels != row.labels:  # families without samples show no labels
            wrong.append(
                f"{name} (docs/metrics.md:{row.line}): labels {sorted(row.labels)} in "
                f"the catalogue, {sorted(labels)} in the scrape"
            )
    assert not wrong, "\n".join(wrong)


def test_the_scrape_shows_labels_for_most_families(exposed):
    """The label check above is not empty: families with samples carry their labels."""
    labelled = {name for name, (_, labels) in exposed.items() if labels}
    assert {
        "node_resize_kernel_transitions_total",
        "node_resize_kubelet_capacity",
        "node_resize_balloon_requests",
        "node_resize_exporter_source_up",
    } <= labelled


def test_sink_label_values_are_the_catalogues(scrape):
    """The `sink` label shows only the values its rows list (derived from class names, it once
    showed sink="kubelet" and "runningpods", listed nowhere)."""
    rows = metrics_doc.rows()
    wrong = []
    for family in text_string_to_metric_families(scrape):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        row = rows.get(name)
        if row is None:
            continue  # reported by test_every_exposed_metric_is_in_the_catalogue
        for sample in family.samples:
            value = sample.labels.get("sink")
            listed = row.values.get("sink", frozenset())
            if value is not None and value not in listed:
                wrong.append(f"{name}{{sink={value!r}}} (docs/metrics.md:{row.line} lists "
                             f"{sorted(listed)})")
    assert not wrong, "\n".join(sorted(set(wrong)))
