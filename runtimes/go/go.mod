module sless.dev/runtime/go

go 1.19
