//go:build tools

// The components the lifecycle tests run. Importing them here keeps every module they need in
// go.sum (`go mod tidy`); the build tag keeps this file out of every build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
