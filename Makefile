# sluice: see README.md. Targets that touch the kernel need root.
GO  ?= go
BIN := bin/sluice

.PHONY: build dist deps demo test test-host test-kubernetes unit unit-cross check fuzz fuzz-policies soak lint vmtest vmtest-all vmtest-arm64 bpf bpf-check bench bench-utilization bench-classify bench-apply bench-agent bench-edt bench-edt-lane bench-probe bench-rtt bench-rtt-lane clean install deb packages image

# The version and commit `sluice version`, sluice_build_info and the
# packages say: v0.1.0 on a release tag, v0.1.1-dev.N+gCOMMIT after it
# (scripts/version.sh). The binary is static (no cgo: it runs on any
# Linux of its architecture, glibc or musl), trimmed and stripped, as
# make dist builds it for each architecture.
VERSION ?= $(shell ./scripts/version.sh 2>/dev/null || echo v0.0.0-dev)
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X sluice/version.stamped=$(VERSION) -X sluice/version.commit=$(COMMIT)" -o $(BIN) ./cmd/sluice

# Static binaries for linux/amd64, arm64, armv7 and mipsle (softfloat),
# stamped, each held to a size budget (scripts/dist.sh):
# out/dist/sluice-VERSION-linux-ARCH and out/dist/sizes.json.
dist:
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) ./scripts/dist.sh

# Installs the binary, man pages (sluice(1) and a page per command,
# sluice-policy(5), sluice-agent(8)) and completions (cmd/gendocs), the
# documentation and examples, the systemd units (the agent, and a
# oneshot apply for boxes without it; neither is enabled) and, unless
# one is there, /etc/sluice/policy.yaml. DESTDIR stages it (make deb).
PREFIX  ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONF ?= /etc
export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
install: build
	rm -rf out/share && $(GO) run ./cmd/gendocs out/share
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/sluice
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man8 $(DESTDIR)$(PREFIX)/share/doc/sluice/examples
	install -m 0644 out/share/man/man1/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 out/share/man/man5/*.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 0644 out/share/man/man8/*.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/sluice/
	install -D -m 0644 out/share/bash-completion/completions/sluice $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sluice
	install -D -m 0644 out/share/zsh/site-functions/_sluice $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sluice
	install -D -m 0644 out/share/fish/vendor_completions.d/sluice.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sluice.fish
	install -m 0644 examples/*.yaml examples/*.csv $(DESTDIR)$(PREFIX)/share/doc/sluice/examples/
	install -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/sluice/
	install -D -m 0644 deploy/grafana/sluice-dashboard.json $(DESTDIR)$(PREFIX)/share/sluice/grafana/sluice-dashboard.json
	install -D -m 0644 deploy/prometheus/sluice-alerts.yaml $(DESTDIR)$(PREFIX)/share/sluice/prometheus/sluice-alerts.yaml
	for u in sluice-agent.service sluice-apply.service; do \
	  sed 's|/usr/local/bin/sluice|$(PREFIX)/bin/sluice|g' deploy/$$u > out/share/$$u && \
	  install -D -m 0644 out/share/$$u $(DESTDIR)$(UNITDIR)/$$u; done
	[ -e $(DESTDIR)$(SYSCONF)/sluice/policy.yaml ] || install -D -m 0644 deploy/policy.yaml $(DESTDIR)$(SYSCONF)/sluice/policy.yaml

# The packages, from one description (deploy/nfpm.yaml, nfpm): deb, rpm
# and apk for amd64, arm64 and armv7, ipk (OpenWrt) for arm64, armv7 and
# mipsle, in out/pkg (scripts/packages.sh). make deb: this machine's deb
# alone. The policy is a conffile; nothing is enabled or started.
packages:
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) ./scripts/packages.sh
deb:
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) ./scripts/packages.sh deb:$$(dpkg --print-architecture | sed 's/^armhf$$/armv7/')

# The agent's container image without Docker: an OCI layout in out/image
# (cmd/mkimage: the static binary and a CA bundle, one image per
# architecture in an index; the same commit gives the same digest), and
# out/image/sluice.yaml, deploy/kubernetes/sluice.yaml with its image
# set to REGISTRY/sluice@DIGEST. Push with, for example:
#   skopeo copy --all oci:out/image:TAG docker://REGISTRY/sluice:TAG
REGISTRY     ?= registry.example
IMAGE_ARCHES ?= amd64 arm64
image:
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) ./scripts/dist.sh $(subst armv7,arm:7,$(IMAGE_ARCHES)) >/dev/null
	$(GO) run ./cmd/mkimage -o out/image -version $(VERSION) $(foreach a,$(subst armv7,arm,$(IMAGE_ARCHES)),-bin $(a)=$$(ls out/dist/sluice-*-linux-$(a)*))
	sed 's|^\(\s*image: \)registry.example/sluice:dev$$|\1$(REGISTRY)/sluice@'"$$(cat out/image/digest)"'|' deploy/kubernetes/sluice.yaml > out/image/sluice.yaml
	@echo "image: $(REGISTRY)/sluice@$$(cat out/image/digest) (out/image, out/image/sluice.yaml)"

# The main job: a lab demo in network namespaces (about 30 seconds).
demo: deps build
	$(BIN) demo

deps:
	./scripts/install-deps.sh

# Everything: on this kernel the unit, kernel and end-to-end tests (root,
# network namespaces, real traffic), the unit tests under the race
# detector, the fuzz targets, the agent against a Kubernetes API server,
# then the stock-kernel lane (Debian's 6.1 in qemu). Packages run one at
# a time so that traffic measurements do not compete for the CPUs; only
# the tests that leave the machine idle (slow links, 1 to 25% of the two
# CPUs each; those that only apply, kill and read back: e2e's light())
# run three at once, at the end. The work with no clock to keep (the API
# server's build, about 10 CPU-minutes once per version; the race
# builds; fuzzing) runs beside the host suite at the lowest priority
# (scripts/beside.sh): its traffic mostly waits on the clock, and nice 19
# (the chain's own and its session's autogroup's) takes only what the
# tests leave; the tests held to the tightest references stop it while
# they measure (testutil.Quiet). The race tests then run in the
# foreground, their builds done.
TEST_FUZZTIME ?= 10s
test: deps
	FUZZTIME=$(TEST_FUZZTIME) GO=$(GO) KERNEL=$(KERNEL) ./scripts/beside.sh start
	SLUICE_BESIDE=$(CURDIR)/out/beside/pid $(MAKE) test-host || { ./scripts/beside.sh stop; exit 1; }
	./scripts/beside.sh wait
	$(MAKE) unit unit-cross test-kubernetes vmtest VM_PREBUILT=1

test-host: deps lint
	GO=$(GO) ./scripts/gotest.sh -count=1 -p 1 -parallel 3 -timeout 25m ./...

# The agent against a real Kubernetes API server: kube-apiserver and
# etcd built once per version by scripts/kubeapi.sh (about 5 minutes on
# 2 cores, cached outside the repository), then TestKubernetesAgainstAPIServer
# (about 45 s: caps with traffic, live edits, an API server restart,
# 1,000 pods churning). The host suite skips it without the binaries.
test-kubernetes: deps
	SLUICE_KUBEAPI_BIN=$$(./scripts/kubeapi.sh) SLUICE_REQUIRE_KUBEAPI=1 $(GO) test -count=1 -run '^(TestKubernetesAgainstAPIServer|TestHelmChartAcceptedByAPIServer|TestImageRunsWithAReadOnlyRoot)$$' -timeout 15m -v ./e2e

# The fast tier, for every change: lint, then the unit, kernel and
# end-to-end tests as root (packages one at a time, e2e's light tests
# three at once) but for those marked testutil.Slow (lab scenarios,
# measurements held to a reference, VMs, browsers, builds: make test
# runs them). The README says how long it takes.
check: lint
	SLUICE_TIER=check GO=$(GO) ./scripts/gotest.sh -count=1 -p 1 -parallel 3 -timeout 10m ./...

# Unit tests only (no root needed), under the race detector.
unit:
	$(GO) test -race -count=1 -short ./...

# The unit suites of the packages that need no kernel, built for arm64
# and armv7 and run under qemu-user (the boxes that shape: routers, Pis):
# byte order, word size and alignment. tc's tests need netlink, which
# qemu-user does not translate; the lane boots real kernels for them.
CROSS_PKGS ?= ./policy/... ./plan ./share ./units ./migrate/... ./safefile ./autorate ./version ./records ./stats ./kube ./conform ./cmd/gendocs
unit-cross:
	CGO_ENABLED=0 GOARCH=arm64 SLUICE_TIER=check $(GO) test -count=1 -exec qemu-aarch64 $(CROSS_PKGS)
	CGO_ENABLED=0 GOARCH=arm GOARM=7 SLUICE_TIER=check $(GO) test -count=1 -exec qemu-arm $(CROSS_PKGS)

# The agent under traffic for SOAK (10 minutes; HOURS=24 for a day) with
# the policy rewritten every second and drift injected every few: prints
# goroutines, file descriptors, memory, kernel objects and BPF maps at
# start and end, and fails if any grew or a reconcile was dropped; then
# as long at 10,000 hosts under the HTTP load of TestAgentUnderLoad, its
# RSS at the end within 20% of its first minute's; then as long against
# a real API server under annotation churn (TestAgentKubeSoak: cap edits,
# 64 KiB bad values, pods coming and going). Root; not in `make test`.
SOAK ?= $(if $(HOURS),$(HOURS)h,10m)
soak: build
	SLUICE_SOAK=$(SOAK) SLUICE_LOAD_SOAK=$(SOAK) $(GO) test -count=1 -run '^(TestAgentSoak|TestAgentUnderLoad)$$' -timeout 0 -v ./e2e
	SLUICE_KUBE_SOAK=$(SOAK) SLUICE_KUBEAPI_BIN=$$(./scripts/kubeapi.sh) SLUICE_REQUIRE_KUBEAPI=1 $(GO) test -count=1 -run '^TestAgentKubeSoak$$' -timeout 0 -v ./e2e

# Each fuzz target for FUZZTIME (the committed corpus in testdata/fuzz
# also runs as plain tests in `make test`). A failing input is written
# to testdata/fuzz/NAME: commit it with the fix. scripts/fuzz.sh retries
# once, by execution count, Go 1.26's bare "context deadline exceeded" at
# the end of -fuzztime (go.dev/issue/75804), never a found input.
FUZZTIME ?= 30s
FUZZ := policy:FuzzParse policy:FuzzHostsCSV policy:FuzzUnits plan:FuzzU32Compile migrate:FuzzHTBInitFile migrate:FuzzWondershaperFile migrate:FuzzTCKeys migrate:FuzzLibreQoS migrate:FuzzSQMConfig migrate:FuzzFireQOS
fuzz:
	bash scripts/fuzz.sh --self-test
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh $(FUZZ)

# Generated policies (policy/gen: every match key, leaf, per_host form,
# nesting, direction and classifier): N*100 through validate and plan,
# then N applied on this kernel, re-planned (no changes), exported and
# rebuilt by tc in a second namespace (the same dump), and the first's
# conformance "alone" cells; a failure prints its policy shrunk. Root.
# `make test` runs seed 1: 300 through validate and plan, 4 on the kernel.
SEED ?= 1
N ?= 50
fuzz-policies: build
	$(GO) test -count=1 -run '^TestGeneratedPoliciesValidateAndPlan$$' ./policy/gen -seed $(SEED) -policies $$(( $(N) * 100 ))
	SLUICE_GEN_SEED=$(SEED) SLUICE_GEN_N=$(N) $(GO) test -count=1 -run '^TestGeneratedPolicies$$' -timeout 60m -v ./e2e

# The stock-kernel lane: the privileged tests inside qemu on Debian's
# kernel (KERNEL=6.1, 6.12, a package version or a vmlinuz path; see
# docs/kernels.md). vmtest-all runs both Debian kernels.
KERNEL ?= 6.1
vmtest:
	VM_PREBUILT=$(VM_PREBUILT) ./vmlane/vmtest.sh $(KERNEL)

vmtest-all:
	./vmlane/vmtest.sh 6.1
	./vmlane/vmtest.sh 6.12

# The arm64 smoke lane: Debian's arm64 kernel under qemu with busybox and
# the static arm64 binary (apply, show, plan, export, reset, the agent).
# make test runs it beside the host suite (scripts/beside.sh).
vmtest-arm64:
	GO=$(GO) ./vmlane/arm64.sh $(KERNEL)

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Rebuild the BPF objects (needs clang, llvm, libbpf-dev).
bpf:
	$(GO) generate ./bpf

# Fail if the committed BPF objects are not what the C sources give.
bpf-check: bpf
	@git diff --exit-code --stat -- bpf/ || { echo "bpf/: committed objects are stale; run make bpf and commit"; exit 1; }

bench: bench-utilization bench-classify bench-apply bench-agent bench-edt bench-probe bench-rtt

bench-utilization:
	$(GO) run ./bench/utilization

bench-classify:
	$(GO) run ./bench/classify

bench-apply:
	$(GO) run ./bench/apply

# The agent on a large tree; then with --kubernetes on a node of 1,000
# pods against a real API server (scripts/kubeapi.sh builds it once).
bench-agent:
	$(GO) run ./bench/agent
	SLUICE_KUBEAPI_BIN=$$(./scripts/kubeapi.sh) $(GO) run ./bench/kube

bench-probe:
	$(GO) run ./bench/probe

# The passive round trips' accuracy at 1, 10 and 100 Mbit/s (about a
# minute), on this kernel and (bench-rtt-lane) on Debian's 6.1 in the
# emulated lane (about 5 minutes).
bench-rtt:
	$(GO) run ./bench/rtt

bench-rtt-lane:
	$(GO) build -o out/lane-bench/sluice ./cmd/sluice
	$(GO) build -o out/lane-bench/bench-rtt ./bench/rtt
	cd out/lane-bench && SLUICE_VM_BIN=$$PWD/sluice VM_CWD=$$PWD VM_RWDIR=$$PWD \
	  VM_RUN_ONLY="./bench-rtt -sluice ./sluice -out rtt-lane.json" ../../vmlane/vmtest.sh 6.1
	cp out/lane-bench/rtt-lane.json bench/results/

# The EDT backend beside HTB's classifier: per-packet cost, and what an
# apply does beyond its qdiscs (this host has no fq; the lane runs the
# backend end to end).
bench-edt:
	$(GO) run ./bench/classify -veth-hosts "" -out bench/results/classify-edt.json
	$(GO) run ./bench/apply -backend edt-maps -hosts 10,1000,10000,100000 -out bench/results/apply-edt-maps.json

# The EDT backend in full (fq, which this host lacks) beside HTB in the
# stock-kernel lane, in one run: CPU per Gbit/s, the packet rate through
# a veth, and apply from scratch and one host changed with the qdiscs
# (HTB up to 10,000 hosts: 100,000 HTB classes take many minutes under
# emulation). Emulated (TCG): compare within the run. About 15 minutes.
bench-edt-lane:
	$(GO) build -o out/lane-bench/sluice ./cmd/sluice
	$(GO) build -o out/lane-bench/bench-edtcpu ./bench/edtcpu
	$(GO) build -o out/lane-bench/bench-apply ./bench/apply
	$(GO) build -o out/lane-bench/bench-classify ./bench/classify
	cd out/lane-bench && SLUICE_VM_BIN=$$PWD/sluice VM_CWD=$$PWD VM_RWDIR=$$PWD \
	  VM_RUN_ONLY="set -e; ./bench-edtcpu -sluice ./sluice -out edt-cpu.json; \
	    ./bench-classify -sluice ./sluice -repeat 0 -veth-setups none,htb,bpf,edt -veth-hosts 10,1000,10000,100000 -veth-htb-max 10000 -veth-packets 100000 -out classify-veth-lane.json; \
	    ./bench-apply -sluice ./sluice -backend htb,edt -queues 4 -hosts 10,1000,10000,100000 -htb-max 10000 -tc-limit 90s -out apply-lane.json" \
	  ../../vmlane/vmtest.sh 6.12
	cp out/lane-bench/edt-cpu.json out/lane-bench/classify-veth-lane.json out/lane-bench/apply-lane.json bench/results/

clean:
	rm -rf bin
