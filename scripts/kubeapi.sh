#!/usr/bin/env bash
# Builds a real Kubernetes API server and etcd for the end-to-end tests
# (TestKubernetes* in e2e), from the versions testutil/kubeapi/go.mod
# pins, once per version: into $SLUICE_KUBEAPI_CACHE (default
# ~/.cache/sluice/kubeapi)/VERSION, outside the repository. Prints that
# directory; the tests find the binaries through SLUICE_KUBEAPI_BIN.
#
#   export SLUICE_KUBEAPI_BIN=$(scripts/kubeapi.sh)
set -euo pipefail
cd "$(dirname "$0")/../testutil/kubeapi"
k8s=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
cache="${SLUICE_KUBEAPI_CACHE:-$HOME/.cache/sluice/kubeapi}"
dir="$cache/$k8s-etcd$etcd"
# One build at a time: `make test` starts one in the background
# (scripts/beside.sh), and `make test-kubernetes` waits for it rather
# than building beside it.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ ! -x "$dir/kube-apiserver" || ! -x "$dir/etcd" ]]; then
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
	echo "kubeapi: building kube-apiserver $k8s and etcd $etcd (minutes, once)" >&2
	go build -o "$dir.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -o "$dir.tmp/etcd" go.etcd.io/etcd/server/v3
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
fi
echo "$dir"
