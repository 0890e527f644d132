#!/bin/bash
# Runs once on every node of `keel cluster up examples/cluster-local.json`,
# before its daemons start, like a HyperPod lifecycle script's on_create.sh:
# in the node's own namespaces (its hostname, /tmp and /dev/shm), with
# KEEL_NODE_NAME, KEEL_NODE_ROLE, KEEL_INSTANCE_GROUP, KEEL_CLUSTER_NAME and
# KEEL_CLUSTER_SHARED set. A non-zero exit fails `up` (and takes it down).
set -euo pipefail
echo "on_create: $KEEL_NODE_NAME ($KEEL_NODE_ROLE in $KEEL_INSTANCE_GROUP) of $KEEL_CLUSTER_NAME"
# the node-local directory the health checks probe (HealthCheck.dir)
mkdir -p /tmp/keel-local
if [ "$KEEL_NODE_ROLE" = controller ]; then
  mkdir -p "$KEEL_CLUSTER_SHARED/runs"
fi
