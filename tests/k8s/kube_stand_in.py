"""tests/k8s/kube_stand_in.py: a stand-in Kubernetes API server for the tests of
`keel k8s status|logs|delete`, which run the real kubectl against it (no API
server can be installed on the test machines).

It answers what kubectl asks for: discovery (/api, /apis and the group versions
apps/v1, kubeflow.org/v1 and kubeflow.org/v2beta1; aggregated discovery is
declined by answering plain JSON, and kubectl falls back to it), GET of one
object, lists filtered by labelSelector and fieldSelector=metadata.name, a
pod's log (container, tailLines), and DELETE. The objects are shaped as the
operators write them (training-operator v1.9: pkg/apis/kubeflow.org/v1/
common_types.go and pkg/util/status.go; mpi-operator v0.8: pkg/apis/kubeflow/
v2beta1/types.go and pkg/controller/mpi_job_controller.go's defaultLabels).

Usage: kube_stand_in.py DIR
  binds 127.0.0.1 on a port the kernel picks and writes it to DIR/port;
  appends one JSON line per request to DIR/requests.jsonl:
  {"method", "path", "query"} (query: the parsed query string).
Python 3 standard library only.
"""
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NOW = time.time()


def stamp(age_s):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - age_s))


# (group, version, resource) -> kind: what the stand-in serves, every one namespaced
RESOURCES = {
    ("", "v1", "pods"): "Pod",
    ("", "v1", "services"): "Service",
    ("apps", "v1", "deployments"): "Deployment",
    ("kubeflow.org", "v1", "pytorchjobs"): "PyTorchJob",
    ("kubeflow.org", "v2beta1", "mpijobs"): "MPIJob",
}


NAMESPACES = ("default", "training")


def api_version(group, version):
    return f"{group}/{version}" if group else version


# ---- the world: what the operators and `keel k8s manifest` would have made -----

def condition(type_, status, reason, message, age_s):
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": stamp(age_s), "lastTransitionTime": stamp(age_s)}


def keel_labels(name, component, managed=True):
    labels = {"app.kubernetes.io/name": component, "app.kubernetes.io/instance": name}
    if managed:
        labels["app.kubernetes.io/managed-by"] = "keel"
    return labels


def pytorchjob(ns, name, conditions, replica_statuses):
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "labels": keel_labels(name, "keel"), "creationTimestamp": stamp(400)},
            "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {}},
            "status": {"conditions": conditions, "replicaStatuses": replica_statuses,
                       "startTime": stamp(400)}}


def mpijob(ns, name, conditions, replica_statuses):
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "labels": keel_labels(name, "keel"), "creationTimestamp": stamp(900)},
            "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {}},
            "status": {"conditions": conditions, "replicaStatuses": replica_statuses,
                       "startTime": stamp(900)}}


def pod(ns, name, labels, owner, phase, node, age_s, container, ready, restarts, waiting=None):
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {"startedAt": stamp(age_s)}}
    status = {"phase": phase, "containerStatuses": [
        {"name": container, "ready": ready, "restartCount": restarts, "state": state, "image": "keel:1"}]}
    spec = {"containers": [{"name": container, "image": "keel:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "creationTimestamp": stamp(age_s),
                         "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                              "name": owner["metadata"]["name"],
                                              "uid": owner["metadata"]["uid"], "controller": True}]},
            "spec": spec, "status": status}


def pytorch_pod(job, rtype, index, phase, node, age_s, ready=True, restarts=0, waiting=None):
    name = job["metadata"]["name"]
    # training-operator v1.9: GenLabels + replica-type (lower case) + replica-index; job-role on the master
    labels = {"training.kubeflow.org/operator-name": "pytorchjob-controller",
              "training.kubeflow.org/job-name": name,
              "training.kubeflow.org/replica-type": rtype,
              "training.kubeflow.org/replica-index": str(index)}
    if rtype == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    labels.update(keel_labels(name, "keel", managed=False))  # the template's labels (render.c's pod_labels)
    return pod(job["metadata"]["namespace"], f"{name}-{rtype}-{index}", labels, job, phase, node, age_s,
               "pytorch", ready, restarts, waiting)


def mpi_pod(job, role, podname, index, node, age_s):
    name = job["metadata"]["name"]
    # mpi-operator v0.8: defaultLabels(job, role), replica-index on workers
    labels = {"training.kubeflow.org/operator-name": "mpi-operator",
              "training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role}
    if index is not None:
        labels["training.kubeflow.org/replica-index"] = str(index)
    return pod(job["metadata"]["namespace"], podname, labels, job, "Running", node, age_s, role, True, 0)


def deployment(ns, name, labels):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"uid-{ns}-{name}"},
            "spec": {"replicas": 1}, "status": {"replicas": 1}}


def service(ns, name, labels):
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"uid-svc-{ns}-{name}"},
            "spec": {"ports": [{"name": "client", "port": 2379}]}}


def world():
    objs = []
    T = "training"
    created = condition("Created", "True", "PyTorchJobCreated", "PyTorchJob llama is created.", 400)
    llama = pytorchjob(T, "llama", [
        created,
        condition("Running", "True", "PyTorchJobRunning", "PyTorchJob training/llama is running.", 330)],
        {"Master": {"active": 1, "selector": "training.kubeflow.org/job-name=llama,"
                    "training.kubeflow.org/operator-name=pytorchjob-controller,"
                    "training.kubeflow.org/replica-type=master"},
         "Worker": {"active": 2}})
    objs += [llama,
             pytorch_pod(llama, "master", 0, "Running", "ip-10-0-1-12.ec2.internal", 330),
             pytorch_pod(llama, "worker", 0, "Running", "ip-10-0-1-13.ec2.internal", 330),
             pytorch_pod(llama, "worker", 1, "Running", "ip-10-0-1-14.ec2.internal", 330, restarts=2),
             deployment(T, "llama-etcd", keel_labels("llama", "etcd")),
             service(T, "llama-etcd", keel_labels("llama", "etcd"))]
    etcd_pod = pod(T, "llama-etcd-7d4b9c6f5-x2x9q", keel_labels("llama", "etcd", managed=False),
                   objs[-2], "Running", "ip-10-0-1-12.ec2.internal", 400, "etcd", True, 0)
    objs.append(etcd_pod)
    # the training-operator's failed job: Running set False, Failed appended (filterOutCondition)
    broken = pytorchjob(T, "broken", [
        condition("Created", "True", "PyTorchJobCreated", "PyTorchJob broken is created.", 400),
        condition("Running", "False", "PyTorchJobRunning", "PyTorchJob training/broken is running.", 300),
        condition("Failed", "True", "PyTorchJobFailed",
                  "PyTorchJob broken is failed because 1 Worker replica(s) failed.", 100)],
        {"Worker": {"failed": 1}})
    objs += [broken, pytorch_pod(broken, "worker", 0, "Failed", "ip-10-0-1-15.ec2.internal", 400, ready=False)]
    # a same-named etcd Deployment that keel did not render (no managed-by label): never deleted
    other = pytorchjob(T, "other", [created], {})
    objs += [other, deployment(T, "other-etcd", {"app": "etcd"}),
             service(T, "other-etcd", keel_labels("other", "etcd"))]
    # another keel job and its etcd: never touched by a delete of llama
    llama2 = pytorchjob(T, "llama2", [created], {})
    objs += [llama2, deployment(T, "llama2-etcd", keel_labels("llama2", "etcd")),
             service(T, "llama2-etcd", keel_labels("llama2", "etcd"))]
    # keel's labels for llama in another namespace: out of a delete's namespace
    objs += [deployment("default", "llama-etcd", keel_labels("llama", "etcd"))]
    mpi = mpijob(T, "mpi", [
        condition("Created", "True", "MPIJobCreated", "MPIJob training/mpi is created.", 900),
        condition("Running", "True", "MPIJobRunning", "MPIJob training/mpi is running.", 880)],
        {"Launcher": {"active": 1}, "Worker": {"active": 2}})
    objs += [mpi, mpi_pod(mpi, "launcher", "mpi-launcher-q8z4k", None, "ip-10-0-2-10.ec2.internal", 880),
             mpi_pod(mpi, "worker", "mpi-worker-0", 0, "ip-10-0-2-11.ec2.internal", 890),
             mpi_pod(mpi, "worker", "mpi-worker-1", 1, "ip-10-0-2-12.ec2.internal", 890)]
    # the current namespace's job, just created: its pods wait for their image
    tiny = pytorchjob("default", "tiny", [
        condition("Created", "True", "PyTorchJobCreated", "PyTorchJob tiny is created.", 20)],
        {"Master": {}, "Worker": {}})
    objs += [tiny, pytorch_pod(tiny, "master", 0, "Pending", None, 20, ready=False, waiting="ContainerCreating"),
             pytorch_pod(tiny, "worker", 0, "Pending", None, 20, ready=False, waiting="ContainerCreating")]
    return objs


def resource_of(obj):
    group, _, version = obj["apiVersion"].rpartition("/")
    for (g, v, res), kind in RESOURCES.items():
        if g == group and v == version and kind == obj["kind"]:
            return res
    raise KeyError(obj["kind"])


LOGS = {  # a pod's container log, as its container printed it
    "llama-master-0": "keel agent: round 0: 3 nodes\nstep 1 loss 10.37\nstep 2 loss 9.81\n",
    "llama-worker-0": "keel agent: round 0: 3 nodes\n",
    "llama-worker-1": "keel agent: round 0: 3 nodes\nkeel agent: rank 2 restarted\n",
    "mpi-launcher-q8z4k": "keel: train: 3 ranks\nstep 1 loss 10.37\n",
    "mpi-worker-0": "Server listening on 0.0.0.0 port 22.\n",
    "mpi-worker-1": "Server listening on 0.0.0.0 port 22.\n",
}


# ---- the server ------------------------------------------------------------------

def selector_matches(selector, labels):
    """labelSelector of equality terms (k=v, k==v, k!=v), comma-separated."""
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
    return True


def field_matches(selector, obj):
    for term in filter(None, (selector or "").split(",")):
        k, v = term.replace("==", "=").split("=", 1)
        if k == "metadata.name" and obj["metadata"]["name"] != v:
            return False
        if k == "metadata.namespace" and obj["metadata"]["namespace"] != v:
            return False
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the request log is requests.jsonl
        pass

    def send(self, code, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code, reason, message, details=None):
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}
        if details:
            body["details"] = details
        self.send(code, body)

    def record(self):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        with self.server.lock, open(os.path.join(self.server.dir, "requests.jsonl"), "a") as f:
            f.write(json.dumps({"method": self.command, "path": url.path, "query": query}) + "\n")
        return url.path.rstrip("/"), query

    def discovery(self, path):
        port = self.server.server_address[1]
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}]}
        if path == "/apis":
            groups = {}
            for (g, v, _res) in RESOURCES:
                if g:
                    groups.setdefault(g, []).append(v)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()]}
        if path == "/version":
            return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-keel-stand-in", "platform": "linux/amd64"}
        for (g, v, res), kind in RESOURCES.items():
            if path == ("/api/" if not g else f"/apis/{g}/") + v:
                resources = [{"name": r, "singularName": k.lower(), "namespaced": True, "kind": k,
                              "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                                        "watch"]}
                             for (g2, v2, r), k in RESOURCES.items() if (g2, v2) == (g, v)]
                if res == "pods":
                    resources.append({"name": "namespaces", "singularName": "namespace", "namespaced": False,
                                      "kind": "Namespace", "verbs": ["get", "list"]})
                    resources.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
                                      "verbs": ["get"]})
                return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version(g, v),
                        "resources": resources}
        return None

    def route(self, path):
        """(group, version, resource, namespace, name, subresource) of an object path, or None."""
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if len(rest) < 3 or rest[0] != "namespaces":
            return None
        ns, res = rest[1], rest[2]
        name = rest[3] if len(rest) > 3 else None
        sub = rest[4] if len(rest) > 4 else None
        if (group, version, res) not in RESOURCES or len(rest) > 5:
            return None
        return group, version, res, ns, name, sub

    def do_GET(self):
        path, query = self.record()
        doc = self.discovery(path)
        if doc is not None:
            return self.send(200, doc)
        if path.startswith("/api/v1/namespaces/") and path.count("/") == 4:  # kubectl's check after a NotFound
            ns = path.rsplit("/", 1)[1]
            if ns in NAMESPACES:
                return self.send(200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                                       "status": {"phase": "Active"}})
            return self.status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        r = self.route(path)
        if r is None:
            return self.status(404, "NotFound", "the server could not find the requested resource")
        group, version, res, ns, name, sub = r
        with self.server.lock:
            objs = list(self.server.objects)
        if name is None:
            if query.get("watch") in ("true", "1"):
                return self.status(405, "MethodNotAllowed", "the stand-in does not watch")
            items = [o for o in objs if resource_of(o) == res and o["apiVersion"] == api_version(group, version)
                     and o["metadata"]["namespace"] == ns
                     and selector_matches(query.get("labelSelector"), o["metadata"].get("labels", {}))
                     and field_matches(query.get("fieldSelector"), o)]
            kind = RESOURCES[(group, version, res)]
            return self.send(200, {"kind": kind + "List", "apiVersion": api_version(group, version),
                                   "metadata": {"resourceVersion": "7"}, "items": items})
        found = [o for o in objs if resource_of(o) == res and o["metadata"]["namespace"] == ns
                 and o["metadata"]["name"] == name]
        if not found:
            return self.status(404, "NotFound", f'{res}{"." + group if group else ""} "{name}" not found',
                               {"name": name, "group": group, "kind": res})
        if sub == "log":
            container = query.get("container")
            names = [c["name"] for c in found[0]["spec"]["containers"]]
            if container and container not in names:
                return self.status(400, "BadRequest", f"container {container} is not valid for pod {name}")
            lines = LOGS.get(name, "").splitlines(keepends=True)
            if "tailLines" in query:
                lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) > 0 else []
            return self.send(200, "".join(lines), "text/plain")
        if sub is not None:
            return self.status(404, "NotFound", "the server could not find the requested resource")
        return self.send(200, found[0])

    def do_DELETE(self):
        path, _query = self.record()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        r = self.route(path)
        if r is None or r[4] is None or r[5] is not None:
            return self.status(405, "MethodNotAllowed", "the stand-in deletes one object at a time")
        group, version, res, ns, name, _sub = r
        with self.server.lock:
            gone = [o for o in self.server.objects if resource_of(o) == res and o["metadata"]["namespace"] == ns
                    and o["metadata"]["name"] == name]
            for o in gone:
                self.server.objects.remove(o)
        if gone:
            return self.send(200, gone[0])
        return self.status(404, "NotFound", f'{res}{"." + group if group else ""} "{name}" not found',
                           {"name": name, "group": group, "kind": res})

    def refuse(self):
        self.record()
        self.status(405, "MethodNotAllowed", "the stand-in only reads and deletes")

    do_POST = do_PUT = do_PATCH = refuse


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.dir = sys.argv[1]
    server.objects = world()
    server.lock = threading.Lock()  # kubectl asks several things at once (discovery)
    with open(os.path.join(server.dir, "port.tmp"), "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(os.path.join(server.dir, "port.tmp"), os.path.join(server.dir, "port"))
    server.serve_forever()


if __name__ == "__main__":
    main()
