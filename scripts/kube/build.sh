#!/usr/bin/env bash
# Builds the live-cluster suite's Kubernetes binaries from the Go module proxy,
# once: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (v1.34.4,
# version-stamped so helm's kubeVersion checks pass), etcd, helm, CoreDNS and
# kube-router (its NetworkPolicy firewall enforces the chart's policies), Kueue, and
# the suite's stand-in DRA kubelet plugin (scripts/kube/dra-plugin). Everything
# (binaries, Go module cache, Go build cache) lives under one cache folder keyed by
# the versions, so a second run (or a fresh clone on the same machine) does nothing.
#
#   scripts/kube/build.sh            # prints the bin folder on its last line
#   GPULAB_KUBE_CACHE=/srv/cache scripts/kube/build.sh
#
# Why 1.34: machines here mount cgroup v1, which later kubelets refuse by default.
set -euo pipefail
# Before any cd below: $0 may be a relative path (make runs scripts/kube/build.sh).
HERE="$(cd "$(dirname "$0")" && pwd)"

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
# v2.1.0: the newest kube-router/v2 release the Go module proxy serves (later tags are refused).
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
# v0.14.0: the Kueue release the Go module proxy serves that is built on k8s.io v0.34
# (v0.13.x and v0.14.1+ are refused; v0.17.0 is served but built for later libraries).
KUEUE_VERSION=${KUEUE_VERSION:-v0.14.0}
CACHE=${GPULAB_KUBE_CACHE:-$HOME/.cache/gpulab-kube}
BIN="$CACHE/bin-k8s$K8S_VERSION-etcd$ETCD_VERSION-helm$HELM_VERSION-coredns$COREDNS_VERSION"
WORK="$CACHE/work-k8s$K8S_VERSION"

export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOPATH="$CACHE/go/path"
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=0
command -v go >/dev/null || { echo "build.sh: no 'go' on PATH; install Go >= 1.24 (https://go.dev/dl)" >&2; exit 1; }
mkdir -p "$BIN" "$WORK"

# The module proxy can break off a download: each go command that fetches is tried
# three times (what it fetched is kept in the module cache).
retry() { local i; for i in 1 2 3; do "$@" && return 0; [ $i = 3 ] || { log "failed (try $i of 3): $*"; sleep 10; }; done; return 1; }
log() { printf '[kube-bins %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
T0=$(date +%s)

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
staging="v0.${K8S_VERSION#v1.}"
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

kube_missing=""
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  [ -x "$BIN/$c" ] || kube_missing="$kube_missing $c"
done
if [ -n "$kube_missing" ]; then
  cd "$WORK"
  if [ ! -f go.sum ]; then
    log "module for k8s.io/kubernetes $K8S_VERSION (staging modules at $staging)"
    cat > go.mod <<MOD
module gpulab.local/kubebins

go 1.24

require k8s.io/kubernetes $K8S_VERSION
MOD
    cat > tools.go <<'GO'
//go:build tools

package kubebins

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
    # k8s.io/kubernetes replaces its staging modules with ./staging/src paths; a
    # module that requires it must pin each to the published v0.x release instead.
    retry go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
    modfile="$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
    for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#\1#p' "$modfile"); do
      echo "replace $m => $m $staging" >> go.mod
    done
    retry go mod tidy
  elif ! grep -q cmd/kube-proxy tools.go; then
    # A module from before kube-proxy (Services' cluster IPs) was built: add its packages.
    sed -i 's#^\t_ "k8s.io/kubernetes/cmd/kubelet"$#&\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"#' tools.go
    retry go mod tidy
  fi
  for c in $kube_missing; do
    log "go build $c"
    retry go build -trimpath -ldflags "$LDFLAGS" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$BIN/$c.tmp" "$BIN/$c"
  done
fi

if [ ! -x "$BIN/etcd" ]; then
  log "go build etcd $ETCD_VERSION"
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  [ -f go.mod ] || { printf 'module gpulab.local/etcdbin\n\ngo 1.24\n' > go.mod; go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"; }
  retry go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi

if [ ! -x "$BIN/helm" ]; then
  log "go install helm $HELM_VERSION"
  GOBIN="$WORK/helm-bin" retry go install -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  mv "$WORK/helm-bin/helm" "$BIN/helm"
fi

# Cluster DNS (a job's pods find index 0 by name): CoreDNS with only the plugins
# the suite's Corefile uses, as CoreDNS documents for a custom build (its module's
# other plugins, cloud DNS providers among them, are not compiled).
if [ ! -x "$BIN/coredns" ]; then
  log "go build coredns $COREDNS_VERSION (kubernetes, errors, log, health, ready)"
  mkdir -p "$WORK/coredns" && cd "$WORK/coredns"
  if [ ! -f go.sum ]; then
    printf 'module gpulab.local/corednsbin\n\ngo 1.24\n' > go.mod
    cat > main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"errors", "log", "health", "ready", "kubernetes"}
}

func main() { coremain.Run() }
GO
    go get "github.com/coredns/coredns@$COREDNS_VERSION"
    retry go mod tidy
  fi
  retry go build -trimpath -ldflags "-s -w" -o "$BIN/coredns.tmp" .
  mv "$BIN/coredns.tmp" "$BIN/coredns"
fi

# NetworkPolicy enforcement for the live cluster's node: kube-router, run with only its
# firewall (--run-firewall=true --run-router=false --run-service-proxy=false). A plain
# module (no replace directives), so `go install pkg@version` builds it (~7 min cold).
if [ ! -x "$BIN/kube-router" ]; then
  log "go install kube-router $KUBE_ROUTER_VERSION"
  GOBIN="$WORK/kube-router-bin" retry go install -trimpath -ldflags "-s -w \
    -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  mv "$WORK/kube-router-bin/kube-router" "$BIN/kube-router"
fi

# The stand-in DRA kubelet plugin (scripts/kube/dra-plugin/main.go, on
# k8s.io/dynamic-resource-allocation's kubeletplugin helper): the simulated GPUs'
# claims are prepared, so their pods start. Rebuilt when its source changes.
PLUGIN_SRC="$HERE/dra-plugin/main.go"
if [ ! -x "$BIN/gpulab-dra-plugin" ] || [ "$PLUGIN_SRC" -nt "$BIN/gpulab-dra-plugin" ]; then
  log "go build gpulab-dra-plugin (k8s.io/dynamic-resource-allocation $staging)"
  mkdir -p "$WORK/dra-plugin" && cd "$WORK/dra-plugin"
  cp "$PLUGIN_SRC" main.go
  if [ ! -f go.sum ]; then
    printf 'module gpulab.local/draplugin\n\ngo 1.24\n\nrequire k8s.io/dynamic-resource-allocation %s\n' "$staging" > go.mod
    retry go mod tidy
  fi
  retry go build -trimpath -ldflags "-s -w" -o "$BIN/gpulab-dra-plugin.tmp" .
  mv "$BIN/gpulab-dra-plugin.tmp" "$BIN/gpulab-dra-plugin"
fi

# Kueue (quota, admission and preemption of the Kubernetes backend's Jobs): its
# controller manager, with the module's CRDs (config/components/crd/bases) and the
# manager's ClusterRole (config/components/rbac/role.yaml) copied beside it. A plain
# module (no replace directives), so `go install` builds it (14 min cold here, load 10).
KUEUE_MOD="$GOMODCACHE/sigs.k8s.io/kueue@$KUEUE_VERSION"
if [ ! -x "$BIN/kueue-$KUEUE_VERSION" ]; then
  log "go install kueue $KUEUE_VERSION"
  GOBIN="$WORK/kueue-bin" retry go install -trimpath -ldflags "-s -w \
    -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  mv "$WORK/kueue-bin/kueue" "$BIN/kueue-$KUEUE_VERSION"
fi
if [ ! -f "$BIN/kueue-role-$KUEUE_VERSION.yaml" ]; then
  [ -d "$KUEUE_MOD" ] || retry go mod download "sigs.k8s.io/kueue@$KUEUE_VERSION"
  rm -rf "$BIN/kueue-crds-$KUEUE_VERSION"
  cp -r "$KUEUE_MOD/config/components/crd/bases" "$BIN/kueue-crds-$KUEUE_VERSION"
  chmod -R u+w "$BIN/kueue-crds-$KUEUE_VERSION"
  cp "$KUEUE_MOD/config/components/rbac/role.yaml" "$BIN/kueue-role-$KUEUE_VERSION.yaml"
  chmod u+w "$BIN/kueue-role-$KUEUE_VERSION.yaml"
fi

log "done in $(( $(date +%s) - T0 )) s"
echo "$BIN"
