#!/usr/bin/env bash
# Build the end-to-end tier's binaries from the Go modules under e2e/tools/ (one module per tool,
# each pinned by its go.mod and go.sum) into a cache outside the clone:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/cloudstation-e2e/<tool>-<key>/bin
# The key hashes the tool's module files and `go version`, so an unchanged tool is never rebuilt.
# Prints one line per tool with its wall time, and last the PATH entries to use:
#   bash e2e/build-tools.sh [tool ...]        (default: every tool)
set -euo pipefail
cd "$(dirname "$0")/tools"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/cloudstation-e2e"
mkdir -p "$cache"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

builder() {  # the function that builds a tool
  case "$1" in kubernetes-*) echo build_kubernetes ;; pulumi-kubernetes) echo build_pulumi_kubernetes ;; *) echo "build_$1" ;; esac
}

key() {  # the tool's module files, how it is built and the Go toolchain
  { go version; declare -f "$(builder "$1")" kube_version_flags module_dir; find "$1" -type f | LC_ALL=C sort | xargs sha256sum; } \
    | sha256sum | cut -c1-12
}

# -X flags that make a Kubernetes binary report its release (without them the API server says
# v0.0.0, and pulumi-kubernetes refuses the cluster).
kube_version_flags() {
  local v="$1" minor
  minor="$(echo "$v" | cut -d. -f2)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$v" "$pkg" "$pkg" "$minor" "$pkg"
  done
}

module_dir() {  # $1 wrapper module, $2 a module it requires: its directory in the module cache
  # `go list -m` names a directory only once the module is downloaded (empty on a fresh machine).
  (cd "$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}

build_kubernetes() {  # $1 module dir, $2 out
  local v
  v="$(awk '/^require k8s.io\/kubernetes /{print $3}' "$1/go.mod")"
  (cd "$1" && go build -trimpath -ldflags "-s -w $(kube_version_flags "$v")" -o "$2/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
  (cd etcd && go build -trimpath -ldflags "-s -w" -o "$2/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  local src
  src="$(module_dir kwok sigs.k8s.io/kwok)"
  (cd kwok && go build -trimpath -ldflags "-s -w" -o "$2/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # Standalone kwok has no stages of its own: the module's "fast" ones (nodes become Ready and keep
  # their lease, pods Ready, Job pods Succeeded, deleted pods go, claims get a volume) and the CRDs
  # of its port-forward objects, beside the binary.
  mkdir -p "$2/stages" "$2/manifests"
  cp "$src"/kustomize/stage/node/fast/node-initialize.yaml \
    "$src"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    "$src"/kustomize/stage/pod/fast/pod-{ready,complete,delete}.yaml \
    "$src"/kustomize/stage/volume/fast/{pv-bind,pv-delete,pvc-provision,pvc-delete}.yaml "$2/stages/"
  cp "$src"/kustomize/stage/volume/fast/storage-class.yaml "$src"/kustomize/crd/bases/*.yaml "$2/manifests/"
}

build_registry() {
  local v
  v="$(cd registry && go list -m -f '{{.Version}}' github.com/distribution/distribution/v3)"
  (cd registry && go build -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$v" \
    -o "$2/registry" github.com/distribution/distribution/v3/cmd/registry)
}

build_pulumi() {
  local v sdk
  v="$(cd pulumi && go list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)"
  sdk="$(module_dir pulumi github.com/pulumi/pulumi/sdk/v3)"
  (cd pulumi && go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v" \
    -o "$2/" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi ./cmd/pulumi-language-python ./cmd/pulumi-resource-random)
  # The SDK's program launcher (next to the language host) and dynamic-provider launcher (on PATH);
  # module zips drop the executable bit.
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$2/pulumi-language-python-exec"
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$2/pulumi-resource-pulumi-python"
}

build_pulumi_kubernetes() {
  # The provider embeds schema-embed.json and terraform-mapping-embed.json, which its repository
  # generates (cmd/pulumi-resource-kubernetes/generate.go) and does not commit: build from a
  # writable copy of the module with the two files generated, in a copy of this wrapper module.
  local work src v
  work="$(mktemp -d)"
  src="$(module_dir pulumi-kubernetes github.com/pulumi/pulumi-kubernetes/provider/v4)"
  v=4.25.0   # the tag of the pseudo-version in go.mod (v4.0.0-20260115033456-f47bc2d6f199)
  cp -r "$src" "$work/provider" && chmod -R u+w "$work/provider"
  cp pulumi-kubernetes/go.mod pulumi-kubernetes/go.sum "$work/"
  (cd "$work" && go mod edit -replace "github.com/pulumi/pulumi-kubernetes/provider/v4=./provider" \
    && cd provider/cmd/pulumi-resource-kubernetes && VERSION="$v" go run -modfile "$work/go.mod" generate.go)
  (cd "$work" && go build -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
    -o "$2/pulumi-resource-kubernetes" github.com/pulumi/pulumi-kubernetes/provider/v4/cmd/pulumi-resource-kubernetes)
  rm -rf "$work"
}

tools=("$@")
[ "${#tools[@]}" -gt 0 ] || tools=(etcd kubernetes-1.37 kubernetes-1.33 kwok registry pulumi pulumi-kubernetes)
for tool in "${tools[@]}"; do
  out="$cache/$tool-$(key "$tool")/bin"
  if [ -f "$out/.complete" ]; then
    echo "e2e tools: $tool cached ($out)" >&2
    continue
  fi
  rm -rf "$out" && mkdir -p "$out"
  start=$SECONDS
  "$(builder "$tool")" "$tool" "$out"
  touch "$out/.complete"
  echo "e2e tools: built $tool in $((SECONDS - start)) s ($out)" >&2
  # Earlier builds of this tool (other keys) are not used again.
  for old in "$cache/$tool"-*; do
    if [[ "$(basename "$old")" =~ ^${tool}-[0-9a-f]{12}$ ]] && [ "$old" != "${out%/bin}" ]; then rm -rf "$old"; fi
  done
done
for tool in "${tools[@]}"; do echo "$tool=$cache/$tool-$(key "$tool")/bin"; done
