// Package records owns sluice's files under /run/sluice (Dir): the
// records of what sluice created in a network namespace (File, one Tree
// per device), the journal that makes an apply killed at any instant
// recoverable (Update), the locks that keep two writers apart, the
// limits record of the agent's runtime layer (Limits) and the agent's
// own small files.
//
// It owns the formats and their versions: its types (Alloc, Class,
// Limit) are its own, so the planner's may change without changing what
// is on disk, and an older file is read or refused by version, never
// guessed at. Every file is reached through safefile: no link is
// followed, nothing planted is trusted. Readers take no lock: a save
// replaces the records by renames, and a read that a save overtook
// reads them again (Load).
//
// It must not talk to the kernel or decide anything: kernel fills and
// checks the records against what it reads back; engine keeps the
// limits record.
package records
