// out/ holds what builds and tests write: the lane's guests and logs,
// reports, the staging of make install and make deb. It is a module of
// its own so that the go tool's ./... never walks it: a test removing
// out/share (make install) while a concurrent `go test -race ./...`
// listed its packages failed that run ("pattern ./...: open out/share:
// no such file or directory").
module sluice/out

go 1.26.8
