// Package features says what this kernel has: which qdiscs,
// classifiers and actions it offers, what sluice's BPF programs can use
// (helpers, program types, BTF), its modules and the sysctls that
// matter (the default qdisc, congestion controls). Probe learns the
// kinds by creating them in a scratch network namespace of its own, as
// root, through kernel.ProbeScratch (the writes stay in the executor's
// package); ProbeCached keeps the answer per boot under the state
// directory; Inventory reads what it can without root (the module
// lists), for `sluice doctor` and `plan` run by a user. The planner
// takes a Report's Features (leaf auto, the classifier, EDT).
package features
