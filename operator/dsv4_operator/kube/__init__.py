"""The Kubernetes API as the operator reaches it: the one client (`client`), the watch-fed
caches a pass reads (`cache`, filled by `informer`) and the selectors they match in memory
(`selectors`).  Infrastructure under both `reconcile` and `rollout`; it imports neither."""
