"""The DaemonSet's pod as an OCI runtime bundle: what a kubelet + CRI runtime would hand runc.

Everything security-relevant is read from deploy/daemonset.yaml, never restated here: the
container's securityContext (capabilities, read-only root, no privilege escalation, user, seccomp
profile: RuntimeDefault or the Localhost profile shipped in deploy/seccomp/), its volumeMounts and
the volumes behind them (hostPath read-only binds, emptyDir tmpfs), hostNetwork. Used by
tests/kernel/test_image.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DAEMONSET = REPO / "deploy" / "daemonset.yaml"
SECCOMP_DIR = REPO / "deploy" / "seccomp"
# The default profile of Debian's containers-common: CRI-O's RuntimeDefault and podman's default.
RUNTIME_DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")
SCMP_ARCH = {"amd64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]}
# Paths the exporter may write on the host: the test gives each a fresh directory instead.
WRITABLE_HOST_PATHS = ("/var/lib/node-resize-exporter", "/var/lib/kubelet/pod-resources",
                       "/var/lib/kubelet/seccomp")


def daemonset() -> dict:
    return next(d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d)


def exporter_container(ds: dict) -> dict:
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "exporter")


def seccomp_profile(container: dict) -> tuple[str, dict]:
    """(what it is, the Docker-format profile) for the container's seccompProfile."""
    sec = container["securityContext"]["seccompProfile"]
    if sec["type"] == "RuntimeDefault":
        return "RuntimeDefault", json.loads(RUNTIME_DEFAULT_SECCOMP.read_text())
    if sec["type"] == "Localhost":
        name = Path(sec["localhostProfile"]).name  # installed as-is by the init container
        return f"Localhost {name}", json.loads((SECCOMP_DIR / name).read_text())
    raise AssertionError(f"seccompProfile {sec['type']} is not tested here")


def seccomp_to_oci(profile: dict, caps: set[str], arch: str = "amd64") -> dict:
    """The Docker/containerd profile format resolved for one container, as containerd and CRI-O
    do it: a rule with includes.caps needs all of them, one with excludes.caps is dropped when
    the container has any of them; arches likewise."""
    rules = []
    for rule in profile["syscalls"]:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if inc.get("caps") and not set(inc["caps"]) <= caps:
            continue
        if exc.get("caps") and set(exc["caps"]) & caps:
            continue
        if inc.get("arches") and arch not in inc["arches"]:
            continue
        if exc.get("arches") and arch in exc["arches"]:
            continue
        rules.append({k: v for k, v in rule.items()
                      if k in ("names", "action", "errnoRet", "args") and v is not None})
    spec = {"defaultAction": profile["defaultAction"], "architectures": SCMP_ARCH[arch],
            "syscalls": rules}
    if "defaultErrnoRet" in profile:
        spec["defaultErrnoRet"] = profile["defaultErrnoRet"]
    return spec


def capabilities(container: dict) -> set[str]:
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"], "the test assumes every capability is dropped first"
    return {f"CAP_{c}" for c in caps.get("add", [])}


def mounts(ds: dict, container: dict, scratch: Path, secrets: dict[str, Path],
           absent: frozenset[str] = frozenset()) -> list[dict]:
    """The container's volumeMounts as OCI mounts: hostPath as recursive binds (read-only when
    the mount says so), emptyDir as tmpfs, a Secret as a read-only bind of the directory
    `secrets` gives for it. A hostPath the exporter may write is replaced by a fresh directory
    under `scratch`; an optional one (type unset) missing here, or named in `absent` (a node
    without it), is an empty directory, as containerd creates it."""
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    out = []
    for vm in container["volumeMounts"]:
        vol = volumes[vm["name"]]
        opts = ["rbind", "rprivate", "nosuid", "nodev"] + (["ro"] if vm.get("readOnly") else [])
        if "hostPath" in vol:
            path = vol["hostPath"]["path"]
            if path in WRITABLE_HOST_PATHS:
                source = scratch / path.strip("/").replace("/", "_")
                source.mkdir(parents=True, exist_ok=True)
            else:
                source = Path(path)
                if not source.exists() or path in absent:
                    assert not vol["hostPath"].get("type"), f"{path} is not optional"
                    source = scratch / ("missing_" + path.strip("/").replace("/", "_"))
                    source.mkdir(parents=True, exist_ok=True)
                    # The mount points of the mounts nested in this one (pod-resources inside
                    # the kubelet's root): on a node they exist; in a read-only stand-in runc
                    # cannot make them.
                    inside = vm["mountPath"].rstrip("/") + "/"
                    for other in container["volumeMounts"]:
                        if other["mountPath"].startswith(inside):
                            (source / other["mountPath"][len(inside):]).mkdir(
                                parents=True, exist_ok=True)
            out.append({"destination": vm["mountPath"], "type": "bind", "source": str(source),
                        "options": opts})
        elif "secret" in vol:
            out.append({"destination": vm["mountPath"], "type": "bind",
                        "source": str(secrets[vol["secret"]["secretName"]]),
                        "options": ["rbind", "rprivate", "nosuid", "nodev", "ro"]})
        elif "emptyDir" in vol:
            size = vol["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
            out.append({"destination": vm["mountPath"], "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=1777", f"size={size}"]})
        else:
            raise AssertionError(f"volume {vm['name']}: only hostPath and emptyDir are tested")
    return out


def bundle_config(image_spec: dict, scratch: Path, args: list[str], env: dict[str, str],
                  secrets: dict[str, Path], absent: frozenset[str] = frozenset(),
                  runtime_default: bool = False) -> tuple[dict, str]:
    """config.json for the pod's exporter container, from umoci's default spec of the image;
    also returns which seccomp profile it carries (`runtime_default`: the runtime's default
    instead of the DaemonSet's, to show why the DaemonSet ships its own)."""
    ds = daemonset()
    pod = ds["spec"]["template"]["spec"]
    container = exporter_container(ds)
    sc = container["securityContext"]
    assert not sc.get("privileged"), "a privileged container is not what this test checks"
    spec = json.loads(json.dumps(image_spec))
    caps = sorted(capabilities(container))
    proc = spec["process"]
    proc["terminal"] = False
    proc["args"] = proc["args"][:1] + args  # the image's entrypoint, the pod's arguments
    proc["env"] = [e for e in proc["env"] if not e.startswith("HOME=")] + \
        [f"{k}={v}" for k, v in env.items()]
    proc["user"] = {"uid": sc.get("runAsUser", 0), "gid": sc.get("runAsGroup", 0)}
    # A CRI runtime sets no ambient or inheritable capabilities.
    proc["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps,
                            "inheritable": [], "ambient": []}
    proc["noNewPrivileges"] = sc.get("allowPrivilegeEscalation", True) is False
    # Root here lacks CAP_SYS_RESOURCE: the runtime must not touch oom_score_adj.
    proc.pop("oomScoreAdj", None)
    spec["root"] = {"path": spec["root"]["path"],
                    "readonly": bool(sc.get("readOnlyRootFilesystem"))}
    spec["hostname"] = os.uname().nodename
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")]
    if not pod.get("hostNetwork"):
        namespaces.append({"type": "network"})
    spec["linux"]["namespaces"] = namespaces
    # The runtime's own mounts minus /sys (the pod brings the host's /sys as a hostPath).
    base = [m for m in spec["mounts"] if not m["destination"].startswith("/sys")]
    spec["mounts"] = base + mounts(ds, container, scratch, secrets, absent)
    if runtime_default:
        container = json.loads(json.dumps(container))
        container["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    what, profile = seccomp_profile(container)
    spec["linux"]["seccomp"] = seccomp_to_oci(profile, set(caps))
    return spec, what
