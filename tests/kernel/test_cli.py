"""CLI: bad input exits 2 with a message that names the fix; `check` tells this host's truth."""
import gzip
import socket
import subprocess
import sys

import pytest

from testkit.exporter_proc import REPO


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,words", [
    (["run", "--source", "bogus"], ["unknown source bogus", "bpf", "uevent", "sysfs"]),
    (["run", "--source", "bpf,nope"], ["unknown source nope"]),
    (["run", "--web.listen-address", "nonsense"], ["--web.listen-address", "HOST:PORT"]),
    (["run", "--listen", "nonsense"], ["HOST:PORT"]),  # the old name still parses
    (["run", "--web.listen-address", "127.0.0.1:99999"], ["port 1-65535"]),
    (["run", "--web.listen-address", "my-host:9862"], ["not an IP address"]),
    (["run", "--sysfs-interval", "-1"], ["must be more than 0"]),
    (["run", "--sysfs-interval", "inf"], ["must be more than 0 and finite"]),
    (["run", "--podresources-interval", "nan"], ["must be more than 0 and finite"]),
    (["run", "--balloon-selector", "env in (a)"], ["set-based", "key=value"]),
    (["run", "--node-name", "bad\nname"], ["is not a node name"]),
    (["run", "--web.telemetry-path", "metrics"], ["absolute URL path"]),
    (["run", "--log.level", "loud"], ["--log.level"]),
    (["replay", "x.jsonl", "--memory-tolerance", "lots"], ["not a byte count"]),
    (["replay", "x.jsonl", "--resync-deadline", "-3"], ["must be more than 0"]),
    (["run", "--memory-tolerance", "lots"], ["not a byte count"]),
    (["run", "--ringbuf-pages", "3"], ["power of two"]),
    (["run", "--no-such-flag"], ["No such option"]),
    (["frobnicate"], ["No such command"]),
])
def test_bad_input_exits_2_with_the_fix(args, words):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_port_in_use_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("run", "--listen", f"127.0.0.1:{port}", "--no-journal", "--source", "sysfs")
    assert r.returncode == 2
    assert "already in use" in r.stderr and "--web.listen-address" in r.stderr


@pytest.mark.kernel
def test_check_tells_the_truth_here():
    r = cli("check")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "OK   cpuhp tracepoints" in out
    assert "OK   bpf source: compiled and attached: cpuhp_enter, cpuhp_multi_enter, cpuhp_exit" \
        in out
    # This host kernel has no kprobes: memory probes cannot attach, and check says why.
    with gzip.open("/proc/config.gz", "rt") as f:
        has_kprobes = "CONFIG_KPROBES=y\n" in f.read()
    if not has_kprobes:
        assert "WARN kprobes: kernel built without CONFIG_KPROBES" in out
        assert "not attached: online_pages_enter" in out
    assert "BPF source: can run" in out


def test_print_bpf_shows_the_program_with_the_states_read_here():
    r = cli("run", "--print-bpf")
    assert r.returncode == 0
    states = open("/sys/devices/system/cpu/hotplug/states").read()
    online = next(line.split(":")[0].strip() for line in states.splitlines()
                  if line.split(":", 1)[1].strip() == "online")
    assert f"-DSTATE_ONLINE={online}" in r.stdout
    assert "TRACEPOINT_PROBE(cpuhp, cpuhp_exit)" in r.stdout
    assert "int online_pages_return" in r.stdout


def test_help_lists_the_commands_and_the_default_port():
    r = cli("run", "--help")
    assert r.returncode == 0 and "0.0.0.0:9862" in r.stdout and "--source" in r.stdout


def test_telemetry_path_and_json_logs_as_node_exporter_does():
    import json
    import urllib.error
    import urllib.request

    from testkit.exporter_proc import RunningExporter
    with RunningExporter("--source", "sysfs", "--web.telemetry-path", "/custom/metrics",
                         "--log.format", "json", "--node-name", "n1") as exp:
        with urllib.request.urlopen(exp.url + "/custom/metrics", timeout=5) as r:
            assert b"node_resize_exporter_build_info" in r.read()
        try:
            urllib.request.urlopen(exp.url + "/metrics", timeout=5)
            raise AssertionError("/metrics still served")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        with urllib.request.urlopen(exp.url + "/", timeout=5) as r:
            assert b'href="/custom/metrics"' in r.read()
        exp.stop()
        lines = [json.loads(line) for line in exp.logs().splitlines() if line.startswith("{")]
    assert lines, exp.logs()
    first = lines[0]
    assert set(first) >= {"ts", "level", "logger", "msg"}
    assert first["ts"].endswith("Z")  # UTC
    assert {line["level"] for line in lines} <= {"debug", "info", "warn", "error"}


@pytest.mark.kernel
def test_start_up_says_each_thing_once_and_names_journal_kubernetes_and_traces(tmp_path):
    """The default start on this host: BPF, with the memory probes unattachable (no kprobes
    here). Each fact is one line; the last start-up line says what runs."""
    from testkit.exporter_proc import RunningExporter
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    journal = home / "journal.db"
    with RunningExporter("--journal", str(journal), "--log.level", "info") as exp:
        logs = exp.logs()
    lines = [line.split(" ", 1)[1] for line in logs.splitlines() if line.startswith("ts=")]
    assert len(lines) == len(set(lines)), "\n".join(lines)
    started = [line for line in lines if 'msg="started: ' in line]
    assert len(started) == 1, logs
    assert f"journal {journal};" in started[0] and "kubernetes off" in started[0] \
        and "traces off" in started[0] and "sources sysfs, bpf, uevent" in started[0], started
