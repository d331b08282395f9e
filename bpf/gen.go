// Package bpf holds sluice's eBPF programs (C, compiled ahead of time with
// clang through bpf2go; the objects are committed so that `go build`
// needs no clang) and the Go types and loaders that go with them.
package bpf

//go:generate sh -c "go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel,bpfeb -cflags \"-O2 -mcpu=v3 -Wall -Werror -I/usr/include/$(uname -m)-linux-gnu\" -type config -type rule -type block -type target -type lpm_key -type counter -type policer -type pace -type delay_hist -type flow_key -type flow_state -type rtt_hist -type host_rtt -type rtt_stats Classifier classifier.c"
