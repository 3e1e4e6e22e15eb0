"""Events about a DSV4Deployment: one per decision, repeats counted on the first.

Kubernetes' own recorder (client-go `tools/record`) does not create a second Event for one
it has just recorded: an Event with the same source, object, type, reason and message
increments the existing one's `count` and moves its `lastTimestamp` (`kubectl get events`
then shows "x3 over 5m").  This recorder keeps that series rule, so a condition that recurs
— drift repaired again and again, a control refused twice — is one Event with a count, not a
stream of copies.  The memory of recent Events is per process and bounded; an Event that
expired meanwhile (the API server keeps them an hour) is created again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.times import stamp
from dsv4_operator.kube.client import ApiError

log = logging.getLogger("dsv4_operator.events")

SOURCE = "dsv4-operator"
MESSAGE_MAX = 1024
REMEMBERED = 4096  # recent series kept (client-go's LRU holds 4096 as well)
SeriesKey = tuple[str, str, str, str, str]  # (uid, namespace, type, reason, message)


class EventRecorder:
    def __init__(self, kube: Any, clock: Callable[[], dt.datetime]) -> None:
        self.kube = kube
        self.clock = clock
        self._lock = threading.Lock()
        self._series: OrderedDict[SeriesKey, tuple[str, int]] = OrderedDict()

    def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """One Event about ``obj``, or one more occurrence of the same one."""
        meta = obj["metadata"]
        message = message[:MESSAGE_MAX]
        key = (meta["uid"], meta["namespace"], kind, reason, message)
        at = stamp(self.clock())
        with self._lock:
            seen = self._series.pop(key, None)
        if seen is not None:
            name, count = seen
            try:
                self.kube.patch_merge(
                    "Event", meta["namespace"], name, {"count": count + 1, "lastTimestamp": at}
                )
                self._remember(key, name, count + 1)
                return
            except ApiError as err:
                if err.status != 404:
                    raise
                log.info("event %s expired; recording it anew", name)
        created = self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "type": kind,
                "reason": reason,
                "message": message,
                "source": {"component": SOURCE},
                "firstTimestamp": at,
                "lastTimestamp": at,
                "count": 1,
            }
        )
        self._remember(key, created["metadata"]["name"], 1)

    def _remember(self, key: SeriesKey, name: str, count: int) -> None:
        with self._lock:
            self._series[key] = (name, count)
            while len(self._series) > REMEMBERED:
                self._series.popitem(last=False)
