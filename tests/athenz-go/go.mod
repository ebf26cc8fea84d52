module github.com/athenz-k8s-identity/tests/athenz-go

go 1.26.2

require (
	github.com/AthenZ/athenz v1.12.44
	github.com/ardielle/ardielle-go v1.5.2
)
