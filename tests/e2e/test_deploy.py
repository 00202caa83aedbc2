"""deploy/: the manifests validate offline against the schemas of the two newest Kubernetes
versions kubernetes-validate knows, the PrometheusRule is what alerts/ generates, the RBAC is what
the code calls, and the DaemonSet keeps its promises: capabilities, read-only mounts, not
privileged, starts on every node (optional host paths, its own priority class), the shipped
seccomp profile, /metrics behind TLS and Kubernetes token auth with the RBAC it needs,
found by kube-prometheus-stack, whose Grafana sidecar loads the dashboards component's
ConfigMaps.
tests/kernel/test_image.py runs the image with this DaemonSet's securityContext for real."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dockerfile
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import Version, all_versions

from testkit.deploy import (
    STACK_NAME,
    container_of,
    exporter_namespace,
    load_manifest,
    render,
    stack,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: not in the upstream schemas
# The two newest Kubernetes versions the installed kubernetes-validate has schemas for.
KUBE_VERSIONS = sorted(set(all_versions()), key=Version)[-2:]




def _manifests() -> dict[str, dict]:
    kustomization = load_manifest("kustomization.yaml")
    return {name: load_manifest(name) for name in kustomization["resources"]}




def _init_container(ds: dict) -> dict:
    (container,) = ds["spec"]["template"]["spec"]["initContainers"]
    return container


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_monitoring",
                                                  REPO / "scripts" / "gen-monitoring.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- kustomization and schemas --------------------------------------------------------------

def test_kustomization_lists_every_manifest_once():
    listed = load_manifest("kustomization.yaml")["resources"]
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


def test_validating_two_versions():
    assert len(KUBE_VERSIONS) == 2 and KUBE_VERSIONS[0] != KUBE_VERSIONS[1]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(load_manifest("kustomization.yaml")["resources"]))
def test_manifest_validates_against_kubernetes_schema(name, version):
    doc = load_manifest(name)
    if doc["kind"] in OPERATOR_KINDS:
        # No offline schema for prometheus-operator's CRDs: their content is checked by the
        # scrape-wiring and PrometheusRule tests below.
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        return
    # strict: unknown fields are errors, so a typo such as `readOnlyRootFileSystem` is caught.
    kubernetes_validate.validate(doc, version, strict=True)


def test_schema_validation_rejects_a_broken_daemonset():
    """The validator is really looking: a wrong type in the DaemonSet must be an error."""
    ds = load_manifest("daemonset.yaml")
    container_of(ds)["securityContext"]["readOnlyRootFilesystem"] = "yes"
    for version in KUBE_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(ds, version, strict=True)


# Roles that live where what they grant is: the node's Lease and the Node's Events.
FOREIGN_NAMESPACES = {("Role", "node-resize-exporter-node-lease"): "kube-node-lease",
                      ("RoleBinding", "node-resize-exporter-node-lease"): "kube-node-lease",
                      ("Role", "node-resize-exporter-node-events"): "default",
                      ("RoleBinding", "node-resize-exporter-node-events"): "default"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}


def test_namespaced_objects_share_one_namespace():
    """As rendered (kubectl kustomize): everything in the exporter's namespace but the Roles
    that must be elsewhere, and every binding names the exporter's own service account."""
    namespace = exporter_namespace()
    assert load_manifest("namespace.yaml")["metadata"]["name"] == namespace
    account = load_manifest("serviceaccount.yaml")["metadata"]["name"]
    docs = render()
    for doc in docs:
        if doc["kind"] in CLUSTER_SCOPED:
            continue
        key = (doc["kind"], doc["metadata"]["name"])
        assert doc["metadata"]["namespace"] == FOREIGN_NAMESPACES.get(key, namespace), key
    placed = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert set(FOREIGN_NAMESPACES) <= placed
    for doc in docs:
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding") and "scrape" not in \
                doc["metadata"]["name"]:
            assert doc["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": namespace}], doc["metadata"]["name"]


# --- PrometheusRule: one source of truth -----------------------------------------------------

def test_prometheusrules_are_generated_from_the_mixin():
    gen = _gen_module()
    files = gen.render()
    for name in ("prometheusrule.yaml", "prometheusrule-global.yaml"):
        assert (DEPLOY / name).read_text() == files[f"deploy/{name}"], \
            f"deploy/{name} is stale: run scripts/gen-monitoring.py"


def test_prometheusrule_groups_equal_rule_file():
    """The rule objects split the rule file's groups: the per-node ones, and those for the
    global ruler (the absent guard among them) in their own object."""
    rules = yaml.safe_load((REPO / "alerts" / "node-resize-exporter.rules.yml").read_text())
    main, fleet = load_manifest("prometheusrule.yaml"), load_manifest("prometheusrule-global.yaml")
    assert main["kind"] == fleet["kind"] == "PrometheusRule"
    assert main["metadata"]["name"] != fleet["metadata"]["name"]
    by_name = {g["name"]: g for g in main["spec"]["groups"] + fleet["spec"]["groups"]}
    assert [by_name[g["name"]] for g in rules["groups"]] == rules["groups"]
    assert len(by_name) == len(rules["groups"])
    absent = [r["alert"] for g in fleet["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "NodeResizeExporterAbsent" in absent


def test_generator_check_mode_detects_a_stale_file(tmp_path, capsys):
    gen = _gen_module()
    assert gen.main(["--out", str(tmp_path)]) == 0
    stale = tmp_path / "deploy" / "prometheusrule.yaml"
    stale.write_text(stale.read_text().replace("severity: critical", "severity: info"))
    assert gen.main(["--check", "--out", str(tmp_path)]) == 1
    assert "severity: critical" in capsys.readouterr().out
    assert gen.main(["--out", str(tmp_path)]) == 0
    assert gen.main(["--check", "--out", str(tmp_path)]) == 0


# --- scrape wiring ---------------------------------------------------------------------------

def test_service_monitor_scrapes_the_daemonset_and_labels_node():
    ds, svc, sm = (load_manifest(name) for name in
                   ("daemonset.yaml", "service.yaml", "servicemonitor.yaml"))
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]

    port_names = {p["name"] for p in container_of(ds)["ports"]}
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["targetPort"] in port_names
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"]
    assert endpoint["path"] == "/metrics"
    # Dashboards and alerts group by `node`, taken from the pod's node name.
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in endpoint["relabelings"]
    # The alerts match up{job="node-resize-exporter"}: the operator's job label is the
    # Service name unless jobLabel says otherwise.
    assert "jobLabel" not in sm["spec"]
    assert svc["metadata"]["name"] == "node-resize-exporter"
    rules = (REPO / "alerts" / "node-resize-exporter.rules.yml").read_text()
    assert f'up{{job="{svc["metadata"]["name"]}"}}' in rules


# --- DaemonSet security and mounts -----------------------------------------------------------


def test_daemonset_gets_node_name_from_downward_api():
    env = {e["name"]: e for e in container_of(load_manifest("daemonset.yaml"))["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_daemonset_is_not_privileged_and_has_only_bpf_and_perfmon():
    ds = load_manifest("daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    sc = container_of(ds)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "PERFMON"]}
    assert pod.get("hostPID", False) is False
    assert pod.get("hostIPC", False) is False


def _mounts(ds: dict) -> dict[str, tuple[str, bool]]:
    """mountPath -> (host path, read-only) for every hostPath mount."""
    host = {
        v["name"]: v["hostPath"]["path"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    return {
        m["mountPath"]: (host[m["name"]], m.get("readOnly", False))
        for m in container_of(ds)["volumeMounts"]
        if m["name"] in host
    }


def test_daemonset_mounts_host_paths_read_only_except_the_journal():
    mounts = _mounts(load_manifest("daemonset.yaml"))
    for path in [
        "/sys",
        "/sys/kernel/tracing",
        "/lib/modules",
        "/usr/src",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/kubelet",  # the plan's: the kubelet's checkpoints and config (issue 35)
        "/sys/fs/cgroup",  # the plan's: the running containers
    ]:
        assert mounts[path] == (path, True), path
    assert mounts["/var/lib/node-resize-exporter"] == ("/var/lib/node-resize-exporter", False)
    assert set(mounts) == {
        "/sys",
        "/sys/kernel/tracing",
        "/lib/modules",
        "/usr/src",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/kubelet",
        "/sys/fs/cgroup",
        "/var/lib/node-resize-exporter",
    }


def test_journal_flag_points_into_the_journal_mount():
    args = container_of(load_manifest("daemonset.yaml"))["args"]
    (journal,) = [a.split("=", 1)[1] for a in args if a.startswith("--journal=")]
    assert Path(journal).parent == Path("/var/lib/node-resize-exporter")


def _commented_patch() -> list[dict]:
    """The CAP_SYS_ADMIN fallback kept as a comment in kustomization.yaml, uncommented."""
    text = (DEPLOY / "kustomization.yaml").read_text()
    lines = [line for line in text.splitlines() if line.startswith("# ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("# patches:"))
    lines[start] = "# patches:"
    block = yaml.safe_load("\n".join(line[2:] for line in lines[start:]))
    (entry,) = block["patches"]
    assert entry["target"] == {"kind": "DaemonSet", "name": "node-resize-exporter"}
    return yaml.safe_load(entry["patch"])


def _apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    doc = json.loads(json.dumps(doc))
    for op in ops:
        assert op["op"] in ("replace", "add"), op
        *parents, leaf = [p for p in op["path"].split("/") if p]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key = int(leaf) if isinstance(node, list) else leaf
        if op["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), op["path"]
        node[key] = op["value"]
    return doc


def test_sys_admin_fallback_patch_applies_and_stays_unprivileged():
    ds = _apply_json_patch(load_manifest("daemonset.yaml"), _commented_patch())
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(ds, version, strict=True)
    sc = container_of(ds)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert sc["privileged"] is False


# --- RBAC equals the API calls the code makes ------------------------------------------------

_CALL = re.compile(r"\.(get|list|watch)\(\s*(self\.resource\b|[A-Z]\w*)")
_API_INFO = re.compile(
    r'class\s+(\w+)\([^)]*\):(?:(?!\nclass ).)*?create_api_info\(\s*"([^"]*)",'
    r'\s*"[^"]*",\s*"[^"]*",\s*"([^"]*)"',
    re.S,
)
_RESOURCE_ATTR = re.compile(r"^\s+resource\s*=\s*([A-Z]\w*)\s*$", re.M)


def _api_calls(sources: dict[str, str]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, from the lightkube calls in `sources` (path -> text).

    Resource classes are those declared with create_api_info (exporter/kube/client.py) or
    imported from lightkube.resources. A call names its resource directly
    (`client.watch(RawNode, ...)`) or, in the shared list-then-watch base
    (exporter/sources/apiserver/listwatch.py), through `self.resource`, which each source sets
    as a class attribute (`resource = RawNode`): those verbs then apply to every such resource.
    """
    classes: dict[str, tuple[str, str]] = {}
    for text in sources.values():
        for cls, group, plural in _API_INFO.findall(text):
            classes[cls] = (group, plural)
        for module, names in re.findall(
            r"from lightkube\.resources\.(\w+) import ([\w, ()\n]+)", text
        ):
            group = "" if module.startswith("core_") else module.rsplit("_", 1)[0]
            for name in re.findall(r"\w+", names):
                classes.setdefault(name, (group, name.lower() + "s"))
    calls: dict[tuple[str, str], set[str]] = {}
    via_self: set[str] = set()
    for text in sources.values():
        for verb, target in _CALL.findall(text):
            if target == "self.resource":
                via_self.add(verb)
            elif target in classes:
                calls.setdefault(classes[target], set()).add(verb)
    for text in sources.values():
        for cls in _RESOURCE_ATTR.findall(text):
            if cls in classes and via_self:
                calls.setdefault(classes[cls], set()).update(via_self)
    return calls


def _code_api_calls() -> dict[tuple[str, str], set[str]]:
    return _api_calls({str(p): p.read_text() for p in (REPO / "exporter").rglob("*.py")})


def test_api_call_scanner_reads_both_call_styles():
    sources = {
        "client.py": "class RawNode(GenericGlobalResource):\n"
        '    _api_info = create_api_info("", "v1", "Node", "nodes", verbs=V)\n'
        "class RawLease(GenericNamespacedResource):\n"
        '    _api_info = create_api_info("coordination.k8s.io", "v1", "Lease", '
        '"leases", verbs=V)\n',
        "watch.py": "    def _list(self):\n        self._client.list(self.resource, ns=1)\n"
        "    def _watch(self):\n        self._client.watch(self.resource)\n",
        "kube_node.py": "class KubeNodeSource(ListWatchSource):\n    resource = RawNode\n",
        "lease.py": "    client.get(RawLease, name='x')\n    {}.get(k)\n",
    }
    assert _api_calls(sources) == {
        ("", "nodes"): {"list", "watch"},
        ("coordination.k8s.io", "leases"): {"get"},
    }


def test_kube_sources_exist():
    # The RBAC comparison below is only meaningful once the sources that call the API exist.
    names = sorted(p.name for p in (REPO / "exporter" / "sources").rglob("kube_*.py"))
    assert {"kube_node.py", "kube_pods.py", "kube_pdbs.py"} <= set(names)


def _granted(docs: list[dict]) -> dict[tuple[str, str], dict[str | None, set[str]]]:
    """(group, resource) -> {namespace (None: cluster-wide): verbs}, for the exporter's own
    ClusterRoles and Roles (not the scrape role it grants Prometheus)."""
    out: dict[tuple[str, str], dict[str | None, set[str]]] = {}
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role") or "scrape" in doc["metadata"]["name"]:
            continue
        where = doc["metadata"].get("namespace") if doc["kind"] == "Role" else None
        for rule in doc["rules"]:
            for group in rule.get("apiGroups", ()):  # nonResourceURLs rules grant no API
                for resource in rule["resources"]:
                    out.setdefault((group, resource), {}).setdefault(where, set()).update(
                        rule["verbs"])
    return out


def test_rbac_is_exactly_what_the_code_calls_and_where():
    """Every list/watch the sources make is granted, nothing else is; cluster-wide only for
    what is cluster-scoped or spans namespaces (nodes; pods of every namespace on this node),
    a Role in the one namespace a source reads otherwise (its Lease, its Node's Events)."""
    from exporter.sources.apiserver.kube_lease import KubeLeaseSource
    from exporter.sources.apiserver.kube_node_events import KubeNodeEventsSource

    granted = _granted(render())
    called = _code_api_calls()
    assert called, "found no lightkube list/watch/get calls under exporter/"
    assert {k: set().union(*v.values()) for k, v in granted.items()} == called
    assert granted[("", "nodes")] == {None: {"list", "watch"}}
    assert granted[("", "pods")] == {None: {"list", "watch"}}
    # budgets of every namespace may select this node's pods: cluster-wide, read-only
    assert granted[("policy", "poddisruptionbudgets")] == {None: {"list", "watch"}}
    assert granted[("coordination.k8s.io", "leases")] == \
        {KubeLeaseSource.namespace: {"list", "watch"}} == {"kube-node-lease": {"list", "watch"}}
    assert granted[("", "events")] == \
        {KubeNodeEventsSource.namespace: {"list", "watch"}} == {"default": {"list", "watch"}}
    verbs = {v for by_ns in granted.values() for vs in by_ns.values() for v in vs}
    assert verbs <= {"get", "list", "watch"}, "the exporter never writes without --kube-events"


def test_posting_events_is_a_role_in_default_only_with_the_component():
    component = DEPLOY / "components" / "kube-events"
    docs = render(DEPLOY, component)
    granted = _granted(docs)
    assert granted[("", "events")] == {"default": {"list", "watch", "create", "patch"}}
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert "--kube-events" in container_of(ds)["args"]
    assert "--kube-events" not in container_of(load_manifest("daemonset.yaml"))["args"]
    # Nothing else widened: the base's grants are the component's minus posting.
    base = _granted(render())
    assert {k: v for k, v in granted.items() if k != ("", "events")} == \
        {k: v for k, v in base.items() if k != ("", "events")}


def test_kubelet_metrics_rbac_matches_whether_it_is_enabled():
    # --kubelet-metrics-url needs get on nodes/metrics; the DaemonSet does not enable it, so
    # the role must not grant it (the optional rule is documented in clusterrole.yaml).
    args = container_of(load_manifest("daemonset.yaml"))["args"]
    enabled = any(a.startswith("--kubelet-metrics-url") for a in args)
    resources = {
        r for rule in load_manifest("clusterrole.yaml")["rules"] for r in rule["resources"]
    }
    assert ("nodes/metrics" in resources) == enabled
    assert "nodes/metrics" in (DEPLOY / "clusterrole.yaml").read_text()


def test_daemonset_args_are_options_the_exporter_accepts():
    from click.testing import CliRunner

    from exporter.cli.main import main

    result = CliRunner().invoke(main, ["run", "--help"])
    assert result.exit_code == 0, result.output
    args = container_of(load_manifest("daemonset.yaml"))["args"]
    assert args[0] == "run"
    for arg in args[1:]:
        option = arg.split("=", 1)[0]
        assert re.search(rf"^\s+{re.escape(option)}\b", result.output, re.M), (
            f"`run` has no option {option}"
        )


# --- Dockerfile ------------------------------------------------------------------------------

_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def _build_sh_packages() -> list[str]:
    text = (DEPLOY / "image" / "build.sh").read_text()
    return re.search(r"^packages=\(([^)]*)\)", text, re.M).group(1).split()


def test_dockerfile_is_the_same_recipe_as_make_image():
    # No Docker engine here: parse with buildkit's own parser and check what can be checked.
    commands = dockerfile.parse_file(str(DEPLOY / "Dockerfile"))
    froms = [c for c in commands if c.cmd == "FROM"]
    assert all(c.value[0].startswith("debian:12") for c in froms)
    assert {c.cmd for c in commands} <= _INSTRUCTIONS
    final = commands[commands.index(froms[-1]) :]
    runs = " ".join(" ".join(c.value) for c in final if c.cmd == "RUN")
    installed = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", runs).group(1)
    assert installed.split() == _build_sh_packages()
    assert "linux-headers-amd64" in runs and "/usr/lib/node-resize-exporter/linux-headers" in runs
    for c in commands:
        if c.cmd in {"ENTRYPOINT", "CMD"}:
            assert c.json, f"{c.cmd} in shell form: signals would go to /bin/sh, not Python"
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
            for src in c.value[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
    copied = {c.value[0]: c.value[-1] for c in final if c.cmd == "COPY"}
    build_sh = (DEPLOY / "image" / "build.sh").read_text()
    (entrypoint,) = [c for c in commands if c.cmd == "ENTRYPOINT"]
    assert copied["deploy/image/entrypoint.sh"] == entrypoint.value[0]
    assert f"--config.entrypoint {entrypoint.value[0]}" in build_sh
    profile = copied["deploy/seccomp/node-resize-exporter.json"]
    assert profile in build_sh
    assert profile in " ".join(_init_container(load_manifest("daemonset.yaml"))["command"])
    exposed = {c.value[0] for c in commands if c.cmd == "EXPOSE"}
    ports = {
        str(p["containerPort"]) for p in container_of(load_manifest("daemonset.yaml"))["ports"]
    }
    assert exposed == ports
    assert {f"--config.exposedports {p}/tcp" for p in ports} <= {
        m.group(0) for m in re.finditer(r"--config.exposedports \S+", build_sh)
    }


# --- starts on every node --------------------------------------------------------------------

OPTIONAL_HOST_PATHS = {"/sys/kernel/tracing", "/lib/modules", "/usr/src"}


def test_host_paths_a_node_may_lack_are_optional():
    """hostPath type unset: the kubelet does not check, so a node without kernel headers or
    tracefs still runs the pod; the source that needs them reports down with the reason."""
    volumes = {
        v["hostPath"]["path"]: v["hostPath"]
        for v in load_manifest("daemonset.yaml")["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    for path in OPTIONAL_HOST_PATHS:
        assert "type" not in volumes[path], path
    assert {p for p, v in volumes.items() if v.get("type") == "Directory"} == {"/sys"}


def test_priority_class_is_the_exporters_own_and_accepted_anywhere():
    pc = load_manifest("priorityclass.yaml")
    pod = load_manifest("daemonset.yaml")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == pc["metadata"]["name"]
    assert not pc["metadata"]["name"].startswith("system-")  # reserved names need kube-system
    assert pc["value"] <= 1_000_000_000  # the highest a user-defined class may have
    assert pc["globalDefault"] is False
    assert "priorityclass.yaml" in load_manifest("kustomization.yaml")["resources"]


# --- seccomp -----------------------------------------------------------------------------------

SHIPPED_PROFILE = DEPLOY / "seccomp" / "node-resize-exporter.json"
RUNTIME_DEFAULT = Path("/usr/share/containers/seccomp.json")


def _rules(profile: dict) -> set[str]:
    return {
        json.dumps({**r, "names": [n]}, sort_keys=True)
        for r in profile["syscalls"]
        for n in r["names"]
    }


def test_exporter_runs_under_the_shipped_profile_installed_by_the_init_container():
    ds = load_manifest("daemonset.yaml")
    sc = container_of(ds)["securityContext"]["seccompProfile"]
    assert sc["type"] == "Localhost"
    init = _init_container(ds)
    assert init["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    (mount,) = init["volumeMounts"]
    host_dir = volumes[mount["name"]]["hostPath"]["path"]
    # The kubelet resolves localhostProfile under /var/lib/kubelet/seccomp.
    assert (
        f"{host_dir}/{Path(sc['localhostProfile']).name}"
        == f"/var/lib/kubelet/seccomp/{sc['localhostProfile']}"
    )
    assert f"{mount['mountPath']}/{Path(sc['localhostProfile']).name}" in " ".join(init["command"])
    assert Path(sc["localhostProfile"]).name == SHIPPED_PROFILE.name


def test_shipped_profile_is_the_runtime_default_plus_bpf_and_perf_event_open():
    """The narrowest profile that works: the runtime default (Debian's containers-common,
    CRI-O's RuntimeDefault) with bpf() allowed under CAP_BPF and perf_event_open() under
    CAP_PERFMON, nothing else."""
    if not RUNTIME_DEFAULT.exists():
        pytest.fail(
            f"{RUNTIME_DEFAULT} missing: scripts/setup.sh test installs skopeo "
            "(golang-github-containers-common)"
        )
    default, shipped = (
        json.loads(RUNTIME_DEFAULT.read_text()),
        json.loads(SHIPPED_PROFILE.read_text()),
    )
    assert {k: v for k, v in shipped.items() if k != "syscalls"} == {
        k: v for k, v in default.items() if k != "syscalls"
    }
    added, removed = _rules(shipped) - _rules(default), _rules(default) - _rules(shipped)
    allowed = {
        (n, tuple(json.loads(r).get("includes", {}).get("caps", [])))
        for r in added
        for n in json.loads(r)["names"]
        if json.loads(r)["action"] == "SCMP_ACT_ALLOW"
    }
    assert allowed == {("bpf", ("CAP_BPF",)), ("perf_event_open", ("CAP_PERFMON",))}
    # The refusals without the capability stay, moved to rules that also exclude CAP_BPF /
    # CAP_PERFMON (a rule with `excludes` is dropped when the container has any of them).
    assert {json.loads(r)["names"][0] for r in removed} == {"bpf", "perf_event_open"}
    for r in map(
        json.loads, added - {r for r in added if json.loads(r)["action"] == "SCMP_ACT_ALLOW"}
    ):
        assert r["action"] == "SCMP_ACT_ERRNO" and "CAP_SYS_ADMIN" in r["excludes"]["caps"]


# --- /metrics protected, found by kube-prometheus-stack -------------------------------------


SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _telemetry_path(args: list[str]) -> str:
    given = [a.split("=", 1)[1] for a in args if a.startswith("--web.telemetry-path=")]
    return given[-1] if given else "/metrics"


def test_metrics_are_served_with_kubernetes_auth_and_no_secret_to_mint():
    ds = load_manifest("daemonset.yaml")
    args = container_of(ds)["args"]
    assert "--web.auth=kubernetes" in args
    assert not any(a.startswith("--web.config.file") for a in args)
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    assert not [v for v in volumes if "secret" in v], "the default deployment mounts no Secret"
    ready, live = container_of(ds)["readinessProbe"], container_of(ds)["livenessProbe"]
    assert ready["httpGet"]["scheme"] == "HTTPS" and ready["httpGet"]["path"] == "/healthz"
    # Liveness: the plain-HTTP /healthz listener on the node's loopback the args turn on.
    assert live["httpGet"]["scheme"] == "HTTP" and live["httpGet"]["path"] == "/healthz"
    assert f"--web.health-listen-address={live['httpGet']['host']}:" \
        f"{live['httpGet']['port']}" in args
    (endpoint,) = load_manifest("servicemonitor.yaml")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["path"] == _telemetry_path(args)
    # Prometheus's own token, and no verification of the certificate made at start.
    assert endpoint["bearerTokenFile"] == SA_TOKEN
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert "basicAuth" not in endpoint
    assert not (DEPLOY / "web-secret.py").exists()


def test_the_exporter_may_create_token_and_access_reviews():
    """The code POSTs TokenReviews and SubjectAccessReviews; system:auth-delegator (create on
    both, nothing else) is bound to the DaemonSet's service account."""
    code = (REPO / "exporter" / "web" / "kubeauth.py").read_text()
    assert '"/apis/authentication.k8s.io/v1/tokenreviews"' in code
    assert '"/apis/authorization.k8s.io/v1/subjectaccessreviews"' in code
    binding = load_manifest("auth-delegator.yaml")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "system:auth-delegator"}
    sa = load_manifest("serviceaccount.yaml")
    ds = load_manifest("daemonset.yaml")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_prometheus_may_get_exactly_the_telemetry_path():
    args = container_of(load_manifest("daemonset.yaml"))["args"]
    role = load_manifest("scrape-clusterrole.yaml")
    assert role["rules"] == [{"nonResourceURLs": [_telemetry_path(args)], "verbs": ["get"]}]
    (binding,) = [d for d in render() if d["metadata"]["name"] == "node-resize-exporter-scrape"
                  and d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # Exactly the service account stack.yaml names, and nobody else.
    names = stack()
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": names["prometheus-service-account"],
                                    "namespace": names["prometheus-namespace"]}]


def test_kube_prometheus_stack_default_selectors_find_monitor_and_rules():
    """kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by
    `release: <Helm release>` and scrapes as `<release>-prometheus` when the release is named
    kube-prometheus-stack (the chart's fullname is the release name when it contains the
    chart's): the defaults are that install's, and every such object as rendered carries them."""
    names = stack()
    assert names["release"] == "kube-prometheus-stack"
    assert names["prometheus-service-account"] == f"{names['release']}-prometheus"
    assert names["prometheus-namespace"] == "monitoring"
    docs = render()
    labelled = [d for d in docs if d["kind"] in OPERATOR_KINDS]
    assert {d["kind"] for d in labelled} == OPERATOR_KINDS
    for doc in labelled:
        assert doc["metadata"]["labels"]["release"] == names["release"], doc["metadata"]["name"]


# --- one place for the stack's names, and overlays that move them ---------------------------

OTHER_NAMES = {"namespace": "observability", "release": "prometheus",
               "prometheus-service-account": "prometheus-kube-prometheus-prometheus",
               "prometheus-namespace": "kps"}
COMPONENTS = sorted(p.parent for p in (DEPLOY / "components").glob("*/kustomization.yaml"))
# Roles (and their bindings) that live where what they grant is, whatever the exporter's
# namespace: the node's Lease, the Node's Events, and the kube-events component's Role.
ROLES_ELSEWHERE = {**FOREIGN_NAMESPACES,
                   ("Role", "node-resize-exporter-events"): "default",
                   ("RoleBinding", "node-resize-exporter-events"): "default"}


def _check_references(docs: list[dict], names: dict[str, str]) -> None:
    """Every cross-reference of a rendered install, against the names it was given."""
    namespace = names["namespace"]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("Namespace", namespace) in by
    assert by[("Namespace", namespace)]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "privileged"
    for doc in docs:
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
            continue
        key = (doc["kind"], doc["metadata"]["name"])
        assert doc["metadata"].get("namespace") == ROLES_ELSEWHERE.get(key, namespace), key
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"],
               "namespace": namespace}
    assert ("ServiceAccount", account["name"]) in by
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) >= 4
    for binding in bindings:
        name = binding["metadata"]["name"]
        if name == "node-resize-exporter-scrape":
            assert binding["subjects"] == [{
                "kind": "ServiceAccount", "name": names["prometheus-service-account"],
                "namespace": names["prometheus-namespace"]}]
        elif name != "node-resize-exporter-plan":  # your resizer's account, not the exporter's
            assert binding["subjects"] == [account], name
        role_kind = binding["roleRef"]["kind"]
        if not binding["roleRef"]["name"].startswith("system:"):
            role = by[(role_kind, binding["roleRef"]["name"])]
            assert role["metadata"].get("namespace") == binding["metadata"].get("namespace")
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    labelled_alerts = 0
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["metadata"]["labels"]["release"] == names["release"]
        for group in doc.get("spec", {}).get("groups", []) if doc["kind"] == "PrometheusRule" \
                else []:
            for rule in group["rules"]:
                if "namespace" in rule.get("labels", {}):  # absent(): the exporter's own
                    assert rule["labels"]["namespace"] == namespace, rule.get("alert")
                    labelled_alerts += 1
    assert labelled_alerts >= 1  # NodeResizeExporterAbsent
    volumes = {v["name"]: v for v in pod["volumes"]}
    for volume in volumes.values():
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in by
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    for cert in certificates:
        issuer = by[(cert["spec"]["issuerRef"]["kind"], cert["spec"]["issuerRef"]["name"])]
        assert issuer["metadata"]["namespace"] == cert["metadata"]["namespace"]
    if ("Certificate", "node-resize-exporter-tls") in by:
        cert = by[("Certificate", "node-resize-exporter-tls")]
        service_name = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
        assert cert["spec"]["dnsNames"] == [service_name]
        tls = sm["spec"]["endpoints"][0]["tlsConfig"]
        assert tls["serverName"] == service_name and "insecureSkipVerify" not in tls
        assert tls["ca"]["secret"]["name"] == cert["spec"]["secretName"]
        assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
        ca = by[("Issuer", "node-resize-exporter-ca")]["spec"]["ca"]["secretName"]
        assert by[("Certificate", ca)]["spec"]["isCA"] is True


def test_the_default_install_refers_to_its_own_names():
    _check_references(render(), stack())


def test_stack_names_set_once_from_an_overlay_move_every_object_and_component():
    """An overlay that patches stack.yaml's four names (and runs deploy/names/ after its
    patches) moves the exporter, its bindings' subjects, the ServiceMonitor's selector, the
    certificate's names and the dashboards with it, relabels what Prometheus selects, grants the
    other Prometheus, leaves the Roles in kube-node-lease and default, and keeps none of the
    old names anywhere."""
    assert set(OTHER_NAMES) == set(stack())
    assert not set(OTHER_NAMES.values()) & set(stack().values())
    docs = render(DEPLOY, *COMPONENTS, stack=OTHER_NAMES)
    _check_references(docs, OTHER_NAMES)
    # components/plan's binding names an example account for you to replace with your resizer's.
    text = yaml.safe_dump_all([d for d in docs
                               if d["metadata"]["name"] != "node-resize-exporter-plan"])
    old = stack()
    assert f".{old['namespace']}.svc" not in text
    assert f"namespace: {old['namespace']}\n" not in text
    assert old["release"] not in text  # the release and the account named after it
    kinds = {d["kind"] for d in docs}
    assert {"Certificate", "Issuer", "ConfigMap"} <= kinds  # the components were there
    assert not [d for d in docs if d["metadata"]["name"] == STACK_NAME]  # local-config


def test_the_overlay_recipe_stack_yaml_gives_renders(tmp_path):
    """The commented overlay in stack.yaml, as written there (its resources and transformers
    pointed at this deploy/), gives what it says."""
    text = (DEPLOY / "stack.yaml").read_text()
    start = text.index("#   resources: [../deploy]")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("#   "):
            break
        lines.append(line[4:])
    recipe = "\n".join(lines).replace("../deploy", os.path.relpath(DEPLOY, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(recipe)
    kubectl = Path(sys.executable).with_name("kubectl")
    out = subprocess.run([kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    patch = yaml.safe_load(yaml.safe_load(recipe)["patches"][0]["patch"])
    _check_references(docs, {**stack(), **patch["data"]})
    assert patch["data"]["namespace"] != stack()["namespace"]


def test_namespace_in_an_overlay_breaks_what_stack_yaml_says_it_does():
    """Why stack.yaml says not to set `namespace:` in an overlay: it moves the Lease and
    Event Roles out of kube-node-lease and default and leaves the ServiceMonitor's selector on
    the old namespace. If kustomize stops doing that, the advice can go."""
    docs = render(DEPLOY, namespace="observability")
    with pytest.raises(AssertionError):
        _check_references(docs, {**stack(), "namespace": "observability"})
    moved = {(d["kind"], d["metadata"]["name"]) for d in docs
             if d["metadata"].get("namespace") == "observability"}
    assert set(FOREIGN_NAMESPACES) <= moved


# --- Grafana dashboards for the dashboard sidecar -------------------------------------------

DASHBOARDS_COMPONENT = DEPLOY / "components" / "dashboards"
COMMITTED_DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))


def _dashboard_configmaps() -> list[dict]:
    return list(yaml.safe_load_all((DASHBOARDS_COMPONENT / "dashboards.yaml").read_text()))


def test_dashboards_component_ships_the_configmaps():
    kustomization = yaml.safe_load((DASHBOARDS_COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == ["dashboards.yaml"]
    assert {d["kind"] for d in _dashboard_configmaps()} == {"ConfigMap"}


def test_every_committed_dashboard_is_a_configmap_the_grafana_sidecar_loads():
    """kube-prometheus-stack's Grafana sidecar loads ConfigMaps labelled grafana_dashboard: "1"
    (its values: sidecar.dashboards.label / labelValue, searchNamespace ALL); each holds the
    dashboard's JSON byte for byte, under a file name no other dashboard uses."""
    shipped = {}
    for cm in _dashboard_configmaps():
        meta = cm["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1", meta["name"]
        assert meta["annotations"]["grafana_folder"], meta["name"]
        assert meta["namespace"] == exporter_namespace()
        ((key, text),) = cm["data"].items()
        assert key.startswith("node-resize-exporter-") and key.endswith(".json")
        shipped[key.removeprefix("node-resize-exporter-")] = text
        # `kubectl apply` keeps the object in an annotation that may not pass 256 KiB.
        assert len(json.dumps(cm)) < 200_000, meta["name"]
    assert shipped == {p.name: p.read_text() for p in COMMITTED_DASHBOARDS}


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_dashboard_configmaps_validate_against_kubernetes_schema(version):
    for cm in _dashboard_configmaps():
        kubernetes_validate.validate(cm, version, strict=True)


def test_readme_installs_the_dashboards_in_one_line():
    readme = (REPO / "README.md").read_text()
    assert "kubectl apply -k deploy/components/dashboards/" in readme


def test_the_no_node_lease_component_reads_no_lease_and_asks_for_none():
    """Leases only with the lease watch: the component turns the watch off and drops its Role;
    nothing else changes."""
    docs = render(DEPLOY, DEPLOY / "components" / "no-node-lease")
    granted = _granted(docs)
    assert ("coordination.k8s.io", "leases") not in granted
    assert not [d for d in docs if d["metadata"].get("namespace") == "kube-node-lease"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert "--no-node-lease" in container_of(ds)["args"]
    base = _granted(render())
    assert {k: v for k, v in base.items() if k != ("coordination.k8s.io", "leases")} == granted
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(ds, version, strict=True)
