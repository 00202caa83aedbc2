"""The container image, run for real: `make image`'s OCI archive, unpacked with umoci and run
with runc exactly as deploy/daemonset.yaml asks (testkit/oci_pod.py reads the securityContext,
mounts and seccomp profile from it): capabilities BPF and PERFMON only, read-only root, no
privilege escalation, the host paths, the host network, the shipped seccomp profile,
--web.auth=kubernetes (against the fake API server on the host's loopback, through a mounted
kubeconfig: the one thing added). cpu1 goes offline and online on the host and the bpf source
inside the container counts and times both. Root and the real kernel; the image is built once
per session (its Debian layers are cached across sessions, see deploy/image/build.sh).

The archive is multi-arch: an OCI image index (tag <version>) naming the amd64 and arm64
manifests (tags <version>-amd64, <version>-arm64). The arm64 image runs here under
qemu-user-static (binfmt_misc, set up by scripts/setup.sh image), with the DaemonSet's security
as above: `--version` and `check`."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from testkit import oci_pod
from testkit.exporter_proc import Scrape, free_port, poll_until

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "image" / "build.sh"
TX = "node_resize_kernel_transitions_total"
DUR = "node_resize_kernel_transition_duration_seconds_count"


def _version() -> str:
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="session")
def image_archive(tmp_path_factory) -> Path:
    """`make image` (the build script it runs; setup.sh is the caller's business), written to
    this session's own directory so parallel sessions never read each other's half-written
    archive."""
    for tool in ("mmdebstrap", "umoci", "skopeo", "runc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run scripts/setup.sh test")
    prebuilt = os.environ.get("NRE_TEST_IMAGE_ARCHIVE")  # `make image`'s, built beforehand
    if prebuilt:
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([str(BUILD)], check=True, timeout=1800, env={**os.environ,
                                                                "NRE_IMAGE_OUT": str(out)})
    archive = out / f"node-resize-exporter-{_version()}.oci.tar"
    assert archive.is_file()
    return archive


INDEX = "application/vnd.oci.image.index.v1+json"


def _layout(archive: Path, tmp: Path) -> Path:
    layout = tmp / "layout"
    layout.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(layout)], check=True, timeout=300)
    return layout


def _blob(layout: Path, digest: str) -> dict:
    return json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_text())


def _unpack(archive: Path, tmp: Path, arch: str) -> tuple[Path, dict]:
    """(root filesystem, umoci's runtime spec) of the archive's ARCH image."""
    layout = _layout(archive, tmp)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{_version()}-{arch}",
                    str(tmp / "bundle")], check=True, capture_output=True, timeout=900)
    shutil.rmtree(layout)
    spec = json.loads((tmp / "bundle" / "config.json").read_text())
    spec["root"]["path"] = str(tmp / "bundle" / "rootfs")
    return tmp / "bundle" / "rootfs", spec


@pytest.fixture(scope="module")
def unpacked(image_archive, tmp_path_factory) -> tuple[Path, dict]:
    """(root filesystem, umoci's runtime spec) of the amd64 image. One rootfs for every
    container here: each mounts it read-only."""
    return _unpack(image_archive, tmp_path_factory.mktemp("image"), "amd64")


@pytest.fixture
def web_secret(tmp_path):
    """The API server the exporter checks scrapers' tokens with (a pod gets the in-cluster
    service account; here a kubeconfig in a directory mounted into the container), and a token
    it grants get on /metrics. Yields (kubeconfig directory, token)."""
    from testkit.fakes.apiserver import serving_node
    from testkit.kubeauth import PROMETHEUS

    folder = tmp_path / "kube"
    folder.mkdir()
    with serving_node(str(folder), os.uname().nodename) as api:
        api.add_token("image-test-token", PROMETHEUS)
        api.allow_path(f"user:{PROMETHEUS}")
        yield folder, "image-test-token"


class Container:
    """One runc container from a DaemonSet-derived config.json; stopped and deleted by exit."""

    def __init__(self, spec: dict, workdir: Path):
        self.name = f"nre-test-{os.getpid()}-{time.monotonic_ns()}"
        self.bundle = workdir / "bundle"
        self.bundle.mkdir()
        (self.bundle / "config.json").write_text(json.dumps(spec, indent=1))
        self.log_path = workdir / "container.log"

    def __enter__(self) -> "Container":
        self.log = open(self.log_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(["runc", "run", "--bundle", str(self.bundle), self.name],
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        return self

    def logs(self) -> str:
        return self.log_path.read_text()

    def pid(self) -> int:
        state = subprocess.run(["runc", "state", self.name], capture_output=True, text=True)
        return json.loads(state.stdout)["pid"]

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            subprocess.run(["runc", "kill", self.name, "TERM"], capture_output=True)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                subprocess.run(["runc", "kill", self.name, "KILL"], capture_output=True)
                self.proc.wait(10)
        subprocess.run(["runc", "delete", "--force", self.name], capture_output=True)
        self.log.close()


def _scraper(container: Container, port: int, token: str):
    from testkit.kubeauth import insecure_context
    ctx = insecure_context()  # the certificate the exporter made at start, as the ServiceMonitor

    def scrape() -> Scrape | None:
        if container.proc.poll() is not None:
            raise AssertionError(f"container exited {container.proc.returncode}:\n"
                                 f"{container.logs()}")
        req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                return Scrape(r.read().decode())
        except OSError:
            return None
    return scrape


def _wait(scrape, container: Container, predicate, what: str, timeout: float = 120):
    return poll_until(scrape, lambda s: s is not None and predicate(s), timeout, 0.1,
                      lambda s: AssertionError(f"{what}; last scrape:\n"
                                               f"{s.text if s else None}\nlogs:\n"
                                               f"{container.logs()[-6000:]}"))


def _bpf_attached(s: Scrape) -> bool:
    """The BPF source's thread has said up and which programs it attached (all at once)."""
    return (s.value("node_resize_exporter_source_up", source="bpf") == 1
            and s.value("node_resize_exporter_bpf_program_attached",
                        program="cpuhp_exit") is not None)


def _pod(unpacked, tmp_path, web_secret, **kwargs) -> tuple[dict, str, int]:
    _, image_spec = unpacked
    kube, _ = web_secret
    port = free_port()
    args = [a for a in oci_pod.exporter_container(oci_pod.daemonset())["args"]
            if not a.startswith(("--web.listen-address", "--web.health-listen-address"))]
    args.append(f"--web.listen-address=127.0.0.1:{port}")  # host network: the host's loopback
    args.append(f"--web.health-listen-address=127.0.0.1:{free_port()}")
    args.append("--kubeconfig=/etc/nre-test-kube/kubeconfig")  # in a pod: the service account
    spec, what = oci_pod.bundle_config(image_spec, tmp_path / "scratch", args,
                                       {"NODE_NAME": os.uname().nodename}, {}, **kwargs)
    spec["mounts"].append({"destination": "/etc/nre-test-kube", "type": "bind",
                           "source": str(kube),
                           "options": ["rbind", "rprivate", "nosuid", "nodev", "ro"]})
    return spec, what, port


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_image_counts_cpu1_through_bpf_with_the_daemonsets_security(unpacked, tmp_path,
                                                                     web_secret, cpu1):
    spec, what, port = _pod(unpacked, tmp_path, web_secret)
    assert what == "Localhost node-resize-exporter.json"
    _, token = web_secret
    with Container(spec, tmp_path) as c:
        scrape = _scraper(c, port, token)
        # source_up exists from the first scrape ("starting", 0); each source's thread says
        # up later, and /metrics answers before: wait for BPF's own word and its programs.
        up = _wait(scrape, c, _bpf_attached, "bpf never came up")
        startup = time.monotonic() - c.started
        status = _status(c.pid())
        assert status["Seccomp"].strip() == "2", "no seccomp filter on the exporter"
        assert status["NoNewPrivs"].strip() == "1"
        assert up.value("node_resize_exporter_source_up", source="bpf") == 1, c.logs()
        for program in ("cpuhp_enter", "cpuhp_multi_enter", "cpuhp_exit"):
            assert up.value("node_resize_exporter_bpf_program_attached", program=program) == 1
        before_off = up.value(TX, resource="cpu", direction="offline", result="success")
        cpu1.set_online(False)
        cpu1.set_online(True)
        after = _wait(scrape, c, lambda s: s.value(DUR, resource="cpu", direction="online") == 1,
                      "cpu1 online not timed by the bpf source in the container")
        assert after.value(DUR, resource="cpu", direction="offline") == 1
        assert after.value(TX, resource="cpu", direction="offline",
                           result="success") == before_off + 1
        assert after.value(TX, resource="cpu", direction="online", result="success") == 1
    print(f"start-up to bpf attached and served in the container: {startup:.2f} s")


def test_image_uses_its_own_headers_on_a_node_without_any(unpacked, tmp_path, web_secret):
    """/lib/modules and /usr/src absent on the node: bcc compiles against the image's generic
    headers and the bpf source attaches."""
    spec, _, port = _pod(unpacked, tmp_path, web_secret,
                         absent=frozenset({"/lib/modules", "/usr/src"}))
    _, token = web_secret
    with Container(spec, tmp_path) as c:
        scrape = _scraper(c, port, token)
        up = _wait(scrape, c, _bpf_attached, "bpf never came up")
        assert up.value("node_resize_exporter_source_up", source="bpf") == 1, c.logs()
        assert up.value("node_resize_exporter_bpf_program_attached", program="cpuhp_exit") == 1


def test_runtime_default_seccomp_refuses_bpf_and_the_rest_runs(unpacked, tmp_path, web_secret):
    """Why the DaemonSet ships a profile: Debian's containers-common default (CRI-O's
    RuntimeDefault) allows bpf() only with CAP_SYS_ADMIN. The pod still runs: bpf reports down
    with the reason, uevent and sysfs work."""
    spec, what, port = _pod(unpacked, tmp_path, web_secret, runtime_default=True)
    assert what == "RuntimeDefault"
    _, token = web_secret
    with Container(spec, tmp_path) as c:
        scrape = _scraper(c, port, token)
        # bpf is down from the first scrape (it failed to open); uevent and sysfs say up from
        # their own threads, after /metrics may already answer: wait for both.
        up = _wait(scrape, c, lambda s: s.value("node_resize_exporter_source_up",
                                                source="uevent") == 1
                   and s.value("node_resize_exporter_source_up", source="sysfs") == 1,
                   "uevent and sysfs never came up")
        assert up.value("node_resize_exporter_source_up", source="bpf") == 0
        assert "bpf" in c.logs() and "Operation not permitted" in c.logs(), c.logs()


# --- the multi-arch archive and the arm64 image under emulation -------------------------------

def _machine(path: Path) -> int:
    """e_machine of an ELF file: 62 x86-64, 183 AArch64."""
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", path
    return int.from_bytes(head[18:20], "little")


def test_the_archive_is_an_index_of_amd64_and_arm64(image_archive, tmp_path):
    layout = _layout(image_archive, tmp_path)
    refs = {d["annotations"]["org.opencontainers.image.ref.name"]: d
            for d in json.loads((layout / "index.json").read_text())["manifests"]}
    version = _version()
    assert set(refs) == {version, f"{version}-amd64", f"{version}-arm64"}
    assert refs[version]["mediaType"] == INDEX
    index = _blob(layout, refs[version]["digest"])
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]): m["digest"]
                 for m in index["manifests"]}
    assert platforms == {("linux", "amd64"): refs[f"{version}-amd64"]["digest"],
                         ("linux", "arm64"): refs[f"{version}-arm64"]["digest"]}
    for (_, arch), digest in platforms.items():
        config = _blob(layout, _blob(layout, digest)["config"]["digest"])
        assert (config["os"], config["architecture"]) == ("linux", arch)
    # skopeo, what pushes it (`skopeo copy --all`), reads the index and both platforms.
    raw = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{layout}:{version}"],
                         capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(raw.stdout)["mediaType"] == INDEX
    for arch in ("amd64", "arm64"):
        out = subprocess.run(["skopeo", "--override-arch", arch, "inspect",
                              f"oci:{layout}:{version}"],
                             capture_output=True, text=True, check=True, timeout=120)
        assert json.loads(out.stdout)["Architecture"] == arch


@pytest.fixture(scope="module")
def unpacked_arm64(image_archive, tmp_path_factory) -> tuple[Path, dict]:
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").read_text().splitlines()[0] != "enabled":
        pytest.fail("qemu-aarch64 not enabled in binfmt_misc: run scripts/setup.sh image")
    return _unpack(image_archive, tmp_path_factory.mktemp("image-arm64"), "arm64")


def _run_once(spec: dict, tmp_path: Path, timeout: float) -> tuple[int, str]:
    with Container(spec, tmp_path) as c:
        try:
            c.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{c.logs()}") from None
        return c.proc.returncode, c.logs()


def test_the_arm64_image_runs_version_and_check_under_emulation(unpacked_arm64, tmp_path,
                                                                 web_secret):
    root, _ = unpacked_arm64
    assert _machine(root / "usr" / "bin" / "python3.11") == 183  # AArch64: emulated here
    for run in ("version", "check"):
        # A host without a kubelet: the empty stand-in for /var/lib/kubelet (read-only) needs
        # the pod-resources mount point the DaemonSet mounts inside it, as a kubelet's has.
        (tmp_path / run / "scratch" / "missing_var_lib_kubelet" / "pod-resources").mkdir(
            parents=True)
    spec, what, _ = _pod(unpacked_arm64, tmp_path / "version", web_secret)
    assert what == "Localhost node-resize-exporter.json"
    spec["process"]["args"] = spec["process"]["args"][:1] + ["--version"]
    status, out = _run_once(spec, tmp_path / "version", 300)
    assert status == 0 and _version() in out, out
    # `check` with the DaemonSet's arguments: each source and the web config asked whether it
    # can start, on the host's sysfs, under qemu's syscall translation.
    spec, _, _ = _pod(unpacked_arm64, tmp_path / "check", web_secret)
    args = spec["process"]["args"]
    spec["process"]["args"] = args[:1] + ["check"] + [a for a in args[1:] if a != "run"]
    status, out = _run_once(spec, tmp_path / "check", 600)
    said = {m.group(2): m.group(1) for m in re.finditer(r"^(OK|WARN|FAIL)\s+([^:]+):", out, re.M)}
    assert said.get("sysfs source") == "OK" and said.get("uevent source") == "OK", out
    assert said.get("web") == "OK", out
    assert status == (1 if "FAIL" in said.values() else 0), out
    print(out)


def _in_image(root: Path, path: Path) -> Path:
    """PATH with its symbolic links followed inside the image's tree (never the host's)."""
    for _ in range(10):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = root / target.lstrip("/") if target.startswith("/") else path.parent / target
    raise AssertionError(f"{path}: a loop of links")


@pytest.mark.parametrize("fixture, arch", [("unpacked", "amd64"), ("unpacked_arm64", "arm64")])
def test_each_image_is_a_configured_debian_system(fixture, arch, request):
    """The Debian layer is unpacked and configured by the host's tools (deploy/image/build.sh
    configure: no maintainer script runs under emulation): what dpkg and the packages' scripts
    would have left must be there, read here with the host's dpkg on the image's database."""
    root, _ = request.getfixturevalue(fixture)
    admin = ["--admindir", str(root / "var" / "lib" / "dpkg")]
    status = subprocess.run(
        ["dpkg-query", *admin, "-W", "-f", "${Package} ${Status} ${Architecture}\n"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    installed = {line.split()[0]: line.split()[-1] for line in status.splitlines()
                 if " install ok installed " in line}
    assert len(installed) == len(status.splitlines()) > 50, status
    for pkg in ("python3", "python3-bpfcc", "libbpf1", "ca-certificates", "libc6", "dpkg"):
        assert installed.get(pkg) in (arch, "all"), (pkg, installed.get(pkg))
    # Every packaged file the image keeps is the package's (md5sums), read by dpkg itself.
    verify = subprocess.run(["dpkg", "--root", str(root), "--verify", "python3-bpfcc", "libc6"],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and verify.stdout == "", verify.stdout + verify.stderr
    # base-passwd's accounts (its masters: no shadow file in the image, as on a debootstrap).
    assert (root / "etc" / "passwd").read_text().startswith("root:*:0:0:root:/root:")
    assert (root / "etc" / "group").read_text().startswith("root:*:0:")
    assert (root / "bin").readlink() == Path("usr/bin")
    # update-alternatives' links, inside the image.
    assert os.readlink(root / "usr" / "bin" / "awk") == "/etc/alternatives/awk"
    assert os.readlink(root / "etc" / "alternatives" / "awk") == "/usr/bin/mawk"
    # update-ca-certificates: the bundle, and every link pointing into the image's own tree.
    bundle = (root / "etc" / "ssl" / "certs" / "ca-certificates.crt").read_text()
    assert bundle.count("BEGIN CERTIFICATE") > 100
    links = [p for p in (root / "etc" / "ssl" / "certs").iterdir() if p.is_symlink()]
    assert len(links) > 200
    for link in links:
        assert _in_image(root, link).is_file(), link
    # libc-bin's trigger (the loader's cache) and python's byte-code, made for the image.
    assert b"libbcc.so" in (root / "etc" / "ld.so.cache").read_bytes()
    assert (root / "usr" / "lib" / "python3.11" / "__pycache__" / "os.cpython-311.pyc").is_file()
    assert (root / "etc" / "nsswitch.conf").read_text().startswith("#")
