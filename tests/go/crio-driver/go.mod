module cni-tests/crio-driver

go 1.21

require (
	github.com/containernetworking/cni v1.3.1
	go.opentelemetry.io/otel v1.29.0
	go.opentelemetry.io/otel/trace v1.29.0
)
