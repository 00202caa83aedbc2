"""The Node watch against a real HTTP API server speaking list/watch (testkit/fakes/apiserver)."""
from __future__ import annotations

import time

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, NodeStatus, Resource, SourceStatus
from exporter.kube.client import KubeUnavailable, load_config
from exporter.sources.apiserver.kube_node import KubeNodeSource
from exporter.sources.apiserver.listwatch import Backoff
from exporter.sources.base import SourceUnavailable
from testkit.event_log import EventLog, wait_until
from testkit.exporter_proc import free_port
from testkit.fakes.apiserver import FakeApiServer

GiB = 2**30


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def start(kubeconfig: str, node: str = "n1", **kwargs) -> tuple[KubeNodeSource, EventLog]:
    log = EventLog()
    source = KubeNodeSource(MonotonicWallClock(), node_name=node, kubeconfig=kubeconfig,
                            backoff_initial=0.05, backoff_max=0.5, **kwargs)
    source.open()
    source.start(log.emit)
    return source, log


@pytest.fixture
def running(api):
    started = []

    def _start(node: str = "n1", **kwargs):
        source, log = start(api.kubeconfig_path, node, **kwargs)
        started.append(source)
        return source, log

    yield _start
    for source in started:
        source.stop()
        assert not source._thread.is_alive()


def cpus(log: EventLog) -> list[float]:
    return [e.capacity.get(Resource.CPU) for e in log.of(NodeStatus)]


def test_list_then_changes_only_on_capacity_change(api, running):
    api.set_node("n1", cpu="2", memory="8Gi", allocatable_memory="7Gi")
    api.set_node("n2", cpu="64")  # another node: must never show up
    source, log = running()
    first = log.wait_for(NodeStatus)
    assert first.node == "n1"
    assert first.capacity[Resource.CPU] == 2.0
    assert first.capacity[Resource.MEMORY] == 8 * GiB
    assert first.allocatable[Resource.MEMORY] == 7 * GiB
    assert log.wait_for(SourceStatus).up is True
    api.wait_for_watches(1, "nodes")
    assert api.requests_for("nodes")[0]["fieldSelector"] == "metadata.name=n1"

    api.update_node("n1")  # heartbeat only: nothing to report
    api.update_node("n1", cpu="1", allocatable_cpu="1")
    second = log.wait_for(NodeStatus, count=2)
    assert second.capacity[Resource.CPU] == 1.0
    assert second.resource_version == api.get("nodes", "n1")["metadata"]["resourceVersion"]
    assert cpus(log) == [2.0, 1.0]


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
def test_relist_on_410_without_duplicates(api, running, gone_as_http):
    api.gone_as_http = gone_as_http
    api.set_node("n1", cpu="2")
    source, log = running()
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    if gone_as_http:
        # The watch is cut and history compacted while away: the re-watch gets HTTP 410.
        api.hold_watches()
        api.drop_watches()
        api.set_node("other", cpu="8")  # history moves on (not our node), then is compacted
        api.compact(expire_watches=False)
        api.release_watches()
    else:
        api.compact()  # open watches get an ERROR event with a 410 Status
    wait_until(lambda: source.lists == 2, "a relist after 410")
    api.wait_for_watches(1, "nodes")
    api.update_node("n1", cpu="4")
    log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 4.0)
    assert source.relists_gone == 1
    assert cpus(log) == [2.0, 4.0]  # the unchanged node was not reported again
    assert [e.up for e in log.of(SourceStatus)] == [True]  # a 410 is not an outage


def test_reconnect_after_dropped_connection_resumes_from_last_rv(api, running):
    api.set_node("n1", cpu="2")
    source, log = running()
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    seen_rv = api.resource_version
    api.hold_watches()
    assert api.drop_watches() == 1
    api.update_node("n1", cpu="3")  # happens while the client is cut off
    api.release_watches()
    log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 3.0)
    assert source.reconnects == 1
    assert source.lists == 1  # no relist: the history still had the change
    watches = api.requests_for("nodes", watch=True)
    assert watches[-1]["resourceVersion"] == str(seen_rv)
    assert all(w["allowWatchBookmarks"] == "true" for w in watches)
    assert cpus(log) == [2.0, 3.0]


@pytest.mark.parametrize("with_bookmark", [True, False])
def test_bookmark_advances_rv_so_compaction_needs_no_relist(api, running, with_bookmark):
    api.set_node("n1", cpu="2")
    source, log = running()
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    for i in range(5):  # traffic the field selector hides from us
        api.set_node(f"other{i}")
    if with_bookmark:
        rv = api.bookmark()
        wait_until(lambda: source.bookmarks == 1, "the bookmark to arrive")
        assert source.resource_version == str(rv)
    api.hold_watches()
    api.drop_watches()
    api.compact(expire_watches=False)
    api.release_watches()
    api.wait_for_watches(1, "nodes")
    api.update_node("n1", cpu="5")
    log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 5.0)
    if with_bookmark:
        assert source.lists == 1 and source.relists_gone == 0
    else:  # without the bookmark our RV predates the compaction: 410, relist
        assert source.lists == 2 and source.relists_gone == 1
    assert cpus(log) == [2.0, 5.0]


def test_forbidden_is_down_naming_rbac_then_recovers(api, running):
    api.set_node("n1", cpu="2")
    api.set_forbidden(True)
    source, log = running()
    down = log.wait_for(SourceStatus)
    assert down.up is False
    assert "RBAC" in down.reason and "nodes" in down.reason
    assert "cannot list resource" in down.reason  # the server's own message is kept
    api.set_forbidden(False)
    up = log.wait_for(SourceStatus, lambda e: e.up)
    assert up.up
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0


def test_unreachable_at_start_then_recovers_without_restart(tmp_path):
    port = free_port()
    server = FakeApiServer(port=port)
    kubeconfig = str(tmp_path / "kubeconfig")
    server.write_kubeconfig(kubeconfig)  # points at a port nobody listens on yet
    source, log = start(kubeconfig)
    try:
        down = log.wait_for(SourceStatus)
        assert down.up is False and "unreachable" in down.reason
        server.set_node("n1", cpu="2", memory="4Gi")
        server.start()
        try:
            assert log.wait_for(SourceStatus, lambda e: e.up).up
            assert log.wait_for(NodeStatus).capacity[Resource.MEMORY] == 4 * GiB
        finally:
            server.stop()
    finally:
        source.stop()


def test_malformed_quantity_is_counted_and_the_rest_flows(api, running):
    api.set_node("n1", cpu="two", memory="8Gi")
    source, log = running()
    status = log.wait_for(NodeStatus)
    assert Resource.CPU not in status.capacity
    assert status.capacity[Resource.MEMORY] == 8 * GiB
    bad = log.of(MalformedInput)
    assert len(bad) == 2  # capacity.cpu and allocatable.cpu
    assert all("cpu" in b.detail and "two" in b.detail for b in bad)
    api.update_node("n1")  # heartbeat: the same bad value is not counted again
    api.update_node("n1", cpu="2", allocatable_cpu="2")
    fixed = log.wait_for(NodeStatus, count=2)
    assert fixed.capacity[Resource.CPU] == 2.0
    assert len(log.of(MalformedInput)) == 2


def test_missing_node_is_down_until_it_appears(api, running):
    source, log = running("n1")
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert "not found" in down.reason and "n1" in down.reason
    api.wait_for_watches(1, "nodes")
    api.set_node("n1", cpu="8")
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 8.0
    assert log.of(SourceStatus)[-1].up is True


def test_no_configuration_is_a_clear_source_unavailable(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    source = KubeNodeSource(MonotonicWallClock(), node_name="n1")
    with pytest.raises(SourceUnavailable) as err:
        source.open()
    assert "--kubeconfig" in err.value.fix
    with pytest.raises(KubeUnavailable) as err:
        load_config(str(tmp_path / "nope"))
    assert "nope" in err.value.reason


def test_in_cluster_service_account(tmp_path):
    (tmp_path / "token").write_text("abc")
    (tmp_path / "namespace").write_text("kube-system")
    (tmp_path / "ca.crt").write_text("")
    config = load_config(None, service_account_dir=str(tmp_path),
                         env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert config.cluster.server.startswith("https://10.96.0.1:")
    assert config.user.token == "abc"


def test_backoff_grows_caps_and_resets():
    b = Backoff(initial=1.0, maximum=4.0)
    delays = [b.next() for _ in range(5)]
    for got, base in zip(delays, [1, 2, 4, 4, 4]):
        assert 0.8 * base <= got <= 1.2 * base
    b.reset()
    assert 0.8 <= b.next() <= 1.2


def test_started_without_open_opens_itself(api, monkeypatch):
    api.set_node("n1", cpu="2")
    log = EventLog()
    source = KubeNodeSource(MonotonicWallClock(), node_name="n1",
                            kubeconfig=api.kubeconfig_path)
    source.start(log.emit)  # no open(): an agent may only start() its sources
    try:
        assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0
    finally:
        source.stop()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    log = EventLog()
    unconfigured = KubeNodeSource(MonotonicWallClock(), node_name="n1")
    unconfigured.start(log.emit)
    down = log.wait_for(SourceStatus)
    unconfigured.stop()
    assert not down.up and "no Kubernetes API configuration" in down.reason


# ------------------------------------------------------------ Silent, hostile servers


def test_silent_api_from_start_is_down_naming_the_silence_then_up(api, running):
    """Item 1: a server that accepts connections and never answers is down, not "up"."""
    api.set_node("n1", cpu="2")
    api.set_silent(True)
    source, log = running(request_timeout=0.5)
    down = log.wait_for(SourceStatus)
    assert down.up is False
    assert "did not answer the nodes list within" in down.reason
    api.set_silent(False)
    assert log.wait_for(SourceStatus, lambda e: e.up).up
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0


def test_watch_without_a_byte_past_its_timeout_is_down_and_relists(api, running):
    """Item 1: no event and no bookmark for longer than the watch's own timeout: the watch is
    dead even though its TCP connection is open; down, then a relist finds what changed."""
    api.set_node("n1", cpu="2")
    source, log = running(server_timeout=1, watch_grace=0.5)
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    api.hang_watches()  # connection kept open, not a byte more
    api.update_node("n1", cpu="3")  # only a relist can see it now
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert "sent no byte on the nodes watch for 2 s" in down.reason
    assert "relisting" in down.reason
    assert log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 3.0)
    assert source.lists >= 2
    assert log.of(SourceStatus)[-1].up is True


def test_watch_stalled_mid_event_line_is_bounded(api, running):
    """Item 1: half an event line then silence, and a line trickled in pieces, do not hold a
    Node change back for longer than the line bound (here 1 s) plus a read."""
    api.set_node("n1", cpu="2")
    source, log = running(server_timeout=30, line_timeout=1.0)
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    api.send_raw(b'{"type": "MODIFIED", "object": {"kind": "Node", ')
    for _ in range(50):  # a trickle, a piece every 0.6 s (its pace, not an assertion)
        time.sleep(0.6)
        if any(not e.up for e in log.of(SourceStatus)):
            break  # cut: a piece now would land in the next watch
        api.send_raw(b'"x": 1, ')
    api.update_node("n1", cpu="4")
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert "watch event line took more than 1 s" in down.reason
    assert log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 4.0)


def test_poison_quantities_are_counted_and_skipped_without_a_relist_loop(api, running):
    """Item 6: a bare 400-digit JSON integer once raised OverflowError outside the
    malformed-input path (89 relists in 45 s); "-4" and huge strings were accepted."""
    api.put_raw("nodes", {
        "kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1", "uid": "u1"},
        "status": {"capacity": {"cpu": 10**400, "memory": "-4", "hugepages-2Mi": "9" * 400},
                   "allocatable": {"cpu": "2", "memory": "8Gi"}}})
    source, log = running()
    status = log.wait_for(NodeStatus)
    assert status.capacity == {}  # none of the three made up a value
    assert status.allocatable[Resource.CPU] == 2.0
    details = [m.detail for m in log.of(MalformedInput)]
    assert len(details) == 3
    assert any("negative" in d and "memory" in d for d in details)
    assert any("out of range" in d and "cpu" in d for d in details)
    assert any("longer than" in d and "hugepages-2Mi" in d for d in details)
    assert all(len(d) < 400 for d in details)  # the 400 digits are not logged
    api.wait_for_watches(1, "nodes")
    rv = api.bookmark()  # a round trip through the watch: nothing relisted meanwhile
    wait_until(lambda: source.resource_version == str(rv), "the bookmark")
    assert source.lists == 1
    assert [e.up for e in log.of(SourceStatus)] == [True]


class RecordedBackoff(Backoff):
    """The source's backoff, noting each delay it hands out (what the source then waits)."""

    def __init__(self, initial: float, maximum: float) -> None:
        super().__init__(initial, maximum)
        self.delays: list[float] = []

    def next(self) -> float:
        delay = super().next()
        self.delays.append(delay)
        return delay


def test_a_list_followed_by_the_same_failure_backs_off(api):
    """Item 6: the backoff was reset by every successful list, so list-then-fail looped at
    the initial delay. Only a watch that delivers resets it now."""
    api.set_node("n1", cpu="2")
    api.set_watch_error(500)
    log = EventLog()
    source = KubeNodeSource(MonotonicWallClock(), node_name="n1", kubeconfig=api.kubeconfig_path)
    backoff = source.backoff = RecordedBackoff(0.05, 0.5)  # doubling to 0.5 s, +-20 % jitter
    source.open()
    source.start(log.emit)
    try:
        wait_until(lambda: source.lists >= 6, "six list-then-fail rounds")
        # Grew to the cap (0.05, 0.1, 0.2, 0.4, 0.5 ...), never reset by the lists between.
        assert backoff.delays[4] >= 0.8 * 0.5, backoff.delays
        down = log.wait_for(SourceStatus, lambda e: not e.up)
        assert "answered 500" in down.reason
        api.set_watch_error(None)
        api.wait_for_watches(1, "nodes")
        api.update_node("n1", cpu="3")
        log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 3.0)
        grown = len(backoff.delays)
        api.set_watch_error(500)  # fails again: the next wait starts from the initial delay
        api.drop_watches()
        wait_until(lambda: len(backoff.delays) > grown, "a retry after the delivered event")
        assert backoff.delays[grown] <= 1.2 * 0.05, backoff.delays
    finally:
        source.stop()


def test_a_watch_line_past_the_bound_is_refused_down_and_relisted(api, running):
    """Item 7: a 512 MiB line without a newline grew RSS by 514 MiB; now a line is bounded
    (MAX_LINE_BYTES) and refused with the bound named."""
    from exporter.kube.client import MAX_LINE_BYTES
    api.set_node("n1", cpu="2")
    source, log = running()
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    piece = b"x" * 2**20
    for _ in range(MAX_LINE_BYTES // len(piece) + 2):
        api.send_raw(piece)
    api.update_node("n1", cpu="6")
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert f"watch event line longer than {MAX_LINE_BYTES} bytes" in down.reason
    log.wait_for(NodeStatus, lambda e: e.capacity[Resource.CPU] == 6.0)  # relisted
    assert log.of(SourceStatus)[-1].up


def test_a_list_whose_continue_never_ends_is_refused(api, running):
    """Item 7: a `continue` that never ends reached 596k pods and 1,981 MiB."""
    from exporter.kube.client import MAX_LIST_PAGES
    api.set_node("n1", cpu="2")
    api.set_endless_continue(True)
    source, log = running()
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert f"still not done after {MAX_LIST_PAGES} pages" in down.reason
    assert not log.of(NodeStatus)  # nothing of the endless list was used
    wait_until(lambda: len(api.requests_for("nodes", watch=False)) > MAX_LIST_PAGES,
               "the first list given up")
    starts = [i for i, q in enumerate(api.requests_for("nodes", watch=False))
              if "continue" not in q]
    assert starts[1] - starts[0] == MAX_LIST_PAGES  # no page asked past the bound
    api.set_endless_continue(False)
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0


@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_is_honoured(api, running, code):
    """Item 13: Retry-After on 429 and 503 was ignored (10 of 14 retries came sooner)."""
    api.set_node("n1", cpu="2")
    api.throttle(code, retry_after="2", count=3)
    source, log = running()  # its own backoff would retry after 0.05-0.4 s
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0
    times = api.request_times[:4]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) == 3 and min(gaps) >= 2.0, gaps
    down = log.of(SourceStatus)[0]
    assert not down.up and f"answered {code}" in down.reason


def test_retry_after_is_bounded(monkeypatch):
    """A server asking for an hour gets MAX_RETRY_AFTER (60 s) at most."""
    import httpx2

    from exporter.sources.apiserver import listwatch
    request = httpx2.Request("GET", "http://127.0.0.1/api/v1/nodes")
    response = httpx2.Response(429, headers={"Retry-After": "3600"}, request=request)
    error = httpx2.HTTPStatusError("429", request=request, response=response)
    assert listwatch._retry_after(error) == 3600.0
    source = KubeNodeSource(MonotonicWallClock(), node_name="n1")
    waited = []
    monkeypatch.setattr(source.stopping, "wait", waited.append)
    source._sleep(listwatch._retry_after(error))
    assert waited == [listwatch.MAX_RETRY_AFTER]


def test_a_deleted_node_keeps_no_capacity(api, running):
    """Node deleted, re-created under another name, then back: while this node is missing its
    capacity is unknown (a NodeStatus with none), not the last one it had."""
    api.set_node("n1", cpu="2")
    source, log = running()
    assert log.wait_for(NodeStatus).capacity[Resource.CPU] == 2.0
    api.wait_for_watches(1, "nodes")
    api.delete_node("n1")
    gone = log.wait_for(NodeStatus, count=2)
    assert dict(gone.capacity) == {} and dict(gone.allocatable) == {}
    assert log.wait_for(SourceStatus, lambda s: not s.up).reason.endswith("was deleted")
    api.set_node("n1-renamed", cpu="4")  # another name: not this node
    api.set_node("n1", cpu="3")
    back = log.wait_for(NodeStatus, count=3)
    assert back.capacity[Resource.CPU] == 3.0
    assert cpus(log) == [2.0, None, 3.0]


def test_a_node_missing_at_relist_keeps_no_capacity(api, running):
    api.set_node("n1", cpu="2")
    source, log = running()
    log.wait_for(NodeStatus)
    api.wait_for_watches(1, "nodes")
    api.hold_watches()
    api.drop_watches()
    api.delete_node("n1")
    api.compact(expire_watches=False)  # the DELETED is lost: only a relist can tell
    api.release_watches()
    assert dict(log.wait_for(NodeStatus, count=2).capacity) == {}


def test_every_watch_410_backs_off_to_the_cap_and_logs_once(api, running, caplog):
    """An API server that answers every watch 410 Gone: relists back off exponentially up to
    the cap (as client-go's reflector does), and the log says it once, not per relist."""
    api.set_node("n1", cpu="2")
    api.always_gone = True
    caplog.set_level("INFO", logger="exporter.sources.apiserver.kube_node")
    source, log = running()
    wait_until(lambda: len(api.requests_for("nodes", watch=False)) >= 8, "8 lists")
    times = [t for (path, query), t in zip(api.requests, api.request_times)
             if path.endswith("/nodes") and query.get("watch") != "true"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # backoff 0.05 s doubling to 0.5 s, +-20 % jitter: the 6th gap is at least 0.4 s.
    assert gaps[5] >= 0.4, gaps
    assert gaps[6] >= 0.4, gaps
    expired = [r for r in caplog.records if "expired" in r.getMessage()]
    assert len(expired) == 1, [r.getMessage() for r in expired]
    assert source.relists_gone >= 7


def test_objects_the_field_selector_should_have_excluded_are_counted_and_skipped(api, running):
    """Behind a proxy that ignores fieldSelector every Node is answered: only ours is used."""
    api.ignore_field_selector = True
    api.set_node("a-other", cpu="64")
    api.set_node("n1", cpu="2")
    source, log = running()
    first = log.wait_for(NodeStatus)
    assert (first.node, first.capacity[Resource.CPU]) == ("n1", 2.0)
    malformed = log.wait_for(MalformedInput, lambda m: "not asked for" in m.detail)
    assert "metadata.name=n1" in malformed.detail
    api.wait_for_watches(1, "nodes")
    api.update_node("a-other", cpu="32")
    api.set_node("n1", cpu="1")
    assert log.wait_for(NodeStatus, count=2).capacity[Resource.CPU] == 1.0
    assert [e.node for e in log.of(NodeStatus)] == ["n1", "n1"]


def test_a_running_exporter_shows_no_kubelet_capacity_while_the_node_is_missing(api):
    """Node deleted, another registered, this one back: /metrics has no kubelet-capacity or
    drift series while this node is missing (it said 2 before), then the new value."""
    from testkit.exporter_proc import RunningExporter
    api.set_node("n1", cpu="2")
    with RunningExporter("--kubeconfig", api.kubeconfig_path, "--node-name", "n1",
                         "--source", "sysfs", "--podresources-socket", "") as exp:
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 2
                     and s.series("node_resize_capacity_drift"))
        api.delete_node("n1")
        api.set_node("n1-renamed", cpu="2")
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="kube_node") == 0)
        assert s.series("node_resize_kubelet_capacity") == {}
        assert s.series("node_resize_kubelet_allocatable") == {}
        assert s.series("node_resize_capacity_drift") == {}
        api.set_node("n1", cpu="3")
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 3)
