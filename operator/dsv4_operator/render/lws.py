"""The LeaderWorkerSet API (kubernetes-sigs/lws, leaderworkerset.x-k8s.io/v1) as the operator
uses it: what multi-node roles are rendered to, and the labels LWS puts on a group's pods
(sigs.k8s.io/lws api/leaderworkerset/v1, checked against the real controller by the e2e
tests)."""

from __future__ import annotations

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_API_VERSION = f"{LWS_GROUP}/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
# On every pod of a set: the LeaderWorkerSet's name.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# On every pod of one group, unique per group (a hash of the leader pod's namespace/name).
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
# The group's index (= replica) and the pod's place in it (0: the leader).
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
