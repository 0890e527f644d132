"""tests/k8s/check_manifests.py: are `keel k8s manifest`'s YAML documents what the
cluster would admit? Each document is checked against the published reference for
its kind:

- kubeflow.org/v1 PyTorchJob and kubeflow.org/v2beta1 MPIJob: the CRD's
  openAPIV3Schema (tests/k8s/crds/, verbatim upstream files) with jsonschema, with
  `additionalProperties: false` added to every object schema that lists its
  properties (the API server prunes unknown fields silently; here a misspelled
  field is an error), `x-kubernetes-int-or-string` read as integer-or-string; then
  the operators' admission rules, transcribed from their Go sources (see
  tests/k8s/crds/README.md);
- apps/v1 Deployment, v1 Service, and every pod template inside the jobs: the
  `kubernetes` Python client's generated models (a round trip through them must
  give back the same object: a field they do not know is dropped, and that is a
  difference), plus the core API rules keel's objects touch (DNS names, port
  names, mounts naming volumes, the Deployment's selector matching its pods).

Usage: check_manifests.py CRD_DIR FILE.yaml...   (exit 1 listing every problem)
"""
import copy
import gzip
import os
import re
import sys

import jsonschema
import yaml
from kubernetes import client as k8s_client

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def dns1035(name):
    return len(name) <= 63 and bool(DNS1035_LABEL.match(name))


def dns1123(name):
    return len(name) <= 63 and bool(DNS1123_LABEL.match(name))


# ---- the CRDs' schemas ---------------------------------------------------------------------------

def strict(schema):
    """The schema with every object that lists its properties closed to others, and
    int-or-string nodes typed as either."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def load_crds(crd_dir):
    """{(apiVersion, kind): strict openAPIV3Schema} for every served version of every CRD file."""
    schemas = {}
    for f in sorted(os.listdir(crd_dir)):
        if not f.endswith(".yaml.gz"):
            continue
        crd = yaml.safe_load(gzip.open(os.path.join(crd_dir, f), "rt", encoding="utf-8"))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                schemas[(f"{group}/{v['name']}", kind)] = strict(v["schema"]["openAPIV3Schema"])
    return schemas


def schema_errors(doc, schema):
    v = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


# ---- the core API through the kubernetes client's models ----------------------------------------

API = k8s_client.ApiClient()


def round_trip(obj, model):
    """Problems of obj as the client's model `model` (V1Deployment, V1PodTemplateSpec, ...)."""
    try:
        typed = API._ApiClient__deserialize(copy.deepcopy(obj), model)
    except (ValueError, TypeError) as e:  # a required field missing, a wrong type
        return [f"{model}: {e}"]
    back = API.sanitize_for_serialization(typed)
    return [f"{model}: {d}" for d in diff(obj, back, "")]


def diff(a, b, at):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in a:
            if k not in b:
                out.append(f"{at}{k}: not a field of the model (misspelled, or in the wrong place)")
            else:
                out += diff(a[k], b[k], f"{at}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{at}{i}.")]
    return [] if a == b else [f"{at.rstrip('.')}: {a!r} came back as {b!r}"]


def metadata_errors(meta, what):
    errs = []
    extra = set(meta) - {"name", "namespace", "labels", "annotations"}
    if extra:
        errs.append(f"{what}.metadata: unexpected keys {sorted(extra)}")
    if "namespace" in meta and not dns1123(meta["namespace"]):
        errs.append(f"{what}.metadata.namespace: {meta['namespace']!r} is not a DNS-1123 label")
    for k, v in (meta.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            errs.append(f"{what}.metadata.labels[{k}]: {v!r} is not a label value")
    return errs


def pod_errors(spec, what):
    """The core API's rules for what keel puts in a pod spec."""
    errs = []
    volumes = [v["name"] for v in spec.get("volumes") or []]
    for v in spec.get("volumes") or []:
        if not dns1123(v["name"]):
            errs.append(f"{what}.volumes: {v['name']!r} is not a DNS-1123 label")
        ed = v.get("emptyDir")
        if ed is not None and ed.get("medium", "") not in ("", "Memory", "HugePages"):
            errs.append(f"{what}.volumes[{v['name']}].emptyDir.medium: {ed['medium']!r}")
        pvc = v.get("persistentVolumeClaim")
        if pvc is not None and not DNS1123_SUBDOMAIN.match(pvc.get("claimName", "")):
            errs.append(f"{what}.volumes[{v['name']}]: claimName {pvc.get('claimName')!r} is not a DNS-1123 subdomain")
    if len(set(volumes)) != len(volumes):
        errs.append(f"{what}.volumes: a name twice: {volumes}")
    names = [c["name"] for c in spec.get("containers") or []]
    if not names or len(set(names)) != len(names):
        errs.append(f"{what}.containers: want one or more, uniquely named: {names}")
    for c in spec.get("containers") or []:
        cw = f"{what}.containers[{c['name']}]"
        if not dns1123(c["name"]):
            errs.append(f"{cw}: name is not a DNS-1123 label")
        if not c.get("image"):
            errs.append(f"{cw}: no image")
        for p in c.get("ports") or []:
            if "name" in p and (len(p["name"]) > 15 or not IANA_SVC_NAME.match(p["name"])
                                or not re.search("[a-z]", p["name"])):
                errs.append(f"{cw}.ports: {p['name']!r} is not an IANA service name (at most 15)")
            if not 1 <= p.get("containerPort", 0) <= 65535:
                errs.append(f"{cw}.ports: containerPort {p.get('containerPort')!r}")
        for e in c.get("env") or []:
            if not ENV_NAME.match(e["name"]):
                errs.append(f"{cw}.env: {e['name']!r} is not an environment variable name")
        mounts = [m["mountPath"] for m in c.get("volumeMounts") or []]
        if len(set(mounts)) != len(mounts):
            errs.append(f"{cw}.volumeMounts: a path twice: {mounts}")
        for m in c.get("volumeMounts") or []:
            if m["name"] not in volumes:
                errs.append(f"{cw}.volumeMounts: {m['name']!r} names no volume of the pod")
            if not m["mountPath"].startswith("/"):
                errs.append(f"{cw}.volumeMounts: {m['mountPath']!r} is not absolute")
        lim = (c.get("resources") or {}).get("limits") or {}
        for k, v in lim.items():
            if not re.match(r"^[0-9]+$", str(v)):
                errs.append(f"{cw}.resources.limits[{k}]: {v!r} is not a whole quantity")
    return errs


def template_errors(template, what):
    errs = round_trip(template, "V1PodTemplateSpec")
    errs += metadata_errors(template.get("metadata") or {}, what)
    return errs + pod_errors(template.get("spec") or {}, f"{what}.spec")


# ---- the operators' admission rules ---------------------------------------------------------------

def pytorchjob_rules(job):
    """training-operator v1.9.0 pkg/webhooks/pytorch/pytorchjob_webhook.go, pkg/common/util/webhooks.go"""
    errs = []
    name, spec = job["metadata"].get("name", ""), job.get("spec") or {}
    if not dns1035(name):
        errs.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    manager = (spec.get("runPolicy") or {}).get("managedBy")
    if manager is not None and manager not in ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"):
        errs.append(f"spec.runPolicy.managedBy: {manager!r} not supported")
    replicas = spec.get("pytorchReplicaSpecs")
    if "elasticPolicy" in spec:
        if "Worker" not in (replicas or {}):
            errs.append("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
        if "nProcPerNode" in spec["elasticPolicy"] and "nprocPerNode" in spec:
            errs.append("spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode")
    backend = (spec.get("elasticPolicy") or {}).get("rdzvBackend")
    if backend is not None and backend not in ("c10d", "etcd", "etcd-v2"):
        # not the webhook's: the rendezvous backends torch elastic has (PET_RDZV_BACKEND)
        errs.append(f"spec.elasticPolicy.rdzvBackend: {backend!r} is not c10d, etcd or etcd-v2")
    if replicas is None:
        errs.append("spec.pytorchReplicaSpecs: must be required")
    for rtype, r in (replicas or {}).items():
        at = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            errs.append(f"{at}: not a supported replica type (Master, Worker)")
        containers = (((r or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            errs.append(f"{at}.template.spec.containers: must be specified")
        for i, c in enumerate(containers):
            if not c.get("image"):
                errs.append(f"{at}.template.spec.containers[{i}].image: must be required")
        if not any(c.get("name") == "pytorch" for c in containers):
            errs.append(f"{at}.template.spec.containers: must have at least one container with name pytorch")
        if rtype == "Master" and (r or {}).get("replicas") != 1:
            errs.append(f"{at}.replicas: must be 1")
        elif rtype != "Master" and (r or {}).get("replicas") is not None and r["replicas"] < 1:
            errs.append(f"{at}.replicas: must be at least 1")
    return errs


def mpijob_rules(job):
    """mpi-operator pkg/apis/kubeflow/validation/validation.go (v2beta1)"""
    errs = []
    spec = job.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs")
    worker = (replicas or {}).get("Worker") or {}
    n = worker.get("replicas") if (worker.get("replicas") or 0) > 0 else 1
    host = f"{job['metadata'].get('name', '')}-worker-{n - 1}"
    if not dns1035(host):
        errs.append(f"metadata.name: pod hostname {host!r} would not be a DNS-1035 label")
    if spec.get("slotsPerWorker") is None:
        errs.append("spec.slotsPerWorker: must have number of slots per worker")
    elif spec["slotsPerWorker"] < 0:
        errs.append("spec.slotsPerWorker: must be non-negative")
    policy = spec.get("runPolicy") or {}
    if policy.get("cleanPodPolicy") not in ("None", "Running", "All"):
        errs.append(f"spec.runPolicy.cleanPodPolicy: {policy.get('cleanPodPolicy')!r} (must have None, Running or All)")
    for k in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(k) is not None and policy[k] < 0:
            errs.append(f"spec.runPolicy.{k}: must be non-negative")
    if policy.get("managedBy") is not None and policy["managedBy"] not in ("kubeflow.org/mpi-operator",
                                                                            "kueue.x-k8s.io/multikueue"):
        errs.append(f"spec.runPolicy.managedBy: {policy['managedBy']!r} not supported")
    if not spec.get("sshAuthMountPath"):
        errs.append("spec.sshAuthMountPath: must have a mount path for SSH credentials")
    if spec.get("mpiImplementation") not in ("OpenMPI", "Intel", "MPICH"):
        errs.append(f"spec.mpiImplementation: {spec.get('mpiImplementation')!r} not supported")
    if replicas is None:
        return errs + ["spec.mpiReplicaSpecs: must have replica specs"]
    for rtype in ("Launcher", "Worker"):
        r = replicas.get(rtype)
        at = f"spec.mpiReplicaSpecs[{rtype}]"
        if r is None:
            if rtype == "Launcher":
                errs.append(f"{at}: must have Launcher replica spec")
            continue
        if r.get("replicas") is None:
            errs.append(f"{at}.replicas: must define number of replicas")
        if r.get("restartPolicy") not in ("Never", "OnFailure"):
            errs.append(f"{at}.restartPolicy: {r.get('restartPolicy')!r} not supported (Never, OnFailure)")
        if not ((r.get("template") or {}).get("spec") or {}).get("containers"):
            errs.append(f"{at}.template.spec.containers: must define at least one container")
        if rtype == "Launcher" and r.get("replicas") not in (None, 1):
            errs.append(f"{at}.replicas: must be 1")
        if rtype == "Worker" and r.get("replicas") is not None and r["replicas"] <= 0:
            errs.append(f"{at}.replicas: must be greater than or equal to 1")
    return errs


# ---- one document --------------------------------------------------------------------------------

def job_errors(doc, schemas):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in schemas:
        return [f"no served CRD version for apiVersion {key[0]!r} kind {key[1]!r} (have {sorted(schemas)})"]
    errs = schema_errors(doc, schemas[key]) + metadata_errors(doc.get("metadata") or {}, "job")
    if errs:
        return errs  # the rules below read the fields the schema vouched for
    is_pytorch = key[1] == "PyTorchJob"
    errs = pytorchjob_rules(doc) if is_pytorch else mpijob_rules(doc)
    specs = doc["spec"]["pytorchReplicaSpecs" if is_pytorch else "mpiReplicaSpecs"]
    for rtype, r in specs.items():
        errs += template_errors(r["template"], f"{rtype}.template")
    return errs


def deployment_errors(doc):
    errs = round_trip(doc, "V1Deployment") + metadata_errors(doc["metadata"], "deployment")
    if not dns1123(doc["metadata"].get("name", "")):
        errs.append("deployment: name is not a DNS-1123 label")
    spec = doc.get("spec") or {}
    want = (spec.get("selector") or {}).get("matchLabels") or {}
    have = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not want or any(have.get(k) != v for k, v in want.items()):
        errs.append(f"deployment: selector {want} does not match the template's labels {have}")
    return errs + template_errors(spec.get("template") or {}, "deployment.template")


def service_errors(doc, pod_labels):
    errs = round_trip(doc, "V1Service") + metadata_errors(doc["metadata"], "service")
    if not dns1035(doc["metadata"].get("name", "")):
        errs.append("service: name is not a DNS-1035 label")
    selector = (doc.get("spec") or {}).get("selector") or {}
    if not any(all(labels.get(k) == v for k, v in selector.items()) for labels in pod_labels):
        errs.append(f"service: selector {selector} selects none of the Deployments' pods")
    for p in (doc.get("spec") or {}).get("ports") or []:
        if p.get("protocol") not in ("TCP", "UDP", "SCTP") or not 1 <= p.get("port", 0) <= 65535:
            errs.append(f"service: port {p}")
    return errs


def check(docs, schemas):
    errs, pod_labels = [], []
    for d in docs:
        if d.get("kind") == "Deployment":
            pod_labels.append(((d.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {})
    for i, d in enumerate(docs):
        kind = d.get("kind") if isinstance(d, dict) else None
        if kind == "Deployment" and d.get("apiVersion") == "apps/v1":
            e = deployment_errors(d)
        elif kind == "Service" and d.get("apiVersion") == "v1":
            e = service_errors(d, pod_labels)
        elif isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("kubeflow.org/"):
            e = job_errors(d, schemas)
        else:
            e = [f"an object keel does not render: apiVersion {d.get('apiVersion') if isinstance(d, dict) else d!r}"]
        errs += [f"document {i} ({kind}): {x}" for x in e]
    return errs


def main():
    schemas = load_crds(sys.argv[1])
    bad = 0
    for f in sys.argv[2:]:
        docs = [d for d in yaml.safe_load_all(open(f, encoding="utf-8")) if d is not None]
        errs = check(docs, schemas) if docs else ["no documents"]
        for e in errs:
            print(f"{f}: {e}")
        bad += bool(errs)
        if not errs:
            print(f"{f}: ok ({', '.join(d['kind'] for d in docs)})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
