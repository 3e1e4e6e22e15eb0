//go:build tools

// Package gotools names the programs of this module's go.mod, so that `go mod tidy` keeps
// what they need; hack/build-control-plane.sh and hack/build-lws.sh build them.
package gotools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
	_ "sigs.k8s.io/lws/cmd"
)
